#ifndef HERD_NN_TORCH_HPP
#define HERD_NN_TORCH_HPP
// herd::torch::SyncBatchNorm for libtorch, which has none: BatchNorm whose batch statistics are
// those of every rank's batch together, and convert_sync_batchnorm, which gives a Sequential
// with its BatchNorm1d/2d/3d layers swapped for it (as torch.nn.SyncBatchNorm.
// convert_sync_batchnorm). Opt-in: include it after <torch/torch.h>.
//
//   torch::nn::Sequential model(torch::nn::Conv2d(3, 8, 3), torch::nn::BatchNorm2d(8), torch::nn::ReLU());
//   model = herd::torch::convert_sync_batchnorm(model, comm);
//   herd::torch::SyncBatchNorm bn(torch::nn::BatchNormOptions(8), comm);   // or directly, in your own module
//
// In training, forward sums each channel's values and squares over this rank's batch and makes
// them global with one allreduce (herd::sync_batch_moments); backward makes the per-channel sums
// of dy and dy * xhat global with one more (herd::sync_batch_norm_sums). Weight and bias
// gradients are this rank's, reduced with the other gradients by DDP or the distributed
// optimizer. Running statistics and eval() behave as BatchNorm's. Host tensors (CPU libtorch).
// The communicator must outlive the module.

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/nn/sync_batch_norm.hpp>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/autograd.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN

namespace detail {

// The two exchanges of a communicator, behind one interface so that the module is not a template.
class batch_norm_exchange {
 public:
  virtual ~batch_norm_exchange() = default;
  virtual batch_moments moments(std::span<const double> sum, std::span<const double> sum_sq, double count) = 0;
  virtual void sums(std::span<double> sum_dy, std::span<double> sum_dy_xhat) = 0;
};

template <communicator C> class exchange_over final : public batch_norm_exchange {
 public:
  explicit exchange_over(C& comm) : comm_(&comm) {}
  batch_moments moments(std::span<const double> sum, std::span<const double> sum_sq, double count) override {
    return sync_batch_moments(sum, sum_sq, count, *comm_);
  }
  void sums(std::span<double> sum_dy, std::span<double> sum_dy_xhat) override {
    sync_batch_norm_sums(sum_dy, sum_dy_xhat, *comm_);
  }

 private:
  C* comm_;
};

inline std::span<double> doubles(::torch::Tensor& t) { return {t.data_ptr<double>(), static_cast<std::size_t>(t.numel())}; }

// `t` (N x C x *) viewed as N x C x S, S the product of the dimensions after C: written out, not
// -1, so that a rank whose batch is empty (N = 0) still has its view and joins the exchanges.
inline ::torch::Tensor as_ncs(const ::torch::Tensor& t) {
  std::int64_t spatial = 1;
  for (std::int64_t d = 2; d < t.dim(); ++d) spatial *= t.size(d);
  return t.contiguous().view({t.size(0), t.size(1), spatial});
}

// The dimensions a channel's statistics run over in an N x C x S view.
inline ::torch::IntArrayRef channel_dims() {
  static const std::int64_t dims[] = {0, 2};
  return dims;
}

// libtorch's custom autograd functions take no undefined tensor (libtorch 1.13 asks each input for
// its device): an absent weight, bias or running statistic travels as an empty tensor instead.
inline ::torch::Tensor or_empty(const ::torch::Tensor& t) { return t.defined() ? t : ::torch::empty({0}); }
inline bool present(const ::torch::Tensor& t) { return t.defined() && t.numel() != 0; }

// The autograd function: input N x C x *, weight and bias C; running statistics updated in place.
struct sync_batch_norm_function : ::torch::autograd::Function<sync_batch_norm_function> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx, ::torch::Tensor input, ::torch::Tensor weight,
                                 ::torch::Tensor bias, ::torch::Tensor running_mean, ::torch::Tensor running_var,
                                 double eps, double momentum, batch_norm_exchange* exchange) {
    const auto c = input.size(1);
    const ::torch::Tensor x = as_ncs(input).to(::torch::kDouble);
    ::torch::Tensor sum = x.sum(channel_dims()).contiguous(), sum_sq = (x * x).sum(channel_dims()).contiguous();
    const batch_moments m = exchange->moments(doubles(sum), doubles(sum_sq), static_cast<double>(x.size(0) * x.size(2)));
    const auto options = ::torch::TensorOptions().dtype(::torch::kDouble);
    const ::torch::Tensor mean = ::torch::tensor(m.mean, options), var = ::torch::tensor(m.var, options);
    const ::torch::Tensor invstd = (var + eps).rsqrt();
    {
      const ::torch::NoGradGuard no_grad;
      if (present(running_mean)) running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype()), momentum);
      if (present(running_var)) {
        running_var.mul_(1 - momentum).add_((var * (m.count / (m.count - 1))).to(running_var.dtype()), momentum);
      }
    }
    const ::torch::Tensor xhat = (x - mean.view({1, c, 1})) * invstd.view({1, c, 1});
    ::torch::Tensor y = xhat;
    if (present(weight)) y = y * weight.to(::torch::kDouble).view({1, c, 1});
    if (present(bias)) y = y + bias.to(::torch::kDouble).view({1, c, 1});
    ctx->save_for_backward({xhat, invstd, weight});
    ctx->saved_data["count"] = m.count;
    ctx->saved_data["exchange"] = reinterpret_cast<std::int64_t>(exchange);
    ctx->saved_data["shape"] = input.sizes().vec();
    return y.to(input.dtype()).view(input.sizes());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const ::torch::Tensor& xhat = saved[0];
    const ::torch::Tensor& invstd = saved[1];
    const ::torch::Tensor& weight = saved[2];
    const double count = ctx->saved_data["count"].toDouble();
    auto* exchange = reinterpret_cast<batch_norm_exchange*>(ctx->saved_data["exchange"].toInt());
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const auto c = xhat.size(1);
    const ::torch::Tensor dy = grads[0].contiguous().view(xhat.sizes()).to(::torch::kDouble);
    ::torch::Tensor sum_dy = dy.sum(channel_dims()).contiguous(), sum_dy_xhat = (dy * xhat).sum(channel_dims()).contiguous();
    const ::torch::Tensor grad_bias = sum_dy.clone(), grad_weight = sum_dy_xhat.clone();  // this rank's
    exchange->sums(doubles(sum_dy), doubles(sum_dy_xhat));
    ::torch::Tensor scale = invstd;
    if (present(weight)) scale = scale * weight.to(::torch::kDouble);
    const ::torch::Tensor dx = scale.view({1, c, 1}) * (dy - (sum_dy / count).view({1, c, 1}) -
                                                        xhat * (sum_dy_xhat / count).view({1, c, 1}));
    const auto type = grads[0].dtype();
    return {dx.to(type).view(shape), present(weight) ? grad_weight.to(type) : ::torch::Tensor(),
            present(weight) ? grad_bias.to(type) : ::torch::Tensor(), ::torch::Tensor(), ::torch::Tensor(),
            ::torch::Tensor(), ::torch::Tensor(), ::torch::Tensor()};
  }
};

}  // namespace detail

class SyncBatchNormImpl : public ::torch::nn::Module {
 public:
  template <communicator C>
  SyncBatchNormImpl(const ::torch::nn::BatchNormOptions& batch_norm_options, C& comm)
      : options(batch_norm_options), exchange_(std::make_shared<detail::exchange_over<C>>(comm)) {
    reset();
  }

  void reset() {
    const auto c = options.num_features();
    if (options.affine()) {
      weight = register_parameter("weight", ::torch::ones({c}));
      bias = register_parameter("bias", ::torch::zeros({c}));
    }
    if (options.track_running_stats()) {
      running_mean = register_buffer("running_mean", ::torch::zeros({c}));
      running_var = register_buffer("running_var", ::torch::ones({c}));
      num_batches_tracked = register_buffer("num_batches_tracked", ::torch::tensor(0, ::torch::kLong));
    }
  }

  ::torch::Tensor forward(const ::torch::Tensor& input) {
    if (input.dim() < 2 || input.size(1) != options.num_features()) {
      herd::detail::raise({"torch::SyncBatchNorm"},
                          "input of shape " + shape_text(input) + " for " + std::to_string(options.num_features()) + " channels",
                          "Pass N x C x ... tensors whose dimension 1 is the number of features");
    }
    // As torch.nn.SyncBatchNorm: statistics are synchronized in training only; eval() uses the
    // running statistics, or, without them, this rank's own batch statistics, with no exchange.
    if (!is_training()) {
      const bool own_batch = !options.track_running_stats();
      return ::torch::batch_norm(input, weight, bias, running_mean, running_var, own_batch, 0.0, options.eps(), false);
    }
    double momentum = options.momentum().value_or(0.0);
    if (options.track_running_stats()) {
      num_batches_tracked += 1;
      if (!options.momentum().has_value()) momentum = 1.0 / num_batches_tracked.item<double>();  // cumulative average
    }
    using detail::or_empty;
    return detail::sync_batch_norm_function::apply(input, or_empty(weight), or_empty(bias), or_empty(running_mean),
                                                   or_empty(running_var), options.eps(), momentum, exchange_.get());
  }

  ::torch::nn::BatchNormOptions options;
  ::torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  static std::string shape_text(const ::torch::Tensor& t) {
    std::string text = "[";
    for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
    return text + "]";
  }

  std::shared_ptr<detail::batch_norm_exchange> exchange_;
};

// The module holder, as TORCH_MODULE would declare it (the macro names torch:: unqualified).
class SyncBatchNorm : public ::torch::nn::ModuleHolder<SyncBatchNormImpl> {
 public:
  using ::torch::nn::ModuleHolder<SyncBatchNormImpl>::ModuleHolder;
  using Impl = SyncBatchNormImpl;
};

namespace detail {
// The SyncBatchNorm that takes the place of `child` if it is a BatchNorm1d/2d/3d: same options,
// parameters and running statistics.
template <communicator C> std::optional<SyncBatchNorm> sync_version(const std::shared_ptr<::torch::nn::Module>& child, C& comm) {
  std::optional<SyncBatchNorm> sync;
  auto take = [&](auto* bn) {
    if (bn == nullptr) return;
    const auto& o = bn->options;
    sync.emplace(::torch::nn::BatchNormOptions(o.num_features()).eps(o.eps()).momentum(o.momentum()).affine(o.affine())
                     .track_running_stats(o.track_running_stats()),
                 comm);
    const ::torch::NoGradGuard no_grad;
    if (bn->weight.defined()) (*sync)->weight.copy_(bn->weight), (*sync)->bias.copy_(bn->bias);
    if (bn->running_mean.defined()) {
      (*sync)->running_mean.copy_(bn->running_mean), (*sync)->running_var.copy_(bn->running_var);
      (*sync)->num_batches_tracked.copy_(bn->num_batches_tracked);
    }
  };
  take(dynamic_cast<::torch::nn::BatchNorm1dImpl*>(child.get()));
  take(dynamic_cast<::torch::nn::BatchNorm2dImpl*>(child.get()));
  take(dynamic_cast<::torch::nn::BatchNorm3dImpl*>(child.get()));
  return sync;
}
}  // namespace detail

// A copy of `model` with each of its BatchNorm1d/2d/3d layers replaced by a SyncBatchNorm of the
// same options, parameters and running statistics, the other layers shared with `model`:
// torch.nn.SyncBatchNorm.convert_sync_batchnorm for libtorch's Sequential. (A module of your own
// calls its layers through typed members, which cannot change type: declare those as
// herd::torch::SyncBatchNorm instead.)
template <communicator C> ::torch::nn::Sequential convert_sync_batchnorm(const ::torch::nn::Sequential& model, C& comm) {
  ::torch::nn::Sequential converted;
  auto layer = model->begin();
  for (const auto& item : model->named_children()) {
    const ::torch::nn::AnyModule& any = *layer++;
    if (auto sync = detail::sync_version(item.value(), comm)) {
      converted->push_back(item.key(), ::torch::nn::AnyModule(*sync));
    } else {
      converted->push_back(item.key(), any);
    }
  }
  return converted;
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_NN_TORCH_HPP
