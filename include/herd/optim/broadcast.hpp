#pragma once
// Making every rank start from the same state, as Horovod's broadcast_parameters,
// broadcast_optimizer_state and broadcast_object do.
//
//   herd::broadcast_parameters(herd::views(w, b), comm, 0);   // before the first step
//   herd::broadcast_optimizer_state(sgd, comm, 0);             // after loading a checkpoint on rank 0
//   herd::broadcast_object(epoch, comm, 0);                    // trivially copyable values, strings, vectors of them
//
// Each checks first that every rank holds the same list of tensors (count, sizes, dtypes).
// Host values (broadcast_object) travel over the communicator's control channel, so all of these
// work on an nccl_communicator too.

#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C> void broadcast_parameters(const std::vector<buffer_view>& params, C& comm, int root = 0) {
  detail::require_same_tensors(params, comm, "broadcast_parameters", "parameter");
  for (buffer_view p : params) broadcast(p, comm, root);
}

template <class Optimizer, communicator C> void broadcast_optimizer_state(Optimizer& opt, C& comm, int root = 0) {
  std::vector<buffer_view> state;
  visit_optimizer_state(opt, [&](const auto&, buffer_view v) { state.push_back(v); });
  detail::require_same_tensors(state, comm, "broadcast_optimizer_state", "optimizer state tensor");
  for (buffer_view s : state) broadcast(s, comm, root);
}

template <class T, communicator C>
  requires std::is_trivially_copyable_v<T>
void broadcast_object(T& value, C& comm, int root = 0) {
  buffer_view bytes{&value, sizeof(T), dtype::u8, device::cpu()};
  broadcast(bytes, detail::control_of(comm), root);  // host memory: over the control channel
}

template <communicator C> void broadcast_object(std::string& text, C& comm, int root = 0) {
  auto length = static_cast<std::int64_t>(text.size());
  broadcast_object(length, comm, root);
  text.resize(static_cast<std::size_t>(length));
  buffer_view bytes{text.data(), text.size(), dtype::u8, device::cpu()};
  broadcast(bytes, detail::control_of(comm), root);
}

template <class T, class Allocator, communicator C>
  requires std::is_trivially_copyable_v<T>
void broadcast_object(std::vector<T, Allocator>& values, C& comm, int root = 0) {
  auto length = static_cast<std::int64_t>(values.size());
  broadcast_object(length, comm, root);
  values.resize(static_cast<std::size_t>(length));
  buffer_view bytes{values.data(), values.size() * sizeof(T), dtype::u8, device::cpu()};
  broadcast(bytes, detail::control_of(comm), root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd
