#ifndef HERD_COLLECTIVES_BARRIER_HPP
#define HERD_COLLECTIVES_BARRIER_HPP
// herd::barrier: returns on each rank once every rank has entered it. An operation like any
// other: a rank in a barrier while another is in a different collective is an error on both,
// naming both operations.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/comm/handle.hpp>

namespace herd {

template <communicator C> void barrier(C& comm) {
  detail::run_operation(comm, {detail::op_kind::barrier}, [&] {
    if constexpr (requires { comm.synchronize(); }) comm.synchronize();  // a GPU communicator's queued work first
    detail::agree_identity(comm);
  });
}

}  // namespace herd

#endif  // HERD_COLLECTIVES_BARRIER_HPP
