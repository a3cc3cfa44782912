#pragma once
// The MPI tests' communicator of every rank, with this rank's number and the world's size.

#include <herd/comm/mpi.hpp>

namespace herd_test {

struct world {
  herd::mpi_communicator comm;
  int rank = comm.rank();
  int size = comm.size();
};

}  // namespace herd_test
