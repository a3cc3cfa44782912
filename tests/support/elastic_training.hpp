#pragma once
// The training loop of the elastic tests, on threads and on MPI ranks alike: a gradient of
// arbitrary floats averaged across ranks, a descent step, a commit every 4 steps, all under
// herd::run_elastic, so that a run with faults can be compared bit for bit with one without.

#include <herd/collectives/allreduce.hpp>
#include <herd/runtime/elastic.hpp>
#include <herd/tensor/std.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
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

}  // namespace herd_test
