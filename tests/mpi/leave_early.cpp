// A rank that leaves (returns from main) while the others wait for it in a collective: they raise
// herd::error at once, naming it, instead of waiting for the watchdog.
//
//   mpiexec -n 2 leave_early scope        rank 1's communicator is destroyed as main returns
//   mpiexec -n 2 leave_early environment  rank 1's communicator outlives main; herd::mpi::environment's
//                                         destructor (MPI_Finalize) tells the peers that it leaves
//   mpiexec -n 2 leave_early stuck        rank 1 stalls for 4 s in the middle of a 16 MiB allreduce:
//                                         rank 0 gives up after 0.5 s and cannot settle its sends
//                                         (rank 1 does not take them), so 0.5 s later it ends the job
//                                         with MPI_Abort, naming rank 1 and the operation on stderr
//   mpiexec -n 2 leave_early finalize     rank 0 calls MPI_Finalize while its allreduce_async waits
//                                         for rank 1, 3 s late: the allreduce fails within the
//                                         shutdown time (1 s) and MPI_Finalize returns; the handle
//                                         rethrows that error, and the communicator refuses use
// Rank 0 prints "rank 0: <the error>" and exits 0 when it got the error within 10 s, 1 otherwise.

#include <herd/herd.hpp>

#include "../support/faulty_communicator.hpp"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {
std::optional<herd::mpi_communicator> outliving;  // destroyed after MPI_Finalize, which tells the peers first
}

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "scope";
  if (mode == "stuck") {
    herd::comm_options o;
    o.stall_check_seconds = 0;
    o.stall_shutdown_seconds = 0.5;
    o.ring_segment_bytes = 256 << 10;
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::before_receive(
        comm, comm.rank() == 1 ? 0 : -1, [] { std::this_thread::sleep_for(std::chrono::seconds(4)); });
    std::vector<float> big(std::size_t{4} << 20, 1.0f);
    try {
      herd::allreduce(big, faulty);
    } catch (const herd::error& e) {
      std::printf("rank %d: %s\n", comm.rank(), e.what());
    }
    return 1;  // MPI_Abort ends the job before: reaching here is a failure
  }
  if (mode == "finalize") {
    herd::comm_options o;
    o.stall_check_seconds = 0;
    o.stall_shutdown_seconds = 1;
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    std::vector<float> v(1000, 1.0f);
    std::optional<herd::handle> pending;
    if (comm.rank() == 0) {
      pending.emplace(herd::allreduce_async(v, comm));
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(3));
    }
    const auto start = std::chrono::steady_clock::now();
    MPI_Finalize();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (comm.rank() != 0) return 0;
    std::string failed = "(no error)";
    try {
      pending->wait();
    } catch (const herd::error& e) {
      failed = e.what();
    }
    std::string refused = "(no error)";
    try {
      herd::allreduce(v, comm);
    } catch (const herd::error& e) {
      refused = e.what();
    }
    std::printf("rank 0: MPI_Finalize returned after %.2f s; the allreduce: %s; one after MPI_Finalize: %s\n", took,
                failed.c_str(), refused.c_str());
    return took < 10 ? 0 : 1;
  }
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
