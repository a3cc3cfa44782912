#ifndef HERD_COLLECTIVES_ALLREDUCE_HPP
#define HERD_COLLECTIVES_ALLREDUCE_HPP
// herd::allreduce: every rank ends with the elementwise reduction of every rank's tensor,
// bitwise identical on all of them.
//
//   herd::allreduce(grad, comm);                          // in place, sum
//   herd::allreduce(grad, comm, herd::reduce_op::avg);
//   herd::allreduce(input, output, comm, herd::reduce_op::max);   // out of place
//   herd::allreduce(herd::views(w, b, e), comm, herd::reduce_op::avg);  // many tensors, one operation
//   herd::handle h = herd::allreduce_async(grad, comm);   // starts it; h.wait() finishes it
//
// Host tensors up to 8 KiB travel with the ranks' agreement (collectives/detail/agreement.hpp)
// and every rank combines them itself, in rank order; larger ones take the ring
// (collectives/detail/ring.hpp): reduce-scatter, then allgather, pipelined. GPU tensors take NCCL
// on an nccl_communicator, or herd's staged ring with its kernels over MPI (detail/dispatch.hpp).
// The grouped form (Horovod's grouped_allreduce) checks the whole list across ranks once and
// packs host tensors of one dtype into one buffer, reduced by one ring.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/reproducible.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/collectives/detail/shm.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C>
void ring_allreduce(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count) {
  const int p = comm.size();
  const std::size_t es = size_of(type);
  if (p == 1) {  // the reduction of one tensor, avg included, is the tensor
    if (out != in && count != 0) std::memcpy(out, in, count * es);
    return;
  }
  const chunk_layout chunks = chunk_layout::even(count, p);
  const std::size_t segment_bytes = comm.options().ring_segment_bytes;
  ring_reduce_scatter(
      comm, type, op, chunks, segment_bytes,
      [&](int c) { return in + chunks.offset[static_cast<std::size_t>(c)] * es; },
      [&](int, int c) { return out + chunks.offset[static_cast<std::size_t>(c)] * es; });
  ring_allgather(comm, out, es, chunks, segment_bytes);
}

// The hierarchical allreduce, for ranks on several nodes with as many on each: a reduce-scatter
// through each node's shared memory leaves rank l of every node with chunk l of its node's sum; the
// ranks with index l allreduce that chunk across nodes with the ring (`across`); an allgather
// through shared memory gives every rank of the node every chunk. avg sums all the way and
// divides at the end.
//
// A tensor larger than the ring's segment (comm_options::ring_segment_bytes) goes through the three
// phases a segment at a time: a piece's node sums are still in cache when they cross the nodes, and
// what came back still is when the node shares it. In one pass each phase streams the whole tensor
// through memory once more (on 2 simulated nodes of 2 ranks, 16 MiB took 1.38x as long in one pass:
// benchmarks/RESULTS.md, "Across simulated nodes"). Each element is summed in the same order
// either way.
template <communicator C, communicator A>
void hierarchical_allreduce(C& comm, shm_node& node, A& across, dtype type, reduce_op op, const std::byte* in,
                            std::byte* out, std::size_t count) {
  const std::size_t es = size_of(type);
  const reduce_op partial = op == reduce_op::avg ? reduce_op::sum : op;
  const std::size_t piece = std::max<std::size_t>(1, comm.options().ring_segment_bytes / es);
  const auto l = static_cast<std::size_t>(node.rank());
  for (std::size_t begin = 0; begin < count; begin += piece) {
    const std::size_t m = std::min(piece, count - begin);
    const std::byte* piece_in = in + begin * es;
    const chunk_layout chunks = chunk_layout::even(m, node.size());
    std::byte* mine = out + (begin + chunks.offset[l]) * es;
    shm_reduce_scatter(
        comm, node, type, partial, chunks,
        [&](int c) { return piece_in + chunks.offset[static_cast<std::size_t>(c)] * es; }, mine);
    run_operation(across, {op_kind::allreduce, 0, chunks.length[l], type, true},
                  [&] { ring_allreduce(across, type, partial, mine, mine, chunks.length[l]); });
    if (op == reduce_op::avg) host_finalize_avg(type, mine, chunks.length[l], comm.size());
    shm_allgather(comm, node, es, chunks, mine, out + begin * es);
  }
}

// The allreduce of a host buffer, after the agreement: through the node's shared memory when
// every rank is on it, hierarchically when there are several nodes with shared memory on each,
// else with the ring. A reproducible sum takes shared memory too (which then computes each element
// with the mode's order-free function), and otherwise its own exchange of pieces, never the
// hierarchical path, whose partial sums per node would depend on the layout.
template <communicator C>
void host_allreduce(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count) {
  const bool reproducible = comm.size() > 1 && reproducible_applies(comm.options().reproducible, type, op);
  if constexpr (with_shared_node<C>) {
    if (comm.size() > 1) {
      if (shm_node* node = comm.shared_node()) return shm_allreduce(comm, *node, type, op, in, out, count);
      if (reproducible) return reproducible_allreduce(comm, type, op, in, out, count);
      if (shm_node* part = comm.node_part(); part != nullptr && comm.across_nodes() != nullptr) {
        return hierarchical_allreduce(comm, *part, *comm.across_nodes(), type, op, in, out, count);
      }
    }
  }
  if (reproducible) return reproducible_allreduce(comm, type, op, in, out, count);
  ring_allreduce(comm, type, op, in, out, count);
}

// A host allreduce through the node's shared memory whose agreement carries its first slice's first
// half-step (agree_with_step): one synchronization fewer than agree() and then shm_allreduce.
template <communicator C>
void agreed_shm_allreduce(C& comm, shm_node& node, const signature& mine, const call_check& check, dtype type,
                          reduce_op op, const host_parts& in, const host_parts& out, std::size_t count) {
  const shm_slice first(node, 0, count, shm_elements_per_slice(node, type));
  const std::uint64_t t = agree_with_step(comm, node, mine, check, [&](std::uint64_t step) {
    shm_copy_in(comm.operations().track(), type, in, first, node.window(node.rank(), step, first.m * size_of(type)));
  });
  shm_allreduce(comm, node, type, op, in, out, count, t);
}

// Host allreduces up to this size travel with the agreement (each rank reduces every rank's
// tensor): within MPI's messages up to payload_max_bytes, through shared memory up to this.
inline constexpr std::size_t shm_one_shot_max_bytes = std::size_t{16} << 10;

template <communicator C> std::size_t one_shot_bytes(C& comm) {
  return shared_node_of(comm) != nullptr ? std::min(shm_one_shot_max_bytes, payload_capacity(comm)) : payload_max_bytes;
}

// One allreduce: its arguments, checked on this rank.
struct allreduce_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;
  reduce_op op;

  op_label label() const { return tensor_label(op_kind::allreduce, in); }
};

template <communicator C>
allreduce_call prepare_allreduce(call_check check, const_buffer_view in, buffer_view out, C& comm, reduce_op op) {
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
  require_reproducible_on_host(check, comm, in, op);
  return {std::move(check), in, out, op};
}

// The reduction of the tensor itself, after the agreement (no checks: the caller made them).
template <communicator C>
void reduce_tensor(C& comm, const_buffer_view in, buffer_view out, reduce_op op, bool host_sync) {
  if (in.count == 0) return;
  if constexpr (native_collectives<C>) {
    native_reduction(comm, out, op, host_sync, [&](reduce_op o) { comm.native_allreduce(in, out, o); });
  } else {
    (void)host_sync;
#if HERD_WITH_CUDA_KERNELS
    if (in.device.is_cuda()) return staged_allreduce(comm, in.type, op, in.data, out.data, in.count, in.device.index);
#endif
    host_allreduce(comm, in.type, op, static_cast<const std::byte*>(in.data), static_cast<std::byte*>(out.data),
                   in.count);
  }
}

template <communicator C> void run_allreduce(C& comm, const allreduce_call& call, bool host_sync) {
  const auto& [check, in, out, op] = call;
  signature mine;
  mine.type = in.type;
  mine.op = op;
  mine.count = in.count;
  mine.memory = in.device.type;
  const std::size_t bytes = check.ok() ? in.bytes() : 0;
  const int p = comm.size();
  if (!native_collectives<C> && p > 1 && bytes <= one_shot_bytes(comm) && in.device.is_cpu()) {
    // Small: the data travels with the signatures. Every rank then holds every rank's tensor and
    // combines them in rank order, so all compute the same bits in one exchange of ceil(log2 p) rounds.
    const exchanged all = agree(comm, mine, check, true, in.data, bytes);
    if (in.count == 0) return;
    const trace::span phase(comm.operations().track(), "reduction", trace::fields::elements(in.count, in.type));
    combine_ranks(comm.options().reproducible, in.type, op, static_cast<std::byte*>(out.data), p,
                  [&](int q) { return all.payload(q); }, in.count);
    return;
  }
  if constexpr (with_shared_node<C>) {
    if (shm_node* node = comm.shared_node(); node != nullptr && p > 1 && in.device.is_cpu() && out.device.is_cpu()) {
      return agreed_shm_allreduce(comm, *node, mine, check, in.type, op, host_parts(in.data, in.count, in.type),
                                  host_parts(out.data, out.count, out.type), in.count);
    }
  }
  agree(comm, mine, check);
  reduce_tensor(comm, in, out, op, host_sync);
}

// Many tensors as one operation.
struct grouped_allreduce_call {
  call_check check;
  std::vector<buffer_view> tensors;
  reduce_op op;
  std::size_t total = 0;     // elements
  std::uint64_t layout = 0;  // the list: every tensor's count, dtype and device kind

  op_label label() const {
    op_label l{op_kind::grouped_allreduce};
    l.count = total;
    return l;
  }
};

template <communicator C>
grouped_allreduce_call prepare_grouped_allreduce(call_check check, std::vector<buffer_view> tensors, C& comm,
                                                 reduce_op op) {
  std::vector<std::size_t> codes;
  std::size_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const buffer_view& t = tensors[i];
    const std::string role = "grouped tensor " + std::to_string(i) + "'s";
    check.require_valid(role.c_str(), t);
    check.require_op(t.type, op);
    check.require_reachable(role.c_str(), t, reaches(comm, t.device), unreachable_advice(comm, t.device));
    if constexpr (native_collectives<C>) require_native_op(check, t.type, op);
    require_reproducible_on_host(check, comm, t, op);
    for (std::size_t j = 0; check.ok() && j < i; ++j) {
      check.require_disjoint(tensors[j], t, nullptr, nullptr);
    }
    codes.push_back(t.count);
    codes.push_back(static_cast<std::size_t>(t.type) | static_cast<std::size_t>(t.device.type) << 8);
    total += t.count;
  }
  grouped_allreduce_call call{std::move(check), std::move(tensors), op};
  call.total = total;
  call.layout = hash_counts(codes);
  return call;
}

template <communicator C> void run_grouped_allreduce(C& comm, const grouped_allreduce_call& call, bool host_sync) {
  signature mine;
  mine.op = call.op;
  mine.count = call.total;
  mine.layout = call.layout;
  mine.memory = call.tensors.empty() ? device::kind::cpu : call.tensors.front().device.type;
  agree(comm, mine, call.check);
  const auto& tensors = call.tensors;
  std::vector<bool> done(tensors.size(), false);
  for (std::size_t first = 0; first < tensors.size(); ++first) {
    if (done[first]) continue;
    const buffer_view& lead = tensors[first];
    if (lead.device.is_cuda() || comm.size() == 1) {  // device tensors one by one; one rank: nothing to do
      done[first] = true;
      reduce_tensor(comm, lead, lead, call.op, false);
      continue;
    }
    // Host tensors of lead's dtype: packed into one buffer, reduced by one ring, unpacked.
    std::vector<std::size_t> members;
    std::size_t count = 0;
    for (std::size_t i = first; i < tensors.size(); ++i) {
      if (!done[i] && tensors[i].device.is_cpu() && tensors[i].type == lead.type) {
        done[i] = true;
        members.push_back(i);
        count += tensors[i].count;
      }
    }
    if (members.size() == 1) {
      reduce_tensor(comm, lead, lead, call.op, false);
      continue;
    }
    const std::size_t es = size_of(lead.type);
    shm_node* node = shared_node_of(comm);
    if (node != nullptr) {
      // Straight from and into the tensors: no packing.
      std::vector<buffer_view> parts;
      for (std::size_t i : members) parts.push_back(tensors[i]);
      const host_parts whole(parts, es);
      shm_allreduce(comm, *node, lead.type, call.op, whole, whole, count);
      continue;
    }
    std::byte* fused = scratch(count * es, scratch_slot::kept);
    const std::uint32_t track = comm.operations().track();
    std::size_t at = 0;
    {
      const trace::span phase(track, "pack", trace::fields::elements(count, lead.type));
      for (std::size_t i : members) {
        if (tensors[i].count != 0) std::memcpy(fused + at, tensors[i].data, tensors[i].bytes());
        at += tensors[i].bytes();
      }
    }
    host_allreduce(comm, lead.type, call.op, fused, fused, count);
    const trace::span phase(track, "unpack", trace::fields::elements(count, lead.type));
    at = 0;
    for (std::size_t i : members) {
      if (tensors[i].count != 0) std::memcpy(tensors[i].data, fused + at, tensors[i].bytes());
      at += tensors[i].bytes();
    }
  }
  if constexpr (native_collectives<C>) {
    if (host_sync) comm.synchronize();
  } else {
    (void)host_sync;
  }
}

// Whether allreduce_in_shared_memory suits these host tensors of one dtype on comm: every rank
// shares the node, and there is more than a one-shot allreduce's worth of data.
template <communicator C> bool reduces_in_shared_memory(C& comm, std::span<const buffer_view> parts) {
  if (shared_node_of(comm) == nullptr || parts.empty() || !parts.front().device.is_cpu()) return false;
  std::size_t count = 0;
  for (const buffer_view& v : parts) count += v.count;
  return count * size_of(parts.front().type) > one_shot_bytes(comm);
}

// Host tensors of one dtype reduced in place as one allreduce of their total count, through the
// node's shared memory straight from and into them: what a fusion buffer or a bucket does,
// without its two copies. The caller checked reduces_in_shared_memory and the tensors themselves
// (the distributed optimizer's gradients). On the wire it is the allreduce of one tensor of that
// count, so a rank that packed the same gradients into one buffer takes part in the same
// operation. Returns the operation's label and body, for run_collective or start_collective.
template <communicator C>
std::pair<op_label, std::function<void(bool)>> allreduce_in_shared_memory_body(C& comm, std::vector<buffer_view> parts,
                                                                                reduce_op op) {
  const dtype type = parts.front().type;
  std::size_t count = 0;
  for (const buffer_view& v : parts) count += v.count;
  return {op_label{op_kind::allreduce, 0, count, type, true}, [&comm, parts = std::move(parts), op, type, count](bool) {
            signature mine;
            mine.type = type;
            mine.op = op;
            mine.count = count;
            const host_parts whole(parts, size_of(type));
            const call_check check(op_kind::allreduce, comm.rank(), comm.size());
            agreed_shm_allreduce(comm, *shared_node_of(comm), mine, check, type, op, whole, whole, count);
          }};
}

template <communicator C> void allreduce_in_shared_memory(C& comm, std::span<const buffer_view> parts, reduce_op op) {
  auto [label, body] = allreduce_in_shared_memory_body(comm, {parts.begin(), parts.end()}, op);
  run_collective(comm, label, body);
}

template <class T> inline constexpr bool is_view_list = std::is_same_v<std::remove_cvref_t<T>, std::vector<buffer_view>>;

// The blocking allreduce of `v` in place, with `check` as the caller made it: a caller that checks
// its own inputs first records what it finds there (call_check::fail), so that the agreement
// raises it on every rank rather than this rank alone, the others waiting for it in this allreduce.
template <communicator C> void allreduce_checked(call_check check, buffer_view v, C& comm, reduce_op op) {
  const auto call = prepare_allreduce(std::move(check), v, v, comm, op);
  run_collective(comm, call.label(), [&](bool sync) { run_allreduce(comm, call, sync); });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// In place: `tensor` ends as the reduction over all ranks.
template <class T, communicator C>
  requires(!detail::is_view_list<T>)
void allreduce(T& tensor, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_writable_tensor<T>();
  detail::call_check check(detail::op_kind::allreduce, comm.rank(), comm.size());
  const buffer_view v = check.view("input", tensor);
  detail::allreduce_checked(std::move(check), v, comm, op);
}

// Out of place: `output` (same dtype and size as `input`) receives the reduction; `input` is unchanged.
template <class In, class Out, communicator C>
void allreduce(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_tensor<In>();
  detail::require_writable_tensor<Out>();
  detail::call_check check(detail::op_kind::allreduce, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  const auto call = detail::prepare_allreduce(std::move(check), in, out, comm, op);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_allreduce(comm, call, sync); });
}

// Many tensors, each in place, as one operation (herd::views(a, b, c) makes the list).
template <communicator C>
void allreduce(const std::vector<buffer_view>& tensors, C& comm, reduce_op op = reduce_op::sum) {
  detail::call_check check(detail::op_kind::grouped_allreduce, comm.rank(), comm.size());
  const auto call = detail::prepare_grouped_allreduce(std::move(check), tensors, comm, op);
  detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_grouped_allreduce(comm, call, sync); });
}

// Asynchronous forms: the operation starts, the handle finishes it (herd::handle). The tensors
// must stay alive and untouched until then.
template <class T, communicator C>
  requires(!detail::is_view_list<T>)
[[nodiscard]] handle allreduce_async(T& tensor, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_writable_tensor<T>();
  detail::call_check check(detail::op_kind::allreduce, comm.rank(), comm.size());
  const buffer_view v = check.view("input", tensor);
  auto call = detail::prepare_allreduce(std::move(check), v, v, comm, op);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_allreduce(comm, call, sync);
  });
}

template <class In, class Out, communicator C>
[[nodiscard]] handle allreduce_async(const In& input, Out& output, C& comm, reduce_op op = reduce_op::sum) {
  detail::require_tensor<In>();
  detail::require_writable_tensor<Out>();
  detail::call_check check(detail::op_kind::allreduce, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  auto call = detail::prepare_allreduce(std::move(check), in, out, comm, op);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_allreduce(comm, call, sync);
  });
}

template <communicator C>
[[nodiscard]] handle allreduce_async(std::vector<buffer_view> tensors, C& comm, reduce_op op = reduce_op::sum) {
  detail::call_check check(detail::op_kind::grouped_allreduce, comm.rank(), comm.size());
  auto call = detail::prepare_grouped_allreduce(std::move(check), std::move(tensors), comm, op);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool sync) {
    detail::run_grouped_allreduce(comm, call, sync);
  });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_ALLREDUCE_HPP
