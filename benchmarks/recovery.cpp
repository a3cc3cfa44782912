// How long training takes to go on after a failure, under herd::run_elastic: from the moment a
// fault strikes one rank to the first step every rank completes on the renewed communicator.
//
//   mpiexec -n 3 build/benchmarks/recovery [--reps 5] [--shutdown 1.0]
//
// The loop: 64 Ki f32 parameters, a gradient averaged across ranks by herd's ring (256 KiB, data
// messages), a descent step, a commit every 4 steps; 16 steps. Faults, on the last rank, in the
// middle of step 9's allreduce (a commit at step 8 is the one to go back to):
//   exception  an exception thrown inside the operation (a failing reduction, say): the rank aborts
//              the communicator and its peers learn of it from the abort notice
//   stall      the rank stops for the shutdown time + 0.5 s, then goes on: its peers' watchdog gives
//              up after the shutdown time without progress (--shutdown, HERD_STALL_SHUTDOWN_TIME_SECONDS
//              in real runs, 30 minutes by default), and the stalled rank finds the abort when it wakes
//   leave      the rank leaves the communicator (comm.leave(), as a rank that returns) before step 9:
//              the others shrink to a communicator of their own, re-shard their sampler and go on
//              smaller (the loop of tests/mpi/shrink: each rank reads its batch from a sampler);
//              recovery ends at the first step the last of them completes
// Each run also checks that the final parameters equal a run without faults, bit for bit (for
// leave: a run that switches to the smaller world at the commit of step 8).
// Prints the median and the range of the recovery time, and what the fault-free step costs.

#include <herd/herd.hpp>

#include "../tests/support/elastic_training.hpp"
#include "../tests/support/faulty_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;  // CLOCK_MONOTONIC: one clock for every process of a machine

double seconds(clock_type::time_point t) { return std::chrono::duration<double>(t.time_since_epoch()).count(); }

struct outcome {
  std::vector<float> w;
  double fault_at = 0;       // when the fault struck (the faulty rank's clock; 0 elsewhere)
  double recovered_at = 0;   // when this rank completed its first step after the rollback
  double step_seconds = 0;   // a fault-free step, on average
  int attempts = 0;
};

// 16 steps of training under run_elastic (the elastic tests' loop); `fault` runs on the last rank
// after its wait number `at`.
outcome train(herd::comm_options options, int at, std::function<void()> fault) {
  herd::mpi_communicator comm(MPI_COMM_WORLD, options);
  outcome out;
  out.w.assign(std::size_t{1} << 16, 0.5f);
  std::int64_t step = 0;
  auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::after_wait(
      comm, comm.rank() == comm.size() - 1 ? at : -1, [&] {
        out.fault_at = seconds(clock_type::now());
        fault();
      });
  const auto started = clock_type::now();
  out.attempts = herd_test::train_elastic_steps(comm, faulty, out.w, step, 16, [&](int attempt) {
    if (attempt > 1 && out.recovered_at == 0) out.recovered_at = seconds(clock_type::now());
  });
  out.step_seconds = std::chrono::duration<double>(clock_type::now() - started).count() / 16;
  return out;
}

// The leave case: 16 steps of the sharded loop, the last rank leaving before step 9.
outcome train_leaving(herd::comm_options options) {
  herd::mpi_communicator comm(MPI_COMM_WORLD, options);
  const int first = comm.rank();
  const int leaver = comm.size() - 1;
  herd_test::sharded_run run = herd_test::start_sharded(std::size_t{1} << 16, comm.size(), first);
  herd_test::departure gone{leaver, 9, herd_test::departure::leaves};
  outcome out;
  out.attempts = herd_test::train_sharded(comm, run, 16, gone, [&](int attempt) {
    if (first == leaver && run.step == 9) out.fault_at = seconds(clock_type::now());
    if (attempt > 1 && out.recovered_at == 0) out.recovered_at = seconds(clock_type::now());
  });
  out.w = std::move(run.w);
  return out;
}

// What the ranks that stay end with: every rank to step 8, then all but the last from there.
std::vector<float> leave_reference(herd::mpi_communicator& world, herd::comm_options options) {
  herd::mpi_communicator comm(MPI_COMM_WORLD, options);
  herd_test::sharded_run run = herd_test::start_sharded(std::size_t{1} << 16, comm.size(), comm.rank());
  herd_test::train_sharded(comm, run, 8);
  std::vector<int> stay(static_cast<std::size_t>(comm.size() - 1));
  for (std::size_t i = 0; i < stay.size(); ++i) stay[i] = static_cast<int>(i);
  herd::mpi_communicator smaller = comm.subset(stay);
  if (smaller.is_member()) {
    run.sampler.reshard(smaller.size(), smaller.rank());
    herd_test::train_sharded(smaller, run, 16);
  }
  herd::broadcast(run.w, world, 0);
  return run.w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  int reps = 5;
  double shutdown = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--reps") reps = std::stoi(argv[i + 1]);
    else if (flag == "--shutdown") shutdown = std::stod(argv[i + 1]);
  }
  herd::mpi_communicator world;
  herd::comm_options options;
  options.stall_shutdown_seconds = shutdown;
  // Where the fault strikes: halfway through the waits of step 9's allreduce on the faulty rank,
  // counted on a fault-free run.
  int waits_before = 0, waits_after = 0;
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, options);
    auto counter = herd_test::faulty_communicator<herd::mpi_communicator>::after_wait(comm, -1, nullptr);
    std::vector<float> g(std::size_t{1} << 16, 1.0f);
    for (int s = 0; s < 9; ++s) {
      if (s == 8) waits_before = counter.waits();
      herd::allreduce(g, counter, herd::reduce_op::avg);
    }
    waits_after = counter.waits();
  }
  const int at = (waits_before + waits_after) / 2;
  const outcome clean = train(options, -1, nullptr);
  const auto stall = std::chrono::duration<double>(shutdown + 0.5);
  const std::vector<std::pair<const char*, std::function<void()>>> faults = {
      {"exception", [] { throw herd::error("injected failure"); }},
      {"stall", [stall] { std::this_thread::sleep_for(stall); }},
  };
  if (world.rank() == 0) {
    std::printf("# herd recovery under run_elastic: %d ranks, shutdown time %.1f s, 64 Ki f32 parameters, "
                "fault-free step %.2f ms, median of %d\n",
                world.size(), shutdown, clean.step_seconds * 1e3, reps);
    std::printf("%-10s %12s %12s %12s %10s\n", "fault", "median s", "min s", "max s", "exact");
  }
  int wrong = 0;
  // Runs one case `reps` times (run() gives a run's outcome and whether it was exact on this rank)
  // and prints its row: the fault's time from the faulty rank, the last recovery among the ranks.
  auto report = [&](const char* name, const std::function<std::pair<outcome, bool>()>& run) {
    std::vector<double> times;
    bool exact = true;
    for (int r = 0; r < reps; ++r) {
      const auto [o, mine] = run();
      exact = exact && mine;
      std::vector<double> t = {o.fault_at, o.recovered_at};
      herd::allreduce(t, world, herd::reduce_op::max);
      times.push_back(t[1] - t[0]);
    }
    std::vector<int> all_exact = {exact ? 1 : 0};
    herd::allreduce(all_exact, world, herd::reduce_op::min);
    wrong += all_exact[0] == 0;
    if (world.rank() == 0) {
      std::printf("%-10s %12.3f %12.3f %12.3f %10s\n", name, median(times), *std::min_element(times.begin(), times.end()),
                  *std::max_element(times.begin(), times.end()), all_exact[0] ? "yes" : "NO");
    }
  };
  // 2 -> 1 included: the rank that stays goes on alone.
  if (world.size() >= 2) {
    const std::vector<float> reference = leave_reference(world, options);
    report("leave", [&] {
      const outcome o = train_leaving(options);
      const bool leaves = world.rank() == world.size() - 1;
      return std::pair{o, leaves || (o.w == reference && o.attempts == 2)};
    });
  }
  for (const auto& [name, fault] : faults) {
    report(name, [&] {
      const outcome o = train(options, at, fault);
      return std::pair{o, o.w == clean.w && o.attempts == 2};
    });
  }
  return wrong == 0 ? 0 : 1;
}
