// The implementation file of the MPI test programs: they are compiled with
// HERD_SEPARATE_COMPILATION (tests/CMakeLists.txt, herd_test_engine), so herd's engine for
// mpi_communicator and its non-template code are compiled here once rather than in each of them.
#define HERD_IMPLEMENTATION
#include <herd/herd.hpp>

// Called by tests/support/mpi_main.cpp before its MPI_Finalize, as herd::mpi::finalize() would be:
// herd's threads leave MPI first.
extern "C" void herd_test_before_finalize() { herd::detail::stop_threads_before_finalize(); }
