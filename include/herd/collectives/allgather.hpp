#ifndef HERD_COLLECTIVES_ALLGATHER_HPP
#define HERD_COLLECTIVES_ALLGATHER_HPP
// herd::allgather and herd::allgatherv: every rank ends with every rank's tensor, laid end to end
// in rank order.
//
//   herd::allgather(mine, all, comm);          // all.size() == mine.size() * comm.size()
//   herd::allgatherv(mine, all, counts, comm); // counts[i]: elements from rank i, the same list on every rank
//   auto counts = herd::allgatherv(mine, all_vector, comm);  // learns the counts and resizes the vector
//   herd::handle h = herd::allgather_async(mine, all, comm);  // h.wait() finishes it
//
// In place: pass as input the output's own slot of this rank (all.data() + rank * n).

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/shm.hpp>
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

template <communicator C>
void allgather_host(C& comm, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts, std::size_t before);

struct allgather_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;
  std::vector<std::size_t> counts;
  std::size_t total = 0;   // elements of the output
  std::size_t before = 0;  // elements before this rank's slot

  op_label label() const { return tensor_label(check.kind(), const_buffer_view(out)); }
};

// `kind`: allgather (equal counts) or allgatherv.
template <communicator C>
allgather_call prepare_allgatherv(call_check check, const_buffer_view in, buffer_view out,
                                  std::span<const std::size_t> counts, C& comm) {
  const int p = comm.size();
  const int r = comm.rank();
  check.require_valid("input", in);
  check.require_valid("output", out);
  check.require_same_dtype(in, out);
  if (check.ok() && counts.size() != static_cast<std::size_t>(p)) {
    check.fail(7, "the list of per-rank counts has " + std::to_string(counts.size()) + " entries for " +
                      std::to_string(p) + " ranks",
               "Pass one count per rank");
  }
  const std::size_t total = check.ok() ? std::accumulate(counts.begin(), counts.end(), std::size_t{0}) : 0;
  if (check.ok()) {
    check.require_count("input", in.count, counts[static_cast<std::size_t>(r)], "the count listed for this rank");
    check.require_count("output", out.count, total, "the sum of the per-rank counts");
  }
  const std::size_t es = is_valid(in.type) ? size_of(in.type) : 1;
  const std::size_t before = check.ok() ? std::accumulate(counts.begin(), counts.begin() + r, std::size_t{0}) : 0;
  auto* base = static_cast<std::byte*>(out.data);
  check.require_disjoint(in, out, base == nullptr ? nullptr : base + before * es,
                         "this rank's own slot of the output (in place)");
  check.require_reachable("input", in, reaches(comm, in.device), unreachable_advice(comm, in.device));
  check.require_reachable("output", out, reaches(comm, out.device), unreachable_advice(comm, out.device));
  check.require_same_device(in, out);
  if constexpr (native_collectives<C>) {
    if (check.ok() && check.kind() == op_kind::allgatherv && p > 1) {
      for (std::size_t c : counts) {
        if (c != counts[0]) {
          check.fail(12, "NCCL's allgather takes equal counts only", "Pad to equal counts, or use an mpi_communicator");
          break;
        }
      }
    }
  }
  allgather_call call{std::move(check), in, out, {counts.begin(), counts.end()}};
  call.total = total;
  call.before = before;
  return call;
}

template <communicator C> void run_allgatherv(C& comm, const allgather_call& call, bool host_sync) {
  const auto& check = call.check;
  signature mine;
  mine.type = call.in.type;
  mine.count = check.kind() == op_kind::allgather ? call.in.count : call.total;
  mine.layout = check.kind() == op_kind::allgatherv ? hash_counts(call.counts) : 0;
  mine.memory = call.in.device.type;
  agree(comm, mine, check);
  if (call.total == 0) return;
  if constexpr (native_collectives<C>) {
    comm.native_allgather(call.in, call.out);
    if (host_sync) comm.synchronize();
  } else {
    (void)host_sync;
#if HERD_WITH_CUDA_KERNELS
    if (call.in.device.is_cuda()) {
      return staged_allgather(comm, call.in, call.out, call.counts, call.before);
    }
#endif
    allgather_host(comm, call.in, call.out, call.counts, call.before);
  }
}

template <communicator C>
void allgather_host(C& comm, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts, std::size_t before) {
  const std::size_t es = size_of(in.type);
  auto* base = static_cast<std::byte*>(out.data);
  if (in.data != base + before * es && in.count != 0) std::memcpy(base + before * es, in.data, in.bytes());
  if (comm.size() == 1) return;
  if (shm_node* node = shared_node_of(comm)) {
    return shm_allgather(comm, *node, es, chunk_layout::of_counts(counts), base + before * es, base);
  }
  ring_allgather(comm, base, es, chunk_layout::of_counts(counts), comm.options().ring_segment_bytes);
}

template <class In, class Out, communicator C>
allgather_call allgather_call_of(const In& input, Out& output, C& comm) {
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::allgather, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), in.count);
  check.require_count("output", out.count, in.count * counts.size(), "the input's elements times the ranks");
  return prepare_allgatherv(std::move(check), in, out, counts, comm);
}

template <class In, class Out, communicator C>
allgather_call allgatherv_call_of(const In& input, Out& output, std::span<const std::size_t> counts, C& comm) {
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::allgatherv, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  return prepare_allgatherv(std::move(check), in, out, counts, comm);
}

// Every rank's `count` (as allgather_counts), the operation carrying a problem `check` may hold.
template <communicator C> std::vector<std::size_t> allgather_counts(call_check check, std::size_t count, C& comm) {
  const auto mine = static_cast<std::int64_t>(count);
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), 1);
  const auto call = prepare_allgatherv(std::move(check), const_buffer_view(&mine, 1, dtype::i64),
                                       buffer_view{all.data(), all.size(), dtype::i64}, counts, comm);
  run_collective(comm, call.label(), [&](bool sync) { run_allgatherv(comm, call, sync); });
  return {all.begin(), all.end()};
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// `output` (comm.size() times the input's elements) receives every rank's `input`, in rank order.
template <class In, class Out, communicator C> void allgather(const In& input, Out& output, C& comm) {
  auto call = detail::allgather_call_of(input, output, comm);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_allgatherv(comm, call, sync); });
}

// Ranks contribute different counts; `counts` lists them and must be the same on every rank.
template <class In, class Out, communicator C>
void allgatherv(const In& input, Out& output, std::span<const std::size_t> counts, C& comm) {
  auto call = detail::allgatherv_call_of(input, output, counts, comm);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_allgatherv(comm, call, sync); });
}

// Asynchronous forms: the operation starts, the handle finishes it (herd::handle).
template <class In, class Out, communicator C>
[[nodiscard]] handle allgather_async(const In& input, Out& output, C& comm) {
  auto call = detail::allgather_call_of(input, output, comm);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_allgatherv(comm, call, sync);
  });
}

template <class In, class Out, communicator C>
[[nodiscard]] handle allgatherv_async(const In& input, Out& output, std::span<const std::size_t> counts, C& comm) {
  auto call = detail::allgatherv_call_of(input, output, counts, comm);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_allgatherv(comm, call, sync);
  });
}

// Every rank's `count`, in rank order: what allgatherv needs when ranks do not know each other's sizes.
template <communicator C> std::vector<std::size_t> allgather_counts(std::size_t count, C& comm) {
  return detail::allgather_counts(detail::call_check(detail::op_kind::allgather, comm.rank(), comm.size()), count, comm);
}

// Learns every rank's count, resizes `output` to their sum, gathers, and returns the counts.
template <class In, element T, class Allocator, communicator C>
std::vector<std::size_t> allgatherv(const In& input, std::vector<T, Allocator>& output, C& comm) {
  detail::require_tensor<In>();
  detail::call_check check(detail::op_kind::allgather, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);  // an adapter's refusal reaches every rank
  std::vector<std::size_t> counts = detail::allgather_counts(std::move(check), in.count, comm);
  output.resize(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  allgatherv(input, output, std::span<const std::size_t>(counts), comm);
  return counts;
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_ALLGATHER_HPP
