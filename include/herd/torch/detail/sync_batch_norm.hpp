#ifndef HERD_TORCH_DETAIL_SYNC_BATCH_NORM_HPP
#define HERD_TORCH_DETAIL_SYNC_BATCH_NORM_HPP
// The arithmetic and exchanges of herd::torch::SyncBatchNorm (torch/sync_batch_norm.hpp): its
// autograd function, the combination of every rank's moments, and the communicator behind an
// interface, so that the module is not a template.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/torch/detail/streams.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
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

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_TORCH_DETAIL_SYNC_BATCH_NORM_HPP
