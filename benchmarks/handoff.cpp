// What handing an operation to the communicator's progress thread costs, with nothing to reduce:
// the part of an overlapped bucket (DDP wrapper, distributed optimizer) that is pure overhead.
//
//   mpiexec -n 2 build/benchmarks/handoff [--ops 2000] [--reps 9] [--gap-us 20]
//
// Every operation is an allreduce of an empty tensor (its agreement still runs: one small step
// through shared memory or one message exchange). Per operation, medians over the repetitions of
// the slowest rank's mean:
//   blocking   herd::allreduce, on the calling thread: no hand-over;
//   async      herd::allreduce_async then wait(), one at a time: the thread is woken for each
//              operation and wakes the caller when it is done;
//   gap        the same, with --gap-us of busy work on the caller between the start and the
//              wait (a layer's backward pass between a bucket's start and the next one);
//   queued     16 started, then all waited for: the thread takes each next one without sleeping.
// "handoff" = async - blocking and gap - blocking - the gap itself: what the thread costs per
// operation, there and back.

#include <herd/herd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The slowest rank's mean seconds per operation, median over `reps` repetitions of `ops` operations.
template <class Run> double per_op(Run run, int ops, int reps) {
  run(std::min(ops, 50));  // warm-up
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now();
    run(ops);
    double mine = (now() - start) / ops;
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    samples.push_back(slowest);
  }
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

void busy_for(double seconds) {
  const double until = now() + seconds;
  while (now() < until) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  int ops = 2000;
  int reps = 9;
  double gap_us = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--ops") ops = std::atoi(argv[i + 1]);
    else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
    else if (flag == "--gap-us") gap_us = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: mpiexec -n N handoff [--ops K] [--reps R] [--gap-us G]\n");
      return 2;
    }
  }
  herd::mpi_communicator comm;
  std::vector<float> empty;
  const double gap = gap_us * 1e-6;
  const double blocking = per_op([&](int k) { for (int i = 0; i < k; ++i) herd::allreduce(empty, comm); }, ops, reps);
  const double async = per_op(
      [&](int k) {
        for (int i = 0; i < k; ++i) herd::allreduce_async(empty, comm).wait();
      },
      ops, reps);
  const double with_gap = per_op(
      [&](int k) {
        for (int i = 0; i < k; ++i) {
          herd::handle h = herd::allreduce_async(empty, comm);
          busy_for(gap);
          h.wait();
        }
      },
      ops, reps);
  std::vector<std::vector<float>> sixteen(16);
  const double queued = per_op(
      [&](int k) {
        std::vector<herd::handle> in_flight;
        for (int i = 0; i < k; i += 16) {
          in_flight.clear();
          for (auto& t : sixteen) in_flight.push_back(herd::allreduce_async(t, comm));
          for (herd::handle& h : in_flight) h.wait();
        }
      },
      ops / 16 * 16, reps);
  if (comm.rank() == 0) {
    std::printf("# handing operations to the progress thread: %d ranks, empty allreduces, us per operation, medians of %d "
                "repetitions of %d\n",
                comm.size(), reps, ops);
    std::printf("# %10s %10s %10s %10s | %10s %12s\n", "blocking", "async", "gap", "queued", "handoff", "handoff(gap)");
    std::printf("  %10.2f %10.2f %10.2f %10.2f | %10.2f %12.2f\n", blocking * 1e6, async * 1e6, with_gap * 1e6,
                queued * 1e6, (async - blocking) * 1e6, (with_gap - blocking - gap) * 1e6);
  }
  return 0;
}
