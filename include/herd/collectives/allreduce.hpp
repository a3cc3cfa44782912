#pragma once
// herd::allreduce: every rank ends with the elementwise reduction of every rank's tensor,
// bitwise identical on all of them.
//
//   herd::allreduce(grad, comm);                          // in place, sum
//   herd::allreduce(grad, comm, herd::reduce_op::avg);
//   herd::allreduce(input, output, comm, herd::reduce_op::max);   // out of place
//
// Host tensors up to 8 KiB travel with the ranks' argument check (collectives/detail/agreement.hpp)
// and every rank combines them itself, in rank order; larger ones take the ring
// (collectives/detail/ring.hpp): reduce-scatter, then allgather, pipelined. GPU tensors take NCCL
// on an nccl_communicator, or herd's staged ring with its kernels over MPI (detail/dispatch.hpp).

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/runtime/env.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstring>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C>
void ring_allreduce(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count) {
  const int p = comm.size();
  const std::size_t es = size_of(type);
  if (p == 1) {  // the reduction of one tensor, avg included, is the tensor
    if (out != in) std::memcpy(out, in, count * es);
    return;
  }
  const chunk_layout chunks = chunk_layout::even(count, p);
  const std::size_t segment_bytes = runtime::defaults().ring_segment_bytes;
  ring_reduce_scatter(
      comm, type, op, chunks, segment_bytes,
      [&](int c) { return in + chunks.offset[static_cast<std::size_t>(c)] * es; },
      [&](int, int c) { return out + chunks.offset[static_cast<std::size_t>(c)] * es; });
  ring_allgather(comm, out, es, chunks, segment_bytes);
}

template <communicator C> void allreduce(call_check& check, const_buffer_view in, buffer_view out, C& comm, reduce_op op) {
  check.require_valid("input", in);
  check.require_valid("output", out);
  check.require_op(in.type, op);
  check.require_same_dtype(in, out);
  check.require_count("output", out.count, in.count, "allreduce writes as many elements as it reads");
  check.require_disjoint(in, out, out.data, "the same tensor as input and output (in place)");
  check.require_reachable("input", in, reaches(comm, in.device), unreachable_advice(comm, in.device));
  check.require_reachable("output", out, reaches(comm, out.device), unreachable_advice(comm, out.device));
  check.require_same_device(in, out);
  if constexpr (native_collectives<C>) require_native_op(check, in.type, op);
  signature mine;
  mine.kind = collective_kind::allreduce;
  mine.type = in.type;
  mine.op = op;
  mine.count = in.count;
  mine.memory = in.device.type;
  const std::size_t bytes = in.bytes();
  const int p = comm.size();
  if (!native_collectives<C> && p > 1 && bytes <= payload_max_bytes && in.device.is_cpu()) {
    // Small: the data travels with the signatures. Every rank then holds every rank's tensor and
    // combines them in rank order, so all compute the same bits in one exchange of ceil(log2 p) rounds.
    const exchanged all = agree(comm, mine, check, true, in.data, bytes);
    if (in.count == 0) return;
    const int avg_ranks = op == reduce_op::avg ? p : 0;
    host_reduce(in.type, op, out.data, all.payload(0), all.payload(1), in.count, p == 2 ? avg_ranks : 0);
    for (int r = 2; r < p; ++r) {
      host_reduce(in.type, op, out.data, out.data, all.payload(r), in.count, r == p - 1 ? avg_ranks : 0);
    }
    return;
  }
  agree(comm, mine, check);
  if (in.count == 0) return;
  if constexpr (native_collectives<C>) {
    native_reduction(comm, out, op, [&](reduce_op o) { comm.native_allreduce(in, out, o); });
  } else {
#if HERD_WITH_CUDA_KERNELS
    if (in.device.is_cuda()) return staged_allreduce(comm, in.type, op, in.data, out.data, in.count, in.device.index);
#endif
    ring_allreduce(comm, in.type, op, static_cast<const std::byte*>(in.data), static_cast<std::byte*>(out.data),
                   in.count);
  }
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// In place: `tensor` ends as the reduction over all ranks.
template <class T, communicator C> void allreduce(T& tensor, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_writable_tensor<T>();
  detail::call_check check(detail::collective_kind::allreduce, comm.rank(), comm.size());
  const buffer_view v = check.view("input", tensor);
  detail::allreduce(check, v, v, comm, op);
}

// Out of place: `output` (same dtype and size as `input`) receives the reduction; `input` is unchanged.
template <class In, class Out, communicator C>
void allreduce(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_tensor<In>();
  detail::require_writable_tensor<Out>();
  detail::call_check check(detail::collective_kind::allreduce, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  detail::allreduce(check, in, out, comm, op);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd
