#ifndef HERD_OPTIM_DETAIL_STEP_FUSION_HPP
#define HERD_OPTIM_DETAIL_STEP_FUSION_HPP
// Step-time fusion: the reducer's "all ready at once" mode (detail/reducer.hpp), rather than every
// gradient marked at synchronize(). It groups the gradients in their own order into fusion buffers
// of fusion_threshold_bytes (128 MiB), not into 1 MiB/25 MiB buckets in reverse order, so its
// allreduces have other sizes (an allreduce picks its algorithm, and so its order of summation, by
// size), and it reduces one buffer at a time on the caller's thread, without the hand-over to the
// progress thread. Reducing it in buckets would change its results and its speed.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/gradient_movers.hpp>
#include <herd/optim/detail/reduction_policy.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// When every rank shares a node (mpi_communicator's shared memory), the group goes into shared
// memory and back straight from and into the gradients: no fusion buffer, no packing copies.
// False (nothing done) where that does not apply.
template <communicator C>
bool reduced_in_shared_memory(C& comm, const reduction_policy& policy, const std::vector<buffer_view>& grads,
                              const std::vector<std::size_t>& bucket) {
  std::vector<buffer_view> parts;
  parts.reserve(bucket.size());
  for (std::size_t i : bucket) parts.push_back(grads[i]);
  const reduce_op op = policy.wire_op(parts.front().type);
  if (!reduces_in_shared_memory(comm, parts)) return false;
  allreduce_in_shared_memory(comm, parts, op);
  return true;
}

// One fusion buffer: packed (unless a lone gradient reduces in place), reduced, unpacked.
template <communicator C, class Mover>
void reduce_fused(C& comm, const reduction_policy& policy, std::uint32_t track, const std::vector<buffer_view>& grads,
                  const std::vector<std::size_t>& bucket, dtype wire, Mover& mover) {
  const buffer_view& lone = grads[bucket.front()];
  if (bucket.size() == 1 && policy.as_is(lone.type)) {
    buffer_view in_place = lone;
    herd::allreduce(in_place, comm, policy.wire_op(lone.type));
    return;
  }
  if (policy.as_is(lone.type) && reduced_in_shared_memory(comm, policy, grads, bucket)) {
    return;
  }
  std::size_t total = 0;
  for (std::size_t i : bucket) total += grads[i].count;
  buffer_view packed = mover.fusion(wire, total);
  auto* base = static_cast<std::byte*>(packed.data);
  std::vector<move_item> pack;
  std::vector<move_item> unpack;
  std::size_t at = 0;
  for (std::size_t i : bucket) {
    pack.push_back({grads[i].data, base + at * size_of(wire), grads[i].count});
    unpack.push_back({base + at * size_of(wire), grads[i].data, grads[i].count});
    at += grads[i].count;
  }
  {
    const trace::span phase(track, "pack", trace::fields::elements(total, wire));
    mover.begin();
    policy.pack(mover, pack, wire, lone.type);
    mover.finish();
  }
  herd::allreduce(packed, comm, policy.wire_op(lone.type));
  const trace::span phase(track, "unpack", trace::fields::elements(total, wire));
  mover.begin();
  policy.unpack(mover, unpack, lone.type, wire);
  mover.finish();
}

// Groups the gradients by dtype (in order of first appearance), packs each group into buffers
// of up to `threshold` bytes, and reduces each buffer with one allreduce.
template <communicator C, class Mover>
void fuse(C& comm, const reduction_policy& policy, std::size_t threshold, std::uint32_t track,
          const std::vector<buffer_view>& grads, Mover& mover) {
  std::vector<bool> done(grads.size(), false);
  for (std::size_t first = 0; first < grads.size(); ++first) {
    if (done[first]) continue;
    const dtype type = grads[first].type;
    const dtype wire = policy.wire(type);
    std::vector<std::size_t> bucket;
    std::size_t bucket_bytes = 0;
    for (std::size_t i = first; i < grads.size(); ++i) {
      if (done[i] || grads[i].type != type) continue;
      done[i] = true;
      const std::size_t bytes = grads[i].count * size_of(wire);
      if (!bucket.empty() && bucket_bytes + bytes > threshold) {
        reduce_fused(comm, policy, track, grads, bucket, wire, mover);
        bucket.clear();
        bucket_bytes = 0;
      }
      bucket.push_back(i);
      bucket_bytes += bytes;
    }
    if (!bucket.empty()) reduce_fused(comm, policy, track, grads, bucket, wire, mover);
  }
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_STEP_FUSION_HPP
