#ifndef HERD_COLLECTIVES_REDUCE_SCATTER_HPP
#define HERD_COLLECTIVES_REDUCE_SCATTER_HPP
// herd::reduce_scatter: the input holds comm.size() equal blocks; rank i ends with block i of
// the reduction over all ranks (MPI_Reduce_scatter_block).
//
//   herd::reduce_scatter(grads, my_shard, comm, herd::reduce_op::avg);  // grads.size() == p * my_shard.size()
//   herd::handle h = herd::reduce_scatter_async(grads, my_shard, comm);  // h.wait() finishes it

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/reproducible.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/shm.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstring>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C> void reduce_scatter_host(C& comm, const_buffer_view in, buffer_view out, reduce_op op);

struct reduce_scatter_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;
  reduce_op op;

  op_label label() const { return tensor_label(op_kind::reduce_scatter, in); }
};

template <class In, class Out, communicator C>
reduce_scatter_call prepare_reduce_scatter(const In& input, Out& output, C& comm, reduce_op op) {
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::reduce_scatter, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  check.require_valid("input", in);
  check.require_valid("output", out);
  check.require_op(in.type, op);
  check.require_same_dtype(in, out);
  check.require_count("input", in.count, out.count * static_cast<std::size_t>(comm.size()),
                      "the output's elements times the ranks");
  check.require_disjoint(in, out, nullptr, nullptr);
  check.require_reachable("input", in, reaches(comm, in.device), unreachable_advice(comm, in.device));
  check.require_reachable("output", out, reaches(comm, out.device), unreachable_advice(comm, out.device));
  check.require_same_device(in, out);
  if constexpr (native_collectives<C>) require_native_op(check, in.type, op);
  require_reproducible_on_host(check, comm, in, op);
  return {std::move(check), in, out, op};
}

template <communicator C> void run_reduce_scatter(C& comm, const reduce_scatter_call& call, bool host_sync) {
  const auto& [check, in, out, op] = call;
  signature mine;
  mine.type = in.type;
  mine.op = op;
  mine.count = in.count;
  mine.memory = in.device.type;
  agree(comm, mine, check);
  if (out.count == 0) return;
  if constexpr (native_collectives<C>) {
    // The call's members, not the bindings: lambdas capture structured bindings from clang 16 on.
    native_reduction(comm, call.out, op, host_sync,
                     [&](reduce_op o) { comm.native_reduce_scatter(call.in, call.out, o); });
  } else {
    (void)host_sync;
#if HERD_WITH_CUDA_KERNELS
    if (in.device.is_cuda()) {
      return staged_reduce_scatter(comm, in, out, op);
    }
#endif
    reduce_scatter_host(comm, in, out, op);
  }
}

template <communicator C> void reduce_scatter_host(C& comm, const_buffer_view in, buffer_view out, reduce_op op) {
  const int p = comm.size();
  const std::size_t es = size_of(in.type);
  const auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  if (p == 1) {
    std::memcpy(dst, src, in.bytes());
    return;
  }
  const std::vector<std::size_t> counts(static_cast<std::size_t>(p), out.count);
  const chunk_layout chunks = chunk_layout::of_counts(counts);
  auto in_chunk = [&](int c) { return src + chunks.offset[static_cast<std::size_t>(c)] * es; };
  if (shm_node* node = shared_node_of(comm)) {
    return shm_reduce_scatter(comm, *node, in.type, op, chunks, in_chunk, dst);
  }
  if (reproducible_applies(comm.options().reproducible, in.type, op)) {
    return reproducible_reduce_scatter(comm, in.type, op, chunks, in_chunk, dst);
  }
  // Partial results of one step are forwarded during the next, so two staging blocks alternate.
  std::byte* partial[2] = {scratch(out.bytes(), scratch_slot::staging),
                           scratch(out.bytes(), scratch_slot::alternate)};
  ring_reduce_scatter(
      comm, in.type, op, chunks, comm.options().ring_segment_bytes,
      in_chunk, [&](int s, int) { return s == p - 2 ? dst : partial[s % 2]; });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

template <class In, class Out, communicator C>
void reduce_scatter(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum) {
  const auto call = detail::prepare_reduce_scatter(input, output, comm, op);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_reduce_scatter(comm, call, sync); });
}

// Starts the reduce-scatter; the handle finishes it (herd::handle).
template <class In, class Out, communicator C>
[[nodiscard]] handle reduce_scatter_async(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum) {
  auto call = detail::prepare_reduce_scatter(input, output, comm, op);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_reduce_scatter(comm, call, sync);
  });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_REDUCE_SCATTER_HPP
