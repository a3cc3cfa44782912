#ifndef HERD_COLLECTIVES_REDUCE_HPP
#define HERD_COLLECTIVES_REDUCE_HPP
// herd::reduce: the root ends with the elementwise reduction of every rank's tensor (MPI_Reduce).
//
//   herd::reduce(grad, sum, comm);                                   // sum on rank 0
//   herd::reduce(grad, sum, comm, herd::reduce_op::avg, /*root=*/2);
//   herd::handle h = herd::reduce_async(grad, sum, comm);            // h.wait() finishes it
//
// The output is the root's only: the other ranks may pass any tensor, an empty one too; it is
// neither checked nor written. In place: the root passes the same tensor as input and output.
// avg is the sum divided by the ranks, as in allreduce. Host tensors only; on nccl_communicator it
// does not compile.
//
// It combines the ranks' values in the order herd's allreduce does, so the root gets the bits an
// allreduce would give it (except across several nodes, where allreduce is hierarchical): up to
// 8 KiB (16 KiB through shared memory) every rank's tensor goes up a binomial tree and the root
// combines them in rank order, as every rank does in the small allreduce; larger tensors are
// reduce-scattered as the allreduce's first half does (the ring, or the node's shared memory) and
// each rank's reduced chunk goes to the root.

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/host_only.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/rooted.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/collectives/detail/shm.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstring>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

struct reduce_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;  // the root's; empty elsewhere
  reduce_op op;
  int root = 0;

  op_label label() const { return tensor_label(op_kind::reduce, in); }
};

template <communicator C>
reduce_call prepare_reduce(call_check check, const_buffer_view in, buffer_view out, C& comm, reduce_op op, int root) {
  const bool at_root = comm.rank() == root;
  check.require_valid("input", in);
  check.require_root(root);
  check.require_op(in.type, op);
  if (at_root) {
    check.require_valid("output", out);
    check.require_same_dtype(in, out);
    check.require_count("output", out.count, in.count, "reduce writes as many elements as it reads");
    check.require_disjoint(in, out, out.data, "the same tensor as input and output (in place)");
  }
  require_host_tensor(check, "input", in, "reduce");
  if (at_root) require_host_tensor(check, "output", out, "reduce");
  return {std::move(check), in, out, op, root};
}

// Small: every rank's tensor up the tree, combined at the root in rank order.
template <communicator C>
void reduce_small(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count, int root) {
  const int p = comm.size();
  const std::size_t bytes = count * size_of(type);
  const std::vector<std::size_t> blocks(static_cast<std::size_t>(p), bytes);
  std::byte* gathered =
      comm.rank() == root ? scratch(bytes * static_cast<std::size_t>(p), scratch_slot::staging) : nullptr;
  tree_gather(comm, root, blocks, in, gathered);
  if (comm.rank() != root) return;
  // Rank q's tensor is block q - root of the gathered ones (relative order).
  combine_ranks(comm.options().reproducible, type, op, out, p,
                [&](int q) { return gathered + static_cast<std::size_t>(ring_mod(q - root, p)) * bytes; }, count);
}

// Large: a reduce-scatter, then every rank's chunk to the root.
template <communicator C>
void reduce_large(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count, int root) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  const bool at_root = comm.rank() == root;
  const std::size_t es = size_of(type);
  const chunk_layout chunks = chunk_layout::even(count, p);
  auto in_chunk = [&](int c) { return in + chunks.offset[static_cast<std::size_t>(c)] * es; };
  // This rank's reduced chunk: in place in the root's output, elsewhere in scratch memory.
  std::byte* mine = at_root ? out + chunks.offset[r] * es : scratch(chunks.length[r] * es, scratch_slot::kept);
  if (shm_node* node = shared_node_of(comm)) {
    shm_reduce_scatter(comm, *node, type, op, chunks, in_chunk, mine);
  } else if (reproducible_applies(comm.options().reproducible, type, op)) {
    reproducible_reduce_scatter(comm, type, op, chunks, in_chunk, mine);
  } else {
    // Partial results of one step are forwarded during the next, so two staging blocks alternate.
    std::byte* partial[2] = {scratch(chunks.longest() * es, scratch_slot::staging),
                             scratch(chunks.longest() * es, scratch_slot::alternate)};
    ring_reduce_scatter(comm, type, op, chunks, comm.options().ring_segment_bytes, in_chunk,
                        [&](int s, int) { return s == p - 2 ? mine : partial[s % 2]; });
  }
  std::vector<std::size_t> bytes(chunks.length.size());
  for (std::size_t c = 0; c < bytes.size(); ++c) bytes[c] = chunks.length[c] * es;
  direct_gather(comm, root, bytes, mine, [&](int c) { return out + chunks.offset[static_cast<std::size_t>(c)] * es; });
}

template <communicator C> void reduce_host(C& comm, const_buffer_view in, buffer_view out, reduce_op op, int root) {
  const auto* src = static_cast<const std::byte*>(in.data);
  auto* dst = static_cast<std::byte*>(out.data);
  if (in.count == 0) return;
  if (comm.size() == 1) {  // the reduction of one tensor, avg included, is the tensor
    if (dst != src) std::memcpy(dst, src, in.bytes());
    return;
  }
  if (in.bytes() <= one_shot_bytes(comm)) return reduce_small(comm, in.type, op, src, dst, in.count, root);
  reduce_large(comm, in.type, op, src, dst, in.count, root);
}

template <communicator C> void run_reduce(C& comm, const reduce_call& call) {
  const auto& [check, in, out, op, root] = call;
  signature mine;
  mine.type = in.type;
  mine.op = op;
  mine.count = in.count;
  mine.root = root;
  mine.memory = in.device.type;
  agree(comm, mine, check);
  reduce_host(comm, in, out, op, root);
}

template <class In, class Out, communicator C>
reduce_call reduce_call_of(const In& input, Out& output, C& comm, reduce_op op, int root) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::reduce, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = comm.rank() == root ? check.view("output", output) : buffer_view{};
  return prepare_reduce(std::move(check), in, out, comm, op, root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// On `root`, `output` (the input's dtype and size) receives the reduction over all ranks; elsewhere
// `output` is ignored. `input` is unchanged (unless it is the root's output).
template <class In, class Out, communicator C>
void reduce(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum, int root = 0) {
  const auto call = detail::reduce_call_of(input, output, comm, op, root);
  detail::run_collective(comm, call.label(), [&](bool) { detail::run_reduce(comm, call); });
}

// Starts the reduction; the handle finishes it (herd::handle).
template <class In, class Out, communicator C>
[[nodiscard]] handle reduce_async(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum, int root = 0) {
  auto call = detail::reduce_call_of(input, output, comm, op, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) { detail::run_reduce(comm, call); });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_REDUCE_HPP
