#ifndef HERD_OPTIM_LR_SCHEDULE_HPP
#define HERD_OPTIM_LR_SCHEDULE_HPP
// The learning rate for data-parallel training: the single-rank rate scaled by the number of
// ranks (the effective batch grows with them), reached by a linear warm-up from the single-rank
// rate over the first steps (Goyal et al., "Accurate, Large Minibatch SGD"; Horovod's
// LearningRateWarmupCallback).
//
//   herd::scaled_learning_rate schedule{.base = 0.05, .ranks = comm.size(), .warmup_steps = 500};
//   sgd.set_lr(schedule(step));

#include <herd/core/config.hpp>

#include <concepts>
#include <cstddef>

namespace herd {

struct scaled_learning_rate {
  double base = 0.01;            // the learning rate that works on one rank
  int ranks = 1;                 // world size
  std::size_t warmup_steps = 0;  // 0: the scaled rate from the first step

  // The rate for step `step` (any integer type; a negative step counts as 0).
  template <std::integral Step> double operator()(Step step) const noexcept {
    const double target = base * ranks;
    const double at = step < 0 ? 0.0 : static_cast<double>(step);
    if (at >= static_cast<double>(warmup_steps)) return target;
    return base + (target - base) * at / static_cast<double>(warmup_steps);
  }
};

}  // namespace herd

#endif  // HERD_OPTIM_LR_SCHEDULE_HPP
