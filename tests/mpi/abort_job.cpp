// An abort that cannot settle its sends ends the whole job, whatever the other ranks are doing.
//
//   mpiexec -n P abort_job MODE TOKEN
//   Every rank creates a communicator; ranks 0 and 1 then allreduce 16 MiB on a communicator of
//   their own, and rank 1 stops for 30 s before its first receive, so rank 0 gives up after the
//   shutdown time (0.5 s), cannot settle its sends (rank 1 does not take them) and, 0.5 s later,
//   ends the job. Meanwhile the ranks from 2 on (P > 2):
//   MODE  asleep    sleep 30 s outside herd
//         finalize  return from main (MPI_Finalize)
//         dead      rank P - 1 dies (_Exit(3), without MPI_Finalize) once the allreduce began; the
//                   others sleep
//         hierarchical  (P = 4) the fault matrix's abort cell: all ranks allreduce 16 MiB with the
//                   hierarchical algorithm on two simulated nodes of 2 ranks, and rank 2, the second
//                   node's leader, stops for 30 s before its first message across nodes (after the
//                   shared-memory phase), so rank 0's send across nodes is never taken.
//         killed    all ranks allreduce 16 MiB (herd's automatic algorithm: hierarchical across
//                   the nodes of tests/multinode) and rank P - 1 is killed by SIGKILL as the others
//                   begin: no abort of herd's, the launcher's reaction to a lost process.
// TOKEN marks the processes, for tests/support/job_ends.py, which checks from outside that every
// one is gone within the bound. Rank 0 prints "abort_job: allreduce begins" first; a rank that
// is still running after 30 s prints "abort_job: rank R still running" and exits 1.

#include <herd/herd.hpp>

#include "../support/faulty_communicator.hpp"

#include <herd/comm/detail/fault_hooks.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "asleep";
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 0.5;
  o.ring_segment_bytes = 256 << 10;
  // Messages, which a stalled peer leaves unsettled (a killed rank's peers: what herd picks).
  if (mode != "killed") o.allreduce_algorithm = herd::algorithm::ring;
  if (mode == "hierarchical") {
    o.allreduce_algorithm = herd::algorithm::hierarchical;
    o.simulated_node_size = 2;
  }
  {
    // Every pair of ranks connected before the half-second clocks start: Open MPI opens its TCP
    // connections on first use, and across tests/multinode's nodes one took up to a second to come up.
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<int> out(static_cast<std::size_t>(size)), in(out.size());
    MPI_Alltoall(out.data(), 1, MPI_INT, in.data(), 1, MPI_INT, MPI_COMM_WORLD);
  }
  herd::mpi_communicator world(MPI_COMM_WORLD, o);
  const int rank = world.rank();
  const int p = world.size();
  auto still_running = [&] {
    std::printf("abort_job: rank %d still running after 30 s\n", rank);
    return 1;
  };
  // Every rank allreduces 16 MiB over the world, stays 30 s, and must be ended by then.
  auto allreduce_then_linger = [&](auto before) {
    std::vector<float> big(std::size_t{4} << 20, 1.0f);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) std::printf("abort_job: allreduce begins\n");
    before();
    try {
      herd::allreduce(big, world);
    } catch (const herd::error& e) {
      std::printf("abort_job: rank %d raised: %s\n", rank, e.what());
    }
    std::this_thread::sleep_for(std::chrono::seconds(30));  // the job must end around this rank
    return still_running();
  };
  if (mode == "killed") {
    return allreduce_then_linger([&] {
      // Killed once the others are inside the allreduce, waiting for it; not at once after the
      // barrier, where its death could end the job before the launcher had passed on rank 0's
      // "allreduce begins" from the other node (seen once under load: the line never arrived).
      if (rank == p - 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::raise(SIGKILL);
      }
    });
  }
  if (mode == "hierarchical") {
    if (rank == 2) {
      herd::detail::post_hook() = [](int tag, bool) {
        static bool stopped = false;
        if (tag >= herd::detail::data_tag_base && !std::exchange(stopped, true)) {
          std::this_thread::sleep_for(std::chrono::seconds(30));
        }
      };
    }
    return allreduce_then_linger([] {});
  }
  herd::mpi_communicator pair = world.subset({0, 1});
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank >= 2) {
    if (mode == "finalize") return 0;  // MPI_Finalize, while rank 0 ends the job
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (mode == "dead" && rank == p - 1) std::_Exit(3);
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return still_running();
  }
  if (rank == 0) std::printf("abort_job: allreduce begins\n");
  auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::before_receive(
      pair, rank == 1 ? 0 : -1, [] { std::this_thread::sleep_for(std::chrono::seconds(30)); });
  std::vector<float> big(std::size_t{4} << 20, 1.0f);
  try {
    herd::allreduce(big, faulty);
  } catch (const herd::error& e) {
    std::printf("abort_job: rank %d raised: %s\n", rank, e.what());
  }
  return still_running();
}
