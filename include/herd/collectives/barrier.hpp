#pragma once
// herd::barrier: returns on each rank once every rank has entered it.

#include <herd/comm/communicator.hpp>

namespace herd {

template <communicator C> void barrier(C& comm) { comm.barrier(); }

}  // namespace herd
