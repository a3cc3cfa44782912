#ifndef HERD_OPTIM_SGD_HPP
#define HERD_OPTIM_SGD_HPP
// herd::sgd: stochastic gradient descent with momentum, Nesterov momentum and weight decay, for
// parameters in host memory of any floating-point dtype. The update follows torch.optim.SGD:
//
//   d = g + weight_decay * p
//   b = d (first step) or momentum * b + (1 - dampening) * d      (when momentum != 0)
//   d = d + momentum * b (nesterov) or b
//   p = p - lr * d
//
// Arithmetic runs in f32 (f64 for f64 parameters); the momentum buffers are kept in that dtype.

#include <herd/core/config.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace herd {

struct sgd_options {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
};

class sgd {
 public:
  sgd(std::vector<buffer_view> params, std::vector<buffer_view> grads, sgd_options options = {});
  explicit sgd(const parameters& p, sgd_options options = {}) : sgd(p.values, p.gradients, options) {}

  void step();

  double lr() const noexcept { return options_.lr; }
  void set_lr(double lr) noexcept { options_.lr = lr; }
  const sgd_options& options() const noexcept { return options_; }
  std::int64_t steps() const noexcept { return steps_; }

  template <class F> void visit_state(F&& f) {
    f(std::string("step"), buffer_view{&steps_, 1, dtype::i64, device::cpu()});
    for (std::size_t i = 0; i < momentum_.size(); ++i) f("momentum." + std::to_string(i), momentum_[i].view());
  }

 private:
  void update(const buffer_view& param, const buffer_view& grad, host_tensor& buffer) const;

  std::vector<buffer_view> params_;
  std::vector<buffer_view> grads_;
  sgd_options options_;
  std::vector<host_tensor> momentum_;
  std::int64_t steps_ = 0;
};

// sgd's constructor, step and loops over the floating-point dtypes: inline, or with
// HERD_SEPARATE_COMPILATION only in the program's implementation file (core/config.hpp).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE sgd::sgd(std::vector<buffer_view> params, std::vector<buffer_view> grads, sgd_options options)
    : params_(std::move(params)), grads_(std::move(grads)), options_(options) {
  detail::require_parameter_pairs(params_, grads_, "sgd");
  if (options_.nesterov && (options_.momentum <= 0 || options_.dampening != 0)) {
    detail::raise({"sgd"}, "Nesterov momentum needs momentum > 0 and dampening 0", "Adjust sgd_options");
  }
  for (const auto& p : params_) {
    momentum_.emplace_back(detail::state_dtype(p.type), options_.momentum != 0 ? p.count : 0);
  }
}

HERD_SEPARATE void sgd::step() {
  for (std::size_t i = 0; i < params_.size(); ++i) update(params_[i], grads_[i], momentum_[i]);
  ++steps_;
}

HERD_SEPARATE void sgd::update(const buffer_view& param, const buffer_view& grad, host_tensor& buffer) const {
  visit(param.type, [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_floating_point_v<T> || detail::is_16bit_float<T>) {
      using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
      auto* p = static_cast<T*>(param.data);
      const auto* g = static_cast<const T*>(grad.data);
      auto* b = static_cast<S*>(buffer.data());
      const auto lr = static_cast<S>(options_.lr);
      const auto wd = static_cast<S>(options_.weight_decay);
      const auto m = static_cast<S>(options_.momentum);
      const auto keep = static_cast<S>(1 - options_.dampening);
      const bool first = steps_ == 0;
      for (std::size_t j = 0; j < param.count; ++j) {
        const S pj = static_cast<S>(p[j]);
        S d = static_cast<S>(g[j]) + wd * pj;
        if (m != 0) {
          b[j] = first ? d : m * b[j] + keep * d;
          d = options_.nesterov ? d + m * b[j] : b[j];
        }
        p[j] = static_cast<T>(pj - lr * d);
      }
    }
  });
}
#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd

#endif  // HERD_OPTIM_SGD_HPP
