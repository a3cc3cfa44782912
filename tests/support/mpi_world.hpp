#pragma once
// The MPI tests' communicator of every rank, with this rank's number and the world's size, and
// MPI's datatype for a herd dtype (for comparing with MPI's own collectives).

#include <herd/comm/mpi.hpp>

namespace herd_test {

// This rank's number and the job's size in MPI_COMM_WORLD, without a herd communicator.
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

struct world {
  herd::mpi_communicator comm;
  int rank = comm.rank();
  int size = comm.size();
};

// MPI_DATATYPE_NULL for the 16-bit floats, which MPI has no type for.
inline MPI_Datatype mpi_type(herd::dtype t) {
  switch (t) {
    case herd::dtype::f32: return MPI_FLOAT;
    case herd::dtype::f64: return MPI_DOUBLE;
    case herd::dtype::i32: return MPI_INT32_T;
    case herd::dtype::i64: return MPI_INT64_T;
    case herd::dtype::i8: return MPI_INT8_T;
    case herd::dtype::u8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

}  // namespace herd_test
