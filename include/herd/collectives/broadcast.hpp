#ifndef HERD_COLLECTIVES_BROADCAST_HPP
#define HERD_COLLECTIVES_BROADCAST_HPP
// herd::broadcast: every rank ends with the root's tensor.
//
//   herd::broadcast(weights, comm, /*root=*/0);
//   herd::handle h = herd::broadcast_async(weights, comm, 0);   // h.wait() finishes it
//
// Small tensors go down a binomial tree (ceil(log2 p) hops); large ones along a pipelined chain
// root -> root+1 -> ..., segment by segment, so each link carries the tensor once and all links
// are busy at the same time. Ranks of one node read the root's slices out of its shared memory.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/shm.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <deque>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

inline constexpr std::size_t broadcast_tree_max_bytes = std::size_t{64} << 10;

template <communicator C> void broadcast_tree(C& comm, std::byte* data, std::size_t bytes, int root) {
  const int p = comm.size();
  const int q = ring_mod(comm.rank() - root, p);  // rank relative to the root
  const int tag = comm.operations().data_tag();
  int mask = 1;
  while (mask < p) {
    if (q & mask) {
      auto r = comm.irecv(data, bytes, ring_mod(q - mask + root, p), tag);
      comm.wait(r);
      break;
    }
    mask <<= 1;
  }
  std::vector<typename C::request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (q + mask < p) sends.push_back(comm.isend(data, bytes, ring_mod(q + mask + root, p), tag));
  }
  for (auto& s : sends) comm.wait(s);
}

template <communicator C>
void broadcast_chain(C& comm, std::byte* data, std::size_t bytes, int root, std::size_t segment_bytes) {
  const int p = comm.size();
  const int q = ring_mod(comm.rank() - root, p);
  const int tag = comm.operations().data_tag();
  const std::size_t segments = (bytes + segment_bytes - 1) / segment_bytes;
  auto segment = [&](std::size_t k) {
    return std::pair<std::byte*, std::size_t>(data + k * segment_bytes, std::min(segment_bytes, bytes - k * segment_bytes));
  };
  const int previous = ring_mod(comm.rank() - 1, p);
  const int next = ring_mod(comm.rank() + 1, p);
  std::deque<typename C::request> receives;
  std::deque<typename C::request> sends;
  std::size_t posted = 0;
  auto post_receives = [&] {
    for (; q > 0 && posted < segments && receives.size() < ring_window; ++posted) {
      const auto [at, n] = segment(posted);
      receives.push_back(comm.irecv(at, n, previous, tag));
    }
  };
  post_receives();
  for (std::size_t k = 0; k < segments; ++k) {
    if (q > 0) {
      comm.wait(receives.front());
      receives.pop_front();
      post_receives();
    }
    if (q < p - 1) {
      if (sends.size() == ring_window) {
        comm.wait(sends.front());
        sends.pop_front();
      }
      const auto [at, n] = segment(k);
      sends.push_back(comm.isend(at, n, next, tag));
    }
  }
  for (auto& s : sends) comm.wait(s);
}

template <communicator C> void broadcast_host(C& comm, buffer_view v, int root);

struct broadcast_call {
  call_check check;
  buffer_view v;
  int root;

  op_label label() const { return tensor_label(op_kind::broadcast, v); }
};

template <communicator C> broadcast_call prepare_broadcast(call_check check, buffer_view v, C& comm, int root) {
  check.require_valid("input", v);
  check.require_root(root);
  check.require_reachable("input", v, reaches(comm, v.device), unreachable_advice(comm, v.device));
  return {std::move(check), v, root};
}

template <communicator C> void run_broadcast(C& comm, const broadcast_call& call, bool host_sync) {
  const auto& [check, v, root] = call;
  signature mine;
  mine.type = v.type;
  mine.count = v.count;
  mine.root = root;
  mine.memory = v.device.type;
  agree(comm, mine, check);
  if (v.bytes() == 0 || comm.size() == 1) return;
  if constexpr (native_collectives<C>) {
    comm.native_broadcast(v, root);
    if (host_sync) comm.synchronize();
    return;
  } else {
    (void)host_sync;
#if HERD_WITH_CUDA_KERNELS
    if (v.device.is_cuda()) {
      return staged_broadcast(comm, v, root);
    }
#endif
    broadcast_host(comm, v, root);
  }
}

template <communicator C> void broadcast_host(C& comm, buffer_view v, int root) {
  const std::size_t bytes = v.bytes();
  auto* data = static_cast<std::byte*>(v.data);
  if (shm_node* node = shared_node_of(comm)) return shm_broadcast(comm, *node, data, bytes, root);
  if (bytes <= broadcast_tree_max_bytes) {
    broadcast_tree(comm, data, bytes, root);
  } else {
    broadcast_chain(comm, data, bytes, root, comm.options().ring_segment_bytes);
  }
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// `tensor` on every rank ends equal to `tensor` on `root`.
template <class T, communicator C> void broadcast(T& tensor, C& comm, int root = 0) {
  detail::require_writable_tensor<T>();
  detail::call_check check(detail::op_kind::broadcast, comm.rank(), comm.size());
  const buffer_view v = check.view("input", tensor);
  const auto call = detail::prepare_broadcast(std::move(check), v, comm, root);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_broadcast(comm, call, sync); });
}

// Starts the broadcast; the handle finishes it (herd::handle).
template <class T, communicator C> [[nodiscard]] handle broadcast_async(T& tensor, C& comm, int root = 0) {
  detail::require_writable_tensor<T>();
  detail::call_check check(detail::op_kind::broadcast, comm.rank(), comm.size());
  const buffer_view v = check.view("input", tensor);
  auto call = detail::prepare_broadcast(std::move(check), v, comm, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_broadcast(comm, call, sync);
  });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_BROADCAST_HPP
