#ifndef HERD_TORCH_GRADIENTS_HPP
#define HERD_TORCH_GRADIENTS_HPP
// The gradients of a libtorch optimizer's parameters as herd reduces them: hand them to
// herd::distributed_optimizer. Opt-in: include it after <torch/torch.h>.
//
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
//   herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm);
//   for (auto& batch : loader) { sgd.zero_grad(); loss(batch).backward(); opt.step(); }

#include <herd/tensor/buffer_view.hpp>
#include <herd/torch/detail/device_arithmetic.hpp>
#include <herd/torch/detail/missing_gradient.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <vector>

namespace herd {

// The gradients of every parameter of `opt`, read afresh at each call: libtorch may replace a
// gradient tensor between steps (zero_grad with set_to_none). A parameter that got no gradient
// (unused in this forward pass) gets zeros, so that every rank reduces the same list. CUDA
// gradients are packed by herd's kernels under nvcc, by libtorch's in a host-compiled file
// (link herd::nccl and reduce over a nccl_communicator): no copy through host memory.
inline std::function<std::vector<buffer_view>()> torch_gradients(::torch::optim::Optimizer& opt) {
  detail::lend_torch_device_arithmetic();
  return [&opt] {
    std::vector<buffer_view> views;
    for (auto& group : opt.param_groups()) {
      for (auto& p : group.params()) {
        detail::fill_missing_gradient(p);
        views.push_back(view_of(p.mutable_grad()));
      }
    }
    return views;
  };
}

}  // namespace herd

#endif  // HERD_TORCH_GRADIENTS_HPP
