#pragma once
// The training loop of the elastic tests, on threads and on MPI ranks alike: a gradient of
// arbitrary floats averaged across ranks, a descent step, a commit every 4 steps, all under
// herd::run_elastic, so that a run with faults can be compared bit for bit with one without.

#include <herd/collectives/allreduce.hpp>
#include <herd/data/distributed_sampler.hpp>
#include <herd/runtime/elastic.hpp>
#include <herd/tensor/std.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

namespace herd_test {

// Trains `w` from `step` to `steps` under run_elastic on `comm`, reducing through `faulty` (a
// faulty_communicator over comm); `after_step`, when given, is called after each step with the
// number of the current attempt (1, then 2 after a rollback...). Returns how many times
// run_elastic called the training function. Also the loop of benchmarks/recovery.cpp.
template <class C, class Faulty>
int train_elastic_steps(C& comm, Faulty& faulty, std::vector<float>& w, std::int64_t& step, std::int64_t steps,
                        const std::function<void(int attempt)>& after_step = {}) {
  herd::elastic_state state;
  state.track(w);
  state.track(step);
  const int rank = comm.rank();
  int attempts = 0;
  herd::run_elastic(comm, state, [&](C&) {
    ++attempts;
    while (step < steps) {
      std::vector<float> g(w.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = std::sin(w[i] * static_cast<float>(rank + 1) + static_cast<float>(step) + 0.001f * static_cast<float>(i));
      }
      herd::allreduce(g, faulty, herd::reduce_op::avg);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.1f * g[i];
      ++step;
      if (step % 4 == 0) state.commit();
      if (after_step) after_step(attempts);
    }
  });
  return attempts;
}

// What a training run of sharded data keeps: the parameters, the step, and the sampler (tracked
// whole: its epoch, its position and the world it splits over).
struct sharded_run {
  std::vector<float> w;
  std::int64_t step = 0;
  herd::distributed_sampler sampler;
};

inline constexpr std::size_t sharded_dataset = 40;  // samples: a few steps per epoch, so epochs turn over
inline constexpr std::size_t sharded_batch = 2;     // samples per rank and step

inline sharded_run start_sharded(std::size_t parameters, int world_size, int rank) {
  herd::sampler_options o;
  o.seed = 7;
  return {std::vector<float>(parameters, 0.5f), 0, herd::distributed_sampler(sharded_dataset, world_size, rank, o)};
}

// A rank that leaves the training: which rank (of the first world), before which step, and how.
struct departure {
  enum how_t { returns, leaves, raises };
  int rank = -1;
  std::int64_t step = -1;
  how_t how = returns;
};
// What a rank that leaves by an exception raises: not a herd::error, so run_elastic lets it pass.
struct rank_left : std::runtime_error {
  rank_left() : std::runtime_error("this rank leaves the training") {}
};

// Trains `run` to `steps` under run_elastic: each step every rank takes its next batch from the
// sampler, its gradient depends on those samples, the gradient is averaged across ranks, a commit
// every 4 steps; when the world shrinks the sampler is re-sharded over the ranks that stay.
// `gone` leaves on one rank as it says; `after_step` as in train_elastic_steps. Returns how many
// times run_elastic called the training function.
template <class C>
int train_sharded(C& comm, sharded_run& run, std::int64_t steps, const departure& gone = {},
                  const std::function<void(int attempt)>& after_step = {}) {
  herd::elastic_state state;
  state.track(run.w);
  state.track(run.step);
  state.track(run.sampler);
  state.on_world_change([&](int, int new_size) { run.sampler.reshard(new_size, comm.rank()); });
  const int first_rank = comm.rank();
  int attempts = 0;
  herd::run_elastic(comm, state, [&](C& c) {
    ++attempts;
    while (run.step < steps) {
      if (first_rank == gone.rank && run.step == gone.step) {
        if (gone.how == departure::raises) throw rank_left();
        if (gone.how == departure::leaves) c.leave();
        return;
      }
      if (run.sampler.size() - run.sampler.start() < sharded_batch) run.sampler.set_epoch(run.sampler.epoch() + 1);
      const std::vector<std::size_t> batch = run.sampler.indices();
      float x = 0;
      for (std::size_t b = 0; b < sharded_batch; ++b) x += 0.25f * static_cast<float>(batch[b] % 13) - 1.0f;
      std::vector<float> g(run.w.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = std::sin(run.w[i] * (1.0f + 0.1f * x) + static_cast<float>(run.step) + 0.001f * static_cast<float>(i));
      }
      herd::allreduce(g, c, herd::reduce_op::avg);
      for (std::size_t i = 0; i < run.w.size(); ++i) run.w[i] -= 0.1f * g[i];
      ++run.step;
      run.sampler.advance(sharded_batch);
      if (run.step % 4 == 0) state.commit();
      if (after_step) after_step(attempts);
    }
  });
  return attempts;
}

}  // namespace herd_test
