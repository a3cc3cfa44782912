#ifndef HERD_OPTIM_LOSS_SCALER_HPP
#define HERD_OPTIM_LOSS_SCALER_HPP
// herd::loss_scaler: dynamic loss scaling for f16/bf16 training, as torch.cuda.amp's GradScaler
// and apex's: backward starts from loss * scale(); a step whose gradients overflowed is skipped
// and the scale backs off, growth_interval clean steps in a row grow it. Both mixed_precision
// (optim/mixed_precision.hpp) and zero_optimizer (optim/zero.hpp, zero_options::scaler) take one.
//
//   herd::loss_scaler scaler;   // 2^16, x2 after 2000 clean steps, x0.5 on overflow

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/device.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

namespace herd {

struct loss_scaler_options {
  double initial_scale = 65536.0;  // 2^16, as apex's and torch.cuda.amp's
  double growth_factor = 2.0;      // after growth_interval steps without an overflow
  double backoff_factor = 0.5;     // on an overflow (and the step is skipped)
  std::int64_t growth_interval = 2000;
  double max_scale = 16777216.0;   // 2^24, apex's cap: growth stops there (GradScaler has none: pass inf)
};

class loss_scaler {
 public:
  explicit loss_scaler(loss_scaler_options options = {});

  // Multiply the loss (or the gradient backward starts from) by this.
  double scale() const noexcept { return scale_; }
  // Records a step: an overflow backs the scale off; growth_interval clean steps in a row grow it,
  // up to max_scale (torch.cuda.amp.GradScaler's rule, with apex's cap).
  void update(bool overflow) noexcept {
    if (overflow) {
      scale_ *= options_.backoff_factor;
      clean_steps_ = 0;
      ++skipped_;
      return;
    }
    if (++clean_steps_ == options_.growth_interval) {
      scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
      clean_steps_ = 0;
    }
  }
  std::int64_t skipped_steps() const noexcept { return skipped_; }
  const loss_scaler_options& options() const noexcept { return options_; }

  template <class F> void visit_state(F&& f) {
    f(std::string("scale"), buffer_view{&scale_, 1, dtype::f64, device::cpu()});
    f(std::string("clean_steps"), buffer_view{&clean_steps_, 1, dtype::i64, device::cpu()});
    f(std::string("skipped_steps"), buffer_view{&skipped_, 1, dtype::i64, device::cpu()});
  }

 private:
  loss_scaler_options options_;
  double scale_;
  std::int64_t clean_steps_ = 0;
  std::int64_t skipped_ = 0;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE loss_scaler::loss_scaler(loss_scaler_options options) : options_(options), scale_(options.initial_scale) {
  if (!(options_.initial_scale > 0) || !(options_.growth_factor >= 1) || !(options_.backoff_factor > 0) ||
      !(options_.backoff_factor < 1) || options_.growth_interval < 1 ||
      !(options_.max_scale >= options_.initial_scale)) {
    detail::raise({"loss_scaler"},
                  "invalid options (scale > 0, growth factor >= 1, backoff factor in (0, 1), growth interval >= 1, "
                  "max scale >= initial scale)",
                  "Adjust loss_scaler_options");
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd

#endif  // HERD_OPTIM_LOSS_SCALER_HPP
