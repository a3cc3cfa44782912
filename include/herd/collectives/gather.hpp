#ifndef HERD_COLLECTIVES_GATHER_HPP
#define HERD_COLLECTIVES_GATHER_HPP
// herd::gather and herd::gatherv: the root ends with every rank's tensor, laid end to end in rank
// order (MPI_Gather, MPI_Gatherv).
//
//   herd::gather(mine, all, comm, /*root=*/0);      // on the root, all.size() == mine.size() * comm.size()
//   herd::gatherv(mine, all, counts, comm, 0);      // counts[i]: elements from rank i, the same list on every rank
//   herd::handle h = herd::gather_async(mine, all, comm, 0);   // h.wait() finishes it
//
// The output is the root's only: the other ranks may pass any tensor, an empty one too; it is
// neither checked nor written. In place: the root passes as input its own slot of the output
// (all.data() + root * n). Host tensors only; on nccl_communicator it does not compile.
//
// Up to 64 KiB in all, the blocks go up a binomial tree (ceil(log2 p) hops); larger ones go
// straight to the root (detail/rooted.hpp).

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/host_only.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/rooted.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstring>
#include <numeric>
#include <span>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

struct gather_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;  // the root's; empty elsewhere
  std::vector<std::size_t> counts;
  int root = 0;
  std::size_t total = 0;  // elements of the root's output

  op_label label() const { return tensor_label(check.kind(), in); }
};

// `kind`: gather (equal counts) or gatherv.
template <communicator C>
gather_call prepare_gatherv(call_check check, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts,
                            C& comm, int root) {
  const int r = comm.rank();
  const bool at_root = r == root;
  check.require_valid("input", in);
  check.require_root(root);
  if (at_root) {
    check.require_valid("output", out);
    check.require_same_dtype(in, out);
  }
  require_one_per_rank(check, "per-rank counts", counts, comm.size());
  std::size_t total = 0;
  std::size_t before = 0;
  if (check.ok()) {
    total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    before = std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
    check.require_count("input", in.count, counts[static_cast<std::size_t>(r)], "the count listed for this rank");
    if (at_root) check.require_count("output", out.count, total, "the sum of the per-rank counts");
  }
  if (at_root) {
    auto* base = static_cast<std::byte*>(out.data);
    check.require_disjoint(in, out, base == nullptr ? nullptr : base + before * size_of(in.type),
                           "this rank's own slot of the output (in place)");
  }
  require_host_tensor(check, "input", in, name(check.kind()));
  if (at_root) require_host_tensor(check, "output", out, name(check.kind()));
  gather_call call{std::move(check), in, out, {counts.begin(), counts.end()}, root};
  call.total = total;
  return call;
}

template <communicator C>
void gather_host(C& comm, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts, int root) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t es = size_of(in.type);
  std::vector<std::size_t> bytes(counts.size());
  std::vector<std::size_t> offset(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = counts[q] * es;
    offset[q + 1] = offset[q] + bytes[q];
  }
  const auto* mine = static_cast<const std::byte*>(in.data);
  auto* base = static_cast<std::byte*>(out.data);  // the root's
  const bool at_root = comm.rank() == root;
  if (offset.back() == 0) return;
  if (p > 1 && offset.back() <= rooted_tree_max_bytes) {
    std::byte* gathered = !at_root ? nullptr : root == 0 ? base : scratch(offset.back(), scratch_slot::staging);
    tree_gather(comm, root, bytes, mine, gathered);
    if (at_root && root != 0) rotate_blocks(bytes, root, gathered, base, true);
    return;
  }
  if (at_root && bytes[r] != 0 && mine != base + offset[r]) std::memcpy(base + offset[r], mine, bytes[r]);
  direct_gather(comm, root, bytes, mine, [&](int q) { return base + offset[static_cast<std::size_t>(q)]; });
}

template <communicator C> void run_gatherv(C& comm, const gather_call& call) {
  const auto& check = call.check;
  signature mine;
  mine.type = call.in.type;
  mine.count = check.kind() == op_kind::gather ? call.in.count : call.total;
  mine.layout = check.kind() == op_kind::gatherv ? hash_counts(call.counts) : 0;
  mine.root = call.root;
  mine.memory = call.in.device.type;
  agree(comm, mine, check);
  gather_host(comm, call.in, call.out, call.counts, call.root);
}

template <class In, class Out, communicator C> gather_call gather_call_of(const In& input, Out& output, C& comm, int root) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::gather, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = comm.rank() == root ? check.view("output", output) : buffer_view{};
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), in.count);
  if (comm.rank() == root) {
    check.require_count("output", out.count, in.count * counts.size(), "the input's elements times the ranks");
  }
  return prepare_gatherv(std::move(check), in, out, counts, comm, root);
}

template <class In, class Out, communicator C>
gather_call gatherv_call_of(const In& input, Out& output, std::span<const std::size_t> counts, C& comm, int root) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::gatherv, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = comm.rank() == root ? check.view("output", output) : buffer_view{};
  return prepare_gatherv(std::move(check), in, out, counts, comm, root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// On `root`, `output` (comm.size() times the input's elements) receives every rank's `input`, in
// rank order. Elsewhere `output` is ignored.
template <class In, class Out, communicator C> void gather(const In& input, Out& output, C& comm, int root = 0) {
  const auto call = detail::gather_call_of(input, output, comm, root);
  detail::run_collective(comm, call.label(), [&](bool) { detail::run_gatherv(comm, call); });
}

// Ranks contribute different counts; `counts` lists them and must be the same on every rank.
template <class In, class Out, communicator C>
void gatherv(const In& input, Out& output, std::span<const std::size_t> counts, C& comm, int root = 0) {
  const auto call = detail::gatherv_call_of(input, output, counts, comm, root);
  detail::run_collective(comm, call.label(), [&](bool) { detail::run_gatherv(comm, call); });
}

// Asynchronous forms: the operation starts, the handle finishes it (herd::handle).
template <class In, class Out, communicator C>
[[nodiscard]] handle gather_async(const In& input, Out& output, C& comm, int root = 0) {
  auto call = detail::gather_call_of(input, output, comm, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) { detail::run_gatherv(comm, call); });
}

template <class In, class Out, communicator C>
[[nodiscard]] handle gatherv_async(const In& input, Out& output, std::span<const std::size_t> counts, C& comm,
                                   int root = 0) {
  auto call = detail::gatherv_call_of(input, output, counts, comm, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) { detail::run_gatherv(comm, call); });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_GATHER_HPP
