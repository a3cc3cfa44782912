// Main of the GPU suite: under mpiexec, like mpi_main.cpp, but every rank first checks for a
// CUDA device and, without one, the whole run exits 77, which ctest reports as skipped.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdio>

int herd_mpi_doctest_main(int argc, char** argv);

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::printf("[herd] no CUDA device here: the GPU suite is skipped\n");
    MPI_Finalize();
    return 77;
  }
  return herd_mpi_doctest_main(argc, argv);
}
