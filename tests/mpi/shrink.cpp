// A rank that leaves the training on real MPI ranks: the others shrink to a communicator of their
// own (MPI_Comm_create_group), re-shard the sampler and go on from the last commit they all hold.
//
//   mpiexec -n P shrink MODE [SEED]
//   MODE  returns  the leaving rank returns from its training function and from main
//         leaves   it calls comm.leave(), then returns from main
//         raises   an exception it does not catch in training; its main catches it and returns
//         fails    the same, but its main then returns 3, a failure (MPICH's mpiexec ends the job
//                  then, unless it runs with -disable-auto-cleanup)
//         kill     it is killed by SIGKILL (not a departure: what MPI does then is the MPI's own)
//         reproducible  as returns, with reproducible sums (comm_options::reproducible), the
//                  reference's communicators set to the ring and the run's to the automatic choice
//                  (shared memory): the same bits all the same (without the mode, 730 of the 4099
//                  parameters differ at 3 ranks)
// SEED picks the rank and the step. Every rank first computes what the ranks that stay must end
// with: P ranks without faults to the commit before that step, then P - 1 ranks (a subset) from
// there with the sampler re-sharded. Each staying rank prints "rank R (now S of P-1): the same
// bits as the run that switched at step C" and exits 0, or says what differs and exits 1.

#include <herd/herd.hpp>

#include "../support/elastic_training.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {
constexpr std::size_t parameters = 4099;
constexpr std::int64_t steps = 24;
}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a line at a time, as a rank killed later does not flush
  const std::string mode = argc > 1 ? argv[1] : "returns";
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::stoul(argv[2])) : 1u;
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 15;  // a hang fails the test rather than blocking it
  o.reproducible = mode == "reproducible";
  herd::comm_options reference_options = o;
  if (o.reproducible) reference_options.allreduce_algorithm = herd::algorithm::ring;
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  std::mt19937 rng(seed);
  herd_test::departure gone;
  gone.rank = std::uniform_int_distribution<int>(0, p - 1)(rng);
  gone.step = std::uniform_int_distribution<std::int64_t>(1, steps - 2)(rng);
  gone.how = mode == "leaves" ? herd_test::departure::leaves
             : mode == "raises" || mode == "fails" ? herd_test::departure::raises
                                : herd_test::departure::returns;
  const std::int64_t at = gone.step / 4 * 4;  // the commit the others go back to

  // The reference: P ranks to step `at`, then the first P - 1 from there.
  std::vector<float> expected(parameters);
  {
    herd::mpi_communicator world(MPI_COMM_WORLD, reference_options);
    const int rank = world.rank();
    herd_test::sharded_run run = herd_test::start_sharded(parameters, p, rank);
    herd_test::train_sharded(world, run, at);
    std::vector<int> first(static_cast<std::size_t>(p - 1));
    std::iota(first.begin(), first.end(), 0);
    herd::mpi_communicator smaller = world.subset(first);
    if (smaller.is_member()) {
      run.sampler.reshard(p - 1, smaller.rank());
      herd_test::train_sharded(smaller, run, steps);
      expected = run.w;
    }
    herd::broadcast(expected, world, 0);
  }

  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  const int first_rank = comm.rank();
  herd_test::sharded_run run = herd_test::start_sharded(parameters, p, first_rank);
  try {
    herd_test::train_sharded(comm, run, steps, mode == "kill" ? herd_test::departure{} : gone, [&](int) {
      if (mode == "kill" && first_rank == gone.rank && run.step == gone.step) std::raise(SIGKILL);
    });
  } catch (const herd_test::rank_left& e) {
    std::printf("rank %d: %s before step %lld (uncaught in training)\n", first_rank, e.what(),
                static_cast<long long>(gone.step));
    return mode == "fails" ? 3 : 0;
  } catch (const herd::error& e) {
    std::printf("rank %d: %s\n", first_rank, e.what());
    return 1;
  }
  if (mode == "kill") std::printf("rank %d: training went on without the killed rank\n", first_rank);
  if (first_rank == gone.rank) {
    std::printf("rank %d: left before step %lld (%s)\n", first_rank, static_cast<long long>(gone.step), mode.c_str());
    return 0;
  }
  if (comm.size() != p - 1 || run.w != expected) {
    std::size_t differ = 0;
    for (std::size_t i = 0; i < parameters; ++i) differ += run.w[i] != expected[i];
    std::printf("rank %d (now %d of %d): %zu of %zu parameters differ from the run that switched at step %lld\n",
                first_rank, comm.rank(), comm.size(), differ, parameters, static_cast<long long>(at));
    return 1;
  }
  std::printf("rank %d (now %d of %d): the same bits as the run that switched at step %lld\n", first_rank, comm.rank(),
              comm.size(), static_cast<long long>(at));
  return 0;
}
