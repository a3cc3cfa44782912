// A rank that leaves (returns from main) while the others wait for it in a collective: they raise
// herd::error at once, naming it, instead of waiting for the watchdog.
//
//   mpiexec -n 2 leave_early scope        rank 1's communicator is destroyed as main returns
//   mpiexec -n 2 leave_early environment  rank 1's communicator outlives main; herd::mpi::environment's
//                                         destructor (MPI_Finalize) tells the peers that it leaves
// Rank 0 prints "rank 0: <the error>" and exits 0 when it got the error within 10 s, 1 otherwise.

#include <herd/herd.hpp>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {
std::optional<herd::mpi_communicator> outliving;  // destroyed after MPI_Finalize, which tells the peers first
}

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "scope";
  herd::mpi_communicator comm;
  std::vector<float> v(1000, 1.0f);
  herd::allreduce(v, comm);  // #1, with every rank
  if (comm.rank() == 1) {
    if (mode == "environment") outliving.emplace(std::move(comm));
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    herd::allreduce(v, comm);  // #2: rank 1 has gone
  } catch (const herd::error& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d: %s (after %.2f s)\n", comm.rank(), e.what(), waited);
    return waited < 10 ? 0 : 1;
  }
  std::printf("rank %d: no error although rank 1 left\n", comm.rank());
  return 1;
}
