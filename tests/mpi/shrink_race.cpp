// shrink() when the ranks' views of who stays could differ: every rank must end with the same
// communicator or raise within the bound, never block in MPI's own creation of the communicator.
//
//   mpiexec -n 3 shrink_race MODE
//   MODE  closed   rank 1 shrinks first, says it stays, gives up after its shutdown time (1 s: rank 2
//                  is still busy) and leaves; rank 0 shrinks 0.3 s after it, rank 2 2 s after it, both
//                  patient (5 s). A rank that said it stays and then left is not counted: ranks 0
//                  and 2 go on as 2.
//         stalled  rank 2 leaves; ranks 0 and 1 shrink, and rank 1 stops for 4 shutdown times after
//                  saying it stays. Rank 0 must give up within the shutdown time + 1 s rather than
//                  wait in MPI_Comm_create_group for it; rank 1 gives up when it resumes.
// Each rank prints "rank R: ..." and exits 0 when it did what it must, 1 otherwise; a rank still
// running after 20 s is ended by SIGALRM.

#include <herd/herd.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

constexpr double shutdown = 1.0;

void stall_rank_1(int rank) {
  if (rank == 1) std::this_thread::sleep_for(std::chrono::duration<double>(4 * shutdown));
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::alarm(20);
  const std::string mode = argc > 1 ? argv[1] : "closed";
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = shutdown;
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  bool right = false;
  std::string what;
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    const int rank = comm.rank();
    if (mode == "stalled") herd::detail::shrink_hook() = stall_rank_1;
    const auto start = clock_type::now();
    try {
      if (mode == "stalled" && rank == 2) {
        comm.leave();
        std::printf("rank %d (%s): left\n", world_rank, mode.c_str());
        return 0;
      }
      herd::comm_options patient = o;
      if (mode == "closed") {
        std::this_thread::sleep_for(std::chrono::duration<double>(rank == 0 ? 0.3 : rank == 2 ? 2.0 : 0));
        if (rank != 1) patient.stall_shutdown_seconds = 5;
      }
      herd::mpi_communicator smaller = comm.shrink(patient);
      std::vector<float> v(1000, 1.0f);
      herd::allreduce(v, smaller);
      what = "went on as rank " + std::to_string(smaller.rank()) + " of " + std::to_string(smaller.size()) +
             " (sum " + std::to_string(v[0]) + ")";
      right = mode == "closed" && rank != 1 && smaller.size() == 2 && v[0] == 2.0f;
    } catch (const herd::error& e) {
      const double took = seconds_since(start);
      what = "raised after " + std::to_string(took) + " s: " + e.what();
      // closed: rank 1 alone gives up. stalled: rank 0 within the bound, rank 1 once it resumes.
      right = rank == 1 || (mode == "stalled" && took < shutdown + 1.0);
    }
    herd::detail::shrink_hook() = nullptr;
  }
  std::printf("rank %d (%s): %s%s\n", world_rank, mode.c_str(), right ? "" : "WRONG: ", what.c_str());
  return right ? 0 : 1;
}
