#ifndef HERD_TORCH_SYNC_BATCH_NORM_HPP
#define HERD_TORCH_SYNC_BATCH_NORM_HPP
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
#include <herd/torch/detail/sync_batch_norm.hpp>
#include <herd/torch/tensor_traits.hpp>

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
#include <type_traits>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN

// libtorch's BatchNorm1d/2d/3d modules.
template <class M>
concept libtorch_batch_norm = std::is_base_of_v<::torch::nn::BatchNorm1dImpl, M> ||
                              std::is_base_of_v<::torch::nn::BatchNorm2dImpl, M> ||
                              std::is_base_of_v<::torch::nn::BatchNorm3dImpl, M>;

class SyncBatchNormImpl : public ::torch::nn::Module {
 public:
  template <communicator C>
  SyncBatchNormImpl(const ::torch::nn::BatchNormOptions& batch_norm_options, C& comm)
      : options(batch_norm_options), exchange_(std::make_shared<detail::exchange_over<C>>(comm)) {
    reset();
  }

  // In the place of `bn` (convert_sync_batchnorm): its options, its training mode, and its very
  // parameters and running statistics, not copies, so that an optimizer made over the model
  // before goes on updating them (as torch.nn.SyncBatchNorm.convert_sync_batchnorm).
  template <libtorch_batch_norm BatchNorm, communicator C>
  SyncBatchNormImpl(const BatchNorm& bn, C& comm)
      : options(bn.options), exchange_(std::make_shared<detail::exchange_over<C>>(comm)) {
    if (bn.weight.defined()) {
      weight = register_parameter("weight", bn.weight, bn.weight.requires_grad());
      bias = register_parameter("bias", bn.bias, bn.bias.requires_grad());
    }
    if (bn.running_mean.defined()) {
      running_mean = register_buffer("running_mean", bn.running_mean);
      running_var = register_buffer("running_var", bn.running_var);
      num_batches_tracked = register_buffer("num_batches_tracked", bn.num_batches_tracked);
    }
    train(bn.is_training());
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
// The SyncBatchNorm that takes the place of `child` if it is a BatchNorm1d/2d/3d.
template <communicator C> std::optional<SyncBatchNorm> sync_version(const std::shared_ptr<::torch::nn::Module>& child, C& comm) {
  std::optional<SyncBatchNorm> sync;
  auto take = [&](auto* bn) {
    if (bn != nullptr) sync.emplace(*bn, comm);
  };
  take(dynamic_cast<::torch::nn::BatchNorm1dImpl*>(child.get()));
  take(dynamic_cast<::torch::nn::BatchNorm2dImpl*>(child.get()));
  take(dynamic_cast<::torch::nn::BatchNorm3dImpl*>(child.get()));
  return sync;
}
}  // namespace detail

// A copy of `model` with each of its BatchNorm1d/2d/3d layers replaced by a SyncBatchNorm of the
// same options and training mode, holding the same parameter and running-statistics tensors; the
// other layers shared with `model`: torch.nn.SyncBatchNorm.convert_sync_batchnorm for libtorch's
// Sequential. (A module of your own calls its layers through typed members, which cannot change
// type: declare those as herd::torch::SyncBatchNorm instead.)
template <communicator C> ::torch::nn::Sequential convert_sync_batchnorm(const ::torch::nn::Sequential& model, C& comm) {
  ::torch::nn::Sequential converted;
  converted->train(model->is_training());
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

#endif  // HERD_TORCH_SYNC_BATCH_NORM_HPP
