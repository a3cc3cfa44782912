#ifndef HERD_COLLECTIVES_SCATTER_HPP
#define HERD_COLLECTIVES_SCATTER_HPP
// herd::scatter and herd::scatterv: the root's tensor holds one block per rank, in rank order;
// rank i ends with block i (MPI_Scatter, MPI_Scatterv).
//
//   herd::scatter(all, mine, comm, /*root=*/0);     // on the root, all.size() == mine.size() * comm.size()
//   herd::scatterv(all, mine, counts, comm, 0);     // counts[i]: elements for rank i, the same list on every rank
//   herd::handle h = herd::scatter_async(all, mine, comm, 0);   // h.wait() finishes it
//
// The input is the root's only: the other ranks may pass any tensor, an empty one too; it is
// neither checked nor read. In place: the root passes as output its own slot of the input
// (all.data() + root * n). Host tensors only; on nccl_communicator it does not compile.
//
// Up to 64 KiB in all, the blocks go down a binomial tree (ceil(log2 p) hops); larger ones go
// straight from the root (detail/rooted.hpp).

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

struct scatter_call {
  call_check check;
  const_buffer_view in;  // the root's; empty elsewhere
  buffer_view out;
  std::vector<std::size_t> counts;
  int root = 0;
  std::size_t total = 0;  // elements of the root's input

  op_label label() const { return tensor_label(check.kind(), const_buffer_view(out)); }
};

// `kind`: scatter (equal counts) or scatterv.
template <communicator C>
scatter_call prepare_scatterv(call_check check, const_buffer_view in, buffer_view out,
                              std::span<const std::size_t> counts, C& comm, int root) {
  const int r = comm.rank();
  const bool at_root = r == root;
  check.require_valid("output", out);
  check.require_root(root);
  if (at_root) {
    check.require_valid("input", in);
    check.require_same_dtype(in, out);
  }
  require_one_per_rank(check, "per-rank counts", counts, comm.size());
  std::size_t total = 0;
  std::size_t before = 0;
  if (check.ok()) {
    total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    before = std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0});
    check.require_count("output", out.count, counts[static_cast<std::size_t>(r)], "the count listed for this rank");
    if (at_root) check.require_count("input", in.count, total, "the sum of the per-rank counts");
  }
  if (at_root) {
    const auto* base = static_cast<const std::byte*>(in.data);
    check.require_disjoint(out, in, base == nullptr ? nullptr : base + before * size_of(out.type),
                           "this rank's own slot of the input (in place)");
  }
  if (at_root) require_host_tensor(check, "input", in, name(check.kind()));
  require_host_tensor(check, "output", out, name(check.kind()));
  scatter_call call{std::move(check), in, out, {counts.begin(), counts.end()}, root};
  call.total = total;
  return call;
}

template <communicator C>
void scatter_host(C& comm, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts, int root) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t es = size_of(out.type);
  std::vector<std::size_t> bytes(counts.size());
  std::vector<std::size_t> offset(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) {
    bytes[q] = counts[q] * es;
    offset[q + 1] = offset[q] + bytes[q];
  }
  const auto* base = static_cast<const std::byte*>(in.data);  // the root's
  auto* mine = static_cast<std::byte*>(out.data);
  const bool at_root = comm.rank() == root;
  if (offset.back() == 0) return;
  if (p > 1 && offset.back() <= rooted_tree_max_bytes) {
    const std::byte* scattered = base;
    if (at_root && root != 0) {
      std::byte* relative = scratch(offset.back(), scratch_slot::staging);
      rotate_blocks(bytes, root, base, relative, false);
      scattered = relative;
    }
    tree_scatter(comm, root, bytes, at_root ? scattered : nullptr, mine);
    return;
  }
  if (at_root && bytes[r] != 0 && mine != base + offset[r]) std::memcpy(mine, base + offset[r], bytes[r]);
  direct_scatter(comm, root, bytes, mine, [&](int q) { return base + offset[static_cast<std::size_t>(q)]; });
}

template <communicator C> void run_scatterv(C& comm, const scatter_call& call) {
  const auto& check = call.check;
  signature mine;
  mine.type = call.out.type;
  mine.count = check.kind() == op_kind::scatter ? call.out.count : call.total;
  mine.layout = check.kind() == op_kind::scatterv ? hash_counts(call.counts) : 0;
  mine.root = call.root;
  mine.memory = call.out.device.type;
  agree(comm, mine, check);
  scatter_host(comm, call.in, call.out, call.counts, call.root);
}

template <class In, class Out, communicator C>
scatter_call scatter_call_of(const In& input, Out& output, C& comm, int root) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::scatter, comm.rank(), comm.size());
  const const_buffer_view in = comm.rank() == root ? check.const_view("input", input) : const_buffer_view{};
  const buffer_view out = check.view("output", output);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), out.count);
  if (comm.rank() == root) {
    check.require_count("input", in.count, out.count * counts.size(), "the output's elements times the ranks");
  }
  return prepare_scatterv(std::move(check), in, out, counts, comm, root);
}

template <class In, class Out, communicator C>
scatter_call scatterv_call_of(const In& input, Out& output, std::span<const std::size_t> counts, C& comm, int root) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::scatterv, comm.rank(), comm.size());
  const const_buffer_view in = comm.rank() == root ? check.const_view("input", input) : const_buffer_view{};
  const buffer_view out = check.view("output", output);
  return prepare_scatterv(std::move(check), in, out, counts, comm, root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// Rank i's `output` receives block i of the root's `input` (comm.size() blocks of the output's
// size). Elsewhere than on the root `input` is ignored.
template <class In, class Out, communicator C> void scatter(const In& input, Out& output, C& comm, int root = 0) {
  const auto call = detail::scatter_call_of(input, output, comm, root);
  detail::run_collective(comm, call.label(), [&](bool) { detail::run_scatterv(comm, call); });
}

// Blocks of different counts; `counts` lists them and must be the same on every rank.
template <class In, class Out, communicator C>
void scatterv(const In& input, Out& output, std::span<const std::size_t> counts, C& comm, int root = 0) {
  const auto call = detail::scatterv_call_of(input, output, counts, comm, root);
  detail::run_collective(comm, call.label(), [&](bool) { detail::run_scatterv(comm, call); });
}

// Asynchronous forms: the operation starts, the handle finishes it (herd::handle).
template <class In, class Out, communicator C>
[[nodiscard]] handle scatter_async(const In& input, Out& output, C& comm, int root = 0) {
  auto call = detail::scatter_call_of(input, output, comm, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) { detail::run_scatterv(comm, call); });
}

template <class In, class Out, communicator C>
[[nodiscard]] handle scatterv_async(const In& input, Out& output, std::span<const std::size_t> counts, C& comm,
                                    int root = 0) {
  auto call = detail::scatterv_call_of(input, output, counts, comm, root);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) { detail::run_scatterv(comm, call); });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_SCATTER_HPP
