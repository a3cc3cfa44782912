#ifndef HERD_OPTIM_BROADCAST_HPP
#define HERD_OPTIM_BROADCAST_HPP
// Making every rank start from the same state, as Horovod's broadcast_parameters,
// broadcast_optimizer_state and broadcast_object do.
//
//   herd::broadcast_parameters(herd::views(w, b), comm, 0);   // before the first step (or a herd::parameters)
//   herd::broadcast_optimizer_state(sgd, comm, 0);             // after loading a checkpoint on rank 0
//   herd::broadcast_object(epoch, comm, 0);                    // collectives/object.hpp: values, strings, vectors
//
// Each checks first that every rank holds the same list of tensors (count, sizes, dtypes).

#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/object.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN
// broadcast_parameters' check and broadcasts; `local_fault`: what this rank found wrong with its
// tensors before (an adapter's refusal), raised on every rank in that check.
template <communicator C>
void broadcast_tensors(const std::vector<buffer_view>& params, C& comm, int root, const std::string& local_fault = {}) {
  require_same_tensors(params, comm, "broadcast_parameters", "parameter", local_fault);
  for (buffer_view p : params) herd::broadcast(p, comm, root);
}
HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C> void broadcast_parameters(const std::vector<buffer_view>& params, C& comm, int root = 0) {
  detail::broadcast_tensors(params, comm, root);
}

// The values of a parameters list (its gradients stay as they are).
template <communicator C> void broadcast_parameters(const parameters& params, C& comm, int root = 0) {
  broadcast_parameters(params.values, comm, root);
}

template <class Optimizer, communicator C> void broadcast_optimizer_state(Optimizer& opt, C& comm, int root = 0) {
  std::vector<buffer_view> state;
  visit_optimizer_state(opt, [&](const auto&, buffer_view v) { state.push_back(v); });
  detail::require_same_tensors(state, comm, "broadcast_optimizer_state", "optimizer state tensor");
  for (buffer_view s : state) broadcast(s, comm, root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_OPTIM_BROADCAST_HPP
