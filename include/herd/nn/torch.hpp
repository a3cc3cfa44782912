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
// In training, forward gathers each rank's per-channel count, mean and sum of squared deviations
// (one allgather, as PyTorch's SyncBatchNorm) and combines them in rank order into the global
// mean and variance; backward makes the per-channel sums of dy and dy * xhat global with one
// allreduce. Statistics are computed in f32 (f64 for f64 inputs); the output keeps the input's
// type and memory format (channels_last too); weight and bias gradients are this rank's, in the
// parameters' type, reduced with the other gradients by DDP or the distributed optimizer. Running
// statistics and eval() behave as BatchNorm's. CPU tensors over any communicator; CUDA tensors
// over a nccl_communicator (on their GPU, from a g++ build too) or through host memory over MPI.
// The communicator must outlive the module.

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/tensor/detail/torch_streams.hpp>
#include <herd/tensor/torch.hpp>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN

namespace detail {

// The two exchanges of a communicator, behind one interface so that the module is not a template.
// Each takes a tensor where the layer computes (CPU or GPU) and moves it to where the communicator
// reaches first, when that is elsewhere (a CUDA tensor over MPI goes through host memory; over
// a nccl_communicator it stays on its GPU).
class batch_norm_exchange {
 public:
  virtual ~batch_norm_exchange() = default;
  // Every rank's `local` (k values), as a CPU tensor of size x k in rank order.
  virtual ::torch::Tensor gather(const ::torch::Tensor& local) = 0;
  // The sum of every rank's `values`, in place.
  virtual void sum(::torch::Tensor& values) = 0;
};

template <communicator C> class exchange_over final : public batch_norm_exchange {
 public:
  explicit exchange_over(C& comm) : comm_(&comm) {}
  ::torch::Tensor gather(const ::torch::Tensor& local) override {
    const ::torch::Tensor mine = reachable(local);
    ::torch::Tensor all = ::torch::empty({comm_->size(), mine.numel()}, mine.options());
    herd::allgather(mine, all, *comm_);
    return all.cpu();
  }
  void sum(::torch::Tensor& values) override {
    ::torch::Tensor reduced = reachable(values);
    herd::allreduce(reduced, *comm_);
    if (!reduced.is_same(values)) values.copy_(reduced);
  }

 private:
  // `t`, or a copy the communicator reaches. herd's collectives order their GPU work after its
  // own notion of the caller's stream, which is not libtorch's: a CUDA tensor that stays on its
  // GPU is first made ready on the host (a wait for a few kernels that sum C channels).
  ::torch::Tensor reachable(const ::torch::Tensor& t) const {
    const c10::Device d = t.device();
    const herd::device where = d.is_cuda() ? herd::device::cuda(d.index()) : herd::device::cpu();
    if (!comm_->supports(where)) return t.to(::torch::kCPU).contiguous();
    ::torch::Tensor ready = t.contiguous();
#if HERD_HAVE_TORCH_STREAMS
    if (d.is_cuda()) herd::detail::settle_torch_stream(d.index());
#endif
    return ready;
  }

  C* comm_;
};

// Every dimension of an N x C x ... tensor but the channels': what a channel's statistics run over.
inline std::vector<std::int64_t> channel_dims(const ::torch::Tensor& t) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against an N x C x ... tensor.
inline ::torch::Tensor per_channel(const ::torch::Tensor& v, const ::torch::Tensor& like) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(like.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// The type statistics and normalization are computed in: f32 for 16-bit and f32 inputs (as
// PyTorch's SyncBatchNorm), f64 for f64.
inline ::torch::ScalarType accumulation_type(const ::torch::Tensor& t) {
  return t.scalar_type() == ::torch::kDouble ? ::torch::kDouble : ::torch::kFloat;
}

// libtorch's custom autograd functions take no undefined tensor (libtorch 1.13 asks each input for
// its device): an absent weight, bias or running statistic travels as an empty tensor instead.
inline ::torch::Tensor or_empty(const ::torch::Tensor& t) { return t.defined() ? t : ::torch::empty({0}); }
inline bool present(const ::torch::Tensor& t) { return t.defined() && t.numel() != 0; }

// The global count, mean and biased variance of each channel from every rank's (count, mean, sum
// of squared deviations from that mean): Chan et al.'s pairwise update, in rank order, in f64, so
// that every rank gets the same values and no E[x^2] - E[x]^2 cancellation loses the variance.
struct global_moments {
  double count = 0;
  ::torch::Tensor mean, var;  // f64, on the CPU
};
inline global_moments combine_moments(const ::torch::Tensor& all, std::int64_t channels) {
  global_moments g;
  g.mean = ::torch::zeros({channels}, ::torch::kDouble);
  ::torch::Tensor m2 = ::torch::zeros({channels}, ::torch::kDouble);
  for (std::int64_t r = 0; r < all.size(0); ++r) {
    const double n = all[r][0].item<double>();
    if (n == 0) continue;
    const ::torch::Tensor mean = all[r].slice(0, 1, 1 + channels), dev2 = all[r].slice(0, 1 + channels);
    const double total = g.count + n;
    const ::torch::Tensor delta = mean - g.mean;
    g.mean += delta * (n / total);
    m2 += dev2 + delta * delta * (g.count * n / total);
    g.count = total;
  }
  g.var = m2 / std::max(g.count, 1.0);
  return g;
}

// The autograd function: input N x C x * (any memory format: channels_last stays so), weight and
// bias C; running statistics updated in place. Saved for backward: the input itself and two
// values per channel, not a normalized copy of the activation.
struct sync_batch_norm_function : ::torch::autograd::Function<sync_batch_norm_function> {
  static ::torch::Tensor forward(::torch::autograd::AutogradContext* ctx, ::torch::Tensor input, ::torch::Tensor weight,
                                 ::torch::Tensor bias, ::torch::Tensor running_mean, ::torch::Tensor running_var,
                                 double eps, double momentum, batch_norm_exchange* exchange) {
    const auto c = input.size(1);
    const auto acc = accumulation_type(input);
    const std::vector<std::int64_t> dims = channel_dims(input);
    const ::torch::Tensor x = input.to(acc);
    const std::int64_t n = c == 0 ? 0 : input.numel() / c;
    ::torch::Tensor local_mean = ::torch::zeros({c}, x.options()), local_m2 = ::torch::zeros({c}, x.options());
    if (n != 0) {
      local_mean = x.mean(dims);
      local_m2 = (x - per_channel(local_mean, x)).square().sum(dims);
    }
    const ::torch::Tensor local =
        ::torch::cat({::torch::full({1}, static_cast<double>(n), x.options().dtype(::torch::kDouble)),
                      local_mean.to(::torch::kDouble), local_m2.to(::torch::kDouble)});
    const global_moments g = combine_moments(exchange->gather(local), c);
    if (g.count < 2) {
      herd::detail::raise({"torch::SyncBatchNorm"},
                          "the global batch has " + std::to_string(static_cast<long long>(g.count)) + " value(s) per channel",
                          "Batch normalization in training needs more than one value per channel over all ranks");
    }
    {
      const ::torch::NoGradGuard no_grad;
      if (present(running_mean)) running_mean.mul_(1 - momentum).add_(g.mean.to(running_mean.options()), momentum);
      if (present(running_var)) {
        running_var.mul_(1 - momentum).add_((g.var * (g.count / (g.count - 1))).to(running_var.options()), momentum);
      }
    }
    const ::torch::Tensor mean = g.mean.to(x.options()), invstd = (g.var + eps).rsqrt().to(x.options());
    ::torch::Tensor y = (x - per_channel(mean, x)) * per_channel(invstd, x);
    if (present(weight)) y = y * per_channel(weight.to(acc), x);
    if (present(bias)) y = y + per_channel(bias.to(acc), x);
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = g.count;
    ctx->saved_data["exchange"] = reinterpret_cast<std::int64_t>(exchange);
    return y.to(input.scalar_type());
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const ::torch::Tensor& input = saved[0];
    const ::torch::Tensor& weight = saved[1];
    const ::torch::Tensor& mean = saved[2];
    const ::torch::Tensor& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto* exchange = reinterpret_cast<batch_norm_exchange*>(ctx->saved_data["exchange"].toInt());
    const auto c = input.size(1);
    const auto acc = accumulation_type(input);
    const std::vector<std::int64_t> dims = channel_dims(input);
    const ::torch::Tensor x = input.to(acc);
    const ::torch::Tensor xhat = (x - per_channel(mean, x)) * per_channel(invstd, x);
    const ::torch::Tensor dy = grads[0].to(acc);
    ::torch::Tensor sums = ::torch::cat({dy.sum(dims), (dy * xhat).sum(dims)});  // this rank's, then everyone's
    // Weight and bias gradients are this rank's (the optimizer or DDP averages them with the
    // others'), in the parameters' own type: f32 parameters under f16 activations sum in f32.
    ::torch::Tensor grad_weight, grad_bias;
    if (present(weight)) {
      grad_weight = sums.slice(0, c).to(weight.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      grad_bias = sums.slice(0, 0, c).to(weight.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
    exchange->sum(sums);
    const ::torch::Tensor sum_dy = sums.slice(0, 0, c), sum_dy_xhat = sums.slice(0, c);
    ::torch::Tensor scale = invstd;
    if (present(weight)) scale = scale * weight.to(acc);
    const ::torch::Tensor dx = per_channel(scale, x) * (dy - per_channel(sum_dy / count, x) -
                                                        xhat * per_channel(sum_dy_xhat / count, x));
    return {dx.to(input.scalar_type()), grad_weight, grad_bias, ::torch::Tensor(), ::torch::Tensor(),
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
