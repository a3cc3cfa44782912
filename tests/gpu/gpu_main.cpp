// Main of the GPU suites: under mpiexec, like mpi_main.cpp, but every rank first checks for a
// CUDA device and, without one, the whole run exits 77, which ctest reports as skipped. Built
// with HERD_GPU_MAIN_ONE_GPU_PER_RANK (suites whose ranks talk over NCCL, which refuses two ranks
// on one GPU: "Duplicate GPU detected"), the run is skipped as well where a node has more ranks
// than GPUs. Every rank takes part in the decision, so all of them skip or none does.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cstdio>

int herd_mpi_doctest_main(int argc, char** argv);

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int ranks_on_node = 1;
  MPI_Comm_size(node, &ranks_on_node);
  MPI_Comm_free(&node);
#ifdef HERD_GPU_MAIN_ONE_GPU_PER_RANK
  const int needed = ranks_on_node;
#else
  const int needed = 1;
#endif
  const int short_here = devices < needed ? 1 : 0;
  int short_anywhere = 0;
  MPI_Allreduce(&short_here, &short_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (short_here != 0) {
    if (devices == 0) {
      std::printf("[herd] rank %d: no CUDA device here: the GPU suite is skipped\n", rank);
    } else {
      std::printf("[herd] rank %d: %d ranks on this node and %d GPU(s); NCCL needs a GPU per rank, so the suite is skipped\n",
                  rank, ranks_on_node, devices);
    }
  }
  if (short_anywhere != 0) {
    MPI_Finalize();
    return 77;
  }
  return herd_mpi_doctest_main(argc, argv);  // MPI is started: it goes on from here
}
