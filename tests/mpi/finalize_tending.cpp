// MPI_Finalize while herd's tending thread is at work (comm/detail/mpi_failure.hpp, start_tender):
// MPI forbids other threads' calls while MPI_Finalize runs, so herd::mpi::finalize(), and with it
// herd::mpi::environment, must end that thread before MPI_Finalize begins.
//
//   mpiexec -n 2 finalize_tending MODE
// Rank 1 sleeps outside herd for 1.5 s; rank 0's allreduce gives up on it after 0.3 s, aborts, and
// is left with a peer that has not settled: its tending thread drains the communicator every
// millisecond from then on. Rank 0 destroys the communicator and finalizes while rank 1 sleeps.
//   MODE  environment  herd::mpi::environment initializes and finalizes MPI.
//         raw          the program calls MPI_Init_thread and MPI_Finalize itself, which herd cannot
//                      guard: the thread still runs as MPI_Finalize begins. For trying, not a test
//                      (MPI_Finalize failed in none of 60 runs here: the thread is seldom inside
//                      MPI at that moment).
// The program takes MPI_Finalize through MPI's profiling interface to see, as it begins, whether the
// tending thread still runs. Rank 0 prints "WRONG: ..." and exits 1 if it does in environment mode,
// or if there was no tending thread to end (then this run shows nothing).

#include <herd/herd.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {
bool tending_at_finalize = false;
}  // namespace

extern "C" int MPI_Finalize(void) {
  auto& r = herd::detail::registry();
  {
    std::lock_guard lock(r.mutex);
    tending_at_finalize = r.tender_running || r.tender.joinable();
  }
  return PMPI_Finalize();
}

namespace {

// Returns whether the tending thread ran after the abort (checked before finalizing).
bool abort_with_a_sleeping_peer(int& rank) {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 0.3;
  o.end_job_if_unsettled = false;
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  rank = comm.rank();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }
  std::vector<float> v(1 << 20, 1.0f);
  std::string what;
  try {
    herd::allreduce(v, comm);
  } catch (const herd::error& e) {
    what = e.what();
  }
  std::printf("rank %d: %s\n", rank, what.empty() ? "the allreduce returned" : what.substr(0, 120).c_str());
  if (rank != 0) return true;
  auto& r = herd::detail::registry();
  std::lock_guard lock(r.mutex);
  return r.tender_running;
}

}  // namespace

int main(int argc, char** argv) {
  const bool raw = argc > 1 && std::strcmp(argv[1], "raw") == 0;
  int rank = -1;
  bool tending = false;
  if (raw) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    tending = abort_with_a_sleeping_peer(rank);
    MPI_Finalize();
  } else {
    herd::mpi::environment env(argc, argv);
    tending = abort_with_a_sleeping_peer(rank);
  }
  if (rank != 0) return 0;
  if (!tending) {
    std::printf("WRONG: rank 0 had no tending thread after the abort; this run checks nothing\n");
    return 1;
  }
  std::printf("rank 0: the tending thread %s as MPI_Finalize began\n", tending_at_finalize ? "still ran" : "had ended");
  if (tending_at_finalize && !raw) {
    std::printf("WRONG: herd::mpi::environment finalized MPI while herd's tending thread could be inside MPI\n");
    return 1;
  }
  return 0;
}
