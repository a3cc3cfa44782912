#ifndef HERD_OPTIM_ADAMW_HPP
#define HERD_OPTIM_ADAMW_HPP
// herd::adamw: Adam with decoupled weight decay, for parameters in host memory of any
// floating-point dtype. The update follows torch.optim.AdamW (without amsgrad):
//
//   t += 1;  p = p * (1 - lr * weight_decay)
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Arithmetic runs in f32 (f64 for f64 parameters); the moments are kept in that dtype. The first
// moment is updated as PyTorch 2.1 and later do, m.lerp_(g, 1 - beta1); PyTorch 1.13 and 2.0
// compute m.mul_(beta1).add_(g, alpha=1 - beta1), which rounds differently in the last bit:
// adamw_options::first_moment picks that one (adamw_first_moment::mul_add).

#include <herd/core/config.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace herd {

namespace detail {

// at::lerp's arithmetic (its scalar and vectorized CPU kernels alike): from the nearer end, so that
// weight 0 gives start and weight 1 gives end exactly; each operation rounds in T.
template <class T> inline T lerp(T start, T end, T weight) noexcept {
  return std::abs(weight) < T(0.5) ? start + weight * (end - start) : end - (end - start) * (T(1) - weight);
}

}  // namespace detail

// How AdamW updates its first moment m from the gradient g.
enum class adamw_first_moment {
  lerp,     // m.lerp_(g, 1 - beta1): torch.optim.AdamW of PyTorch 2.1 and later
  mul_add,  // m.mul_(beta1).add_(g, alpha=1 - beta1): PyTorch 1.13 and 2.0
};

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  adamw_first_moment first_moment = adamw_first_moment::lerp;
};

class adamw {
 public:
  adamw(std::vector<buffer_view> params, std::vector<buffer_view> grads, adamw_options options = {});
  explicit adamw(const parameters& p, adamw_options options = {}) : adamw(p.values, p.gradients, options) {}

  void step();

  double lr() const noexcept { return options_.lr; }
  void set_lr(double lr) noexcept { options_.lr = lr; }
  const adamw_options& options() const noexcept { return options_; }
  std::int64_t steps() const noexcept { return steps_; }

  template <class F> void visit_state(F&& f) {
    f(std::string("step"), buffer_view{&steps_, 1, dtype::i64, device::cpu()});
    for (std::size_t i = 0; i < exp_avg_.size(); ++i) {
      f("exp_avg." + std::to_string(i), exp_avg_[i].view());
      f("exp_avg_sq." + std::to_string(i), exp_avg_sq_[i].view());
    }
  }

 private:
  void update(const buffer_view& param, const buffer_view& grad, host_tensor& m_state, host_tensor& v_state) const;

  std::vector<buffer_view> params_;
  std::vector<buffer_view> grads_;
  adamw_options options_;
  std::vector<host_tensor> exp_avg_;
  std::vector<host_tensor> exp_avg_sq_;
  std::int64_t steps_ = 0;
};

// adamw's constructor, step and loops over the floating-point dtypes: inline, or with
// HERD_SEPARATE_COMPILATION only in the program's implementation file (core/config.hpp).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE adamw::adamw(std::vector<buffer_view> params, std::vector<buffer_view> grads, adamw_options options)
    : params_(std::move(params)), grads_(std::move(grads)), options_(options) {
  detail::require_parameter_pairs(params_, grads_, "adamw");
  for (const auto& p : params_) {
    exp_avg_.emplace_back(detail::state_dtype(p.type), p.count);
    exp_avg_sq_.emplace_back(detail::state_dtype(p.type), p.count);
  }
}

HERD_SEPARATE void adamw::step() {
  ++steps_;
  for (std::size_t i = 0; i < params_.size(); ++i) update(params_[i], grads_[i], exp_avg_[i], exp_avg_sq_[i]);
}

HERD_SEPARATE void adamw::update(const buffer_view& param, const buffer_view& grad, host_tensor& m_state,
                                 host_tensor& v_state) const {
  visit(param.type, [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_floating_point_v<T> || detail::is_16bit_float<T>) {
      using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
      auto* p = static_cast<T*>(param.data);
      const auto* g = static_cast<const T*>(grad.data);
      auto* m = static_cast<S*>(m_state.data());
      auto* v = static_cast<S*>(v_state.data());
      const double t = static_cast<double>(steps_);
      const auto decay = static_cast<S>(1 - options_.lr * options_.weight_decay);
      // Each coefficient is computed in double and rounded once, as torch.optim.AdamW's Python
      // floats are: 1 - beta2 from the rounded f32 beta2 differs from it by up to 1e-5 relative.
      const auto b1 = static_cast<S>(options_.beta1);
      const auto b2 = static_cast<S>(options_.beta2);
      const auto keep1 = static_cast<S>(1 - options_.beta1);
      const auto keep2 = static_cast<S>(1 - options_.beta2);
      const auto step_size = static_cast<S>(options_.lr / (1 - std::pow(options_.beta1, t)));
      const auto root_correction = static_cast<S>(std::sqrt(1 - std::pow(options_.beta2, t)));
      const auto eps = static_cast<S>(options_.eps);
      const bool lerp = options_.first_moment == adamw_first_moment::lerp;
      for (std::size_t j = 0; j < param.count; ++j) {
        const S gj = static_cast<S>(g[j]);
        const S pj = static_cast<S>(p[j]) * decay;
        m[j] = lerp ? detail::lerp(m[j], gj, keep1) : b1 * m[j] + keep1 * gj;
        v[j] = b2 * v[j] + keep2 * gj * gj;
        p[j] = static_cast<T>(pj - step_size * m[j] / (std::sqrt(v[j]) / root_correction + eps));
      }
    }
  });
}
#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd

#endif  // HERD_OPTIM_ADAMW_HPP
