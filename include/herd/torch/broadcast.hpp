#ifndef HERD_TORCH_BROADCAST_HPP
#define HERD_TORCH_BROADCAST_HPP
// Every rank starts from the same model and optimizer, as Horovod's broadcast_parameters and
// broadcast_optimizer_state for PyTorch. Opt-in: include it after <torch/torch.h>.
//
//   herd::broadcast_parameters(*model, comm, 0);     // parameters and buffers
//   herd::broadcast_optimizer_state(sgd, comm, 0);   // after loading a checkpoint on rank 0

#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/object.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/broadcast.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/torch/detail/layout.hpp>
#include <herd/torch/detail/optimizer_state.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <cstdint>
#include <type_traits>
#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// The parameters of `module` (and its submodules) and, with `buffers`, its buffers end equal to the
// root's, element by element, whatever each rank's memory layout (channels_last, say). The DDP
// wrapper's sync_module_states leaves the buffers out where broadcast_buffers is off.
// A tensor refused on one rank (a dtype herd has not) is raised on every rank, in the check of the
// tensors that comes first, instead of leaving the others waiting there.
template <communicator C> void broadcast_module(::torch::nn::Module& module, C& comm, int root, bool buffers) {
  row_major_views staged;
  for (auto& p : module.parameters()) staged.add_or_keep_fault(p);
  if (buffers) {
    for (auto& b : module.buffers()) staged.add_or_keep_fault(b);
  }
  broadcast_tensors(staged.views(), comm, root, staged.fault());
  staged.write_back();
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// Every parameter and buffer of `module` (and its submodules) ends equal to the root's, element by
// element, whatever each rank's memory layout (channels_last, say).
template <communicator C> void broadcast_parameters(::torch::nn::Module& module, C& comm, int root = 0) {
  detail::broadcast_module(module, comm, root, true);
}

// Every hyperparameter of every parameter group (all of SGD's, Adam's and AdamW's options; the
// learning rate of another optimizer's) and the state of every parameter (momentum buffers for
// SGD; step, moments for Adam and AdamW) end equal to the root's. Ranks whose
// optimizer has not stepped yet get their state created first, as zeros: the state a first step
// starts from (for SGD with dampening, a fresh libtorch SGD would instead copy the first gradient).
template <class Optimizer, communicator C>
  requires std::derived_from<Optimizer, ::torch::optim::Optimizer>
void broadcast_optimizer_state(Optimizer& opt, C& comm, int root = 0) {
  std::vector<std::int64_t*> steps;
  std::vector<at::Tensor*> tensors;
  // What this rank cannot read (an optimizer herd does not know, a tensor it refuses) is raised on
  // every rank, in the check of the tensors that comes first.
  std::string fault;
  try {
    detail::torch_state(opt, steps, tensors);
  } catch (const std::exception& e) {
    fault = e.what();
  }
  detail::row_major_views staged;  // a channels_last parameter's momentum is channels_last
  for (at::Tensor* t : tensors) staged.add_or_keep_fault(*t);
  if (fault.empty()) fault = staged.fault();
  const std::vector<buffer_view>& views = staged.views();
  detail::require_same_tensors(views, comm, "broadcast_optimizer_state", "optimizer state tensor", fault);
  std::vector<double> scalars;
  for (auto& group : opt.param_groups()) {
    detail::visit_hyperparameters(opt, group, [&](auto& value) { scalars.push_back(static_cast<double>(value)); });
  }
  for (std::int64_t* s : steps) scalars.push_back(static_cast<double>(*s));
  broadcast_object(scalars, comm, root);
  std::size_t at = 0;
  for (auto& group : opt.param_groups()) {
    detail::visit_hyperparameters(opt, group, [&](auto& value) {
      value = static_cast<std::remove_reference_t<decltype(value)>>(scalars[at++]);
    });
  }
  for (std::int64_t* s : steps) *s = static_cast<std::int64_t>(scalars[at++]);
  for (buffer_view v : views) broadcast(v, comm, root);
  staged.write_back();
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_TORCH_BROADCAST_HPP
