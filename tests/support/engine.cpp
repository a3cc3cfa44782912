// The implementation file of the MPI test programs: they are compiled with
// HERD_SEPARATE_COMPILATION (tests/CMakeLists.txt, herd_test_engine), so herd's engine for
// mpi_communicator and its non-template code are compiled here once rather than in each of them.
#define HERD_IMPLEMENTATION
#include <herd/herd.hpp>
