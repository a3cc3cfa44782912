// Compiles only if a program that defines HERD_MPI_CXX_BINDINGS still gets MPI's C++ bindings
// from <mpi.h> through herd (comm/detail/mpi_header.hpp); built, not run.

#define HERD_MPI_CXX_BINDINGS
#include <herd/comm/mpi.hpp>

int rank_through_the_bindings() {
#if defined(MPICH)
  return MPI::COMM_WORLD.Get_rank();  // MPICH declares the bindings unless told not to
#else
  return 0;  // Open MPI builds them only when configured to
#endif
}
