#ifndef HERD_COMM_DETAIL_AGREEMENT_HPP
#define HERD_COMM_DETAIL_AGREEMENT_HPP
// The cross-rank agreement every operation starts with. Each rank sends a fixed-size signature
// (which operation, its sequence number, its arguments, the communicator's wire-protocol options,
// and whether its own arguments were valid), optionally with up to 8 KiB of data, and learns
// every other rank's. A mismatch of operation, order or protocol options is found here and raised
// on every rank, each naming the ranks and values concerned, instead of a hang or a corrupt result.
//
// The exchange is one Bruck allgather: ceil(log2 p) rounds, over the communicator's one control
// tag, so that ranks in different operations still meet and see it. Errors raised after it are
// agreed: every rank raises, no message is left in flight, and the communicator stays usable.

#include <herd/comm/detail/operation_state.hpp>
#include <herd/comm/detail/shm.hpp>
#include <herd/core/device.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace herd::detail {

// An error every rank of the operation raises alike, after an agreement: the communicator stays
// usable. Its public name is herd::argument_error, which an uncaught one shows.
using agreed_error = argument_error;

[[noreturn]] inline void raise_agreed(const error_site& site, std::string_view what, std::string_view todo) {
  throw agreed_error(error_message(site, what, todo), site.rank);
}

// What one rank passed, as the others see it.
struct signature {
  std::uint32_t magic = 0x48524436;  // "HRD6": guards against a rank running another herd build
  op_kind kind = op_kind::barrier;
  dtype type = dtype::u8;
  reduce_op op = reduce_op::sum;
  std::uint8_t faulty = 0;  // 1 when this rank's own arguments failed a local check
  std::int32_t root = 0;
  std::uint32_t fault_code = 0;
  std::uint32_t payload_bytes = 0;  // data travelling with the signature (small allreduces, split)
  device::kind memory = device::kind::cpu;  // where the tensors live: picks the algorithm
  std::uint8_t check_arguments = 1;  // wire protocol: whether large collectives exchange signatures
  std::uint8_t typed = 0;            // whether count and type describe a tensor (for messages)
  std::uint8_t reproducible = 0;     // wire protocol: HERD_REPRODUCIBLE
  algorithm algo = algorithm::automatic;  // wire protocol: HERD_ALLREDUCE_ALGORITHM
  std::uint64_t seq = 0;     // the operation's sequence number on its communicator
  std::uint64_t count = 0;   // the element count every rank must agree on
  std::uint64_t layout = 0;  // allgatherv: a hash of the per-rank counts; grouped: of the tensor list
  std::uint64_t segment_bytes = 0;  // wire protocol: the ring's segment
  std::uint64_t slice_bytes = 0;    // wire protocol: the shared-memory pipeline's slice
  std::int64_t node_size = 0;       // wire protocol: HERD_SIMULATE_NODE_SIZE
  op_name name{};                   // the caller's name for the operation (herd::operation_name), if any

  op_label label() const { return {kind, seq, count, type, typed != 0, name}; }
};

// Up to this many bytes of data may travel with a signature. Every rank posts receive buffers
// this large, so a rank that sends less (or none, having taken another path) never overflows them.
inline constexpr std::size_t payload_max_bytes = 8192;

// Every rank's signature and payload, indexed by rank; valid until this thread's next exchange.
// The payloads are read where the exchange received them (rotated: rank first + j's is at j), so
// that no byte is copied after it arrived.
struct exchanged {
  std::span<const signature> signatures;
  std::span<const std::byte* const> payloads;
  int first = 0;
  const std::byte* payload(int r) const {
    const auto p = static_cast<int>(payloads.size());
    return payloads[static_cast<std::size_t>((r - first + p) % p)];
  }
};

// Per-thread memory for the exchange, reused so that an agreement allocates nothing after its first.
inline std::vector<signature>& signature_buffer(int which) {
  thread_local std::vector<signature> buffers[2];
  return buffers[which];
}
inline std::vector<const std::byte*>& payload_pointers() {
  thread_local std::vector<const std::byte*> pointers;
  return pointers;
}

// The buffers start at different offsets within a 4 KiB page: copies between buffers whose
// addresses differ by a multiple of 4 KiB are several times slower on x86 (loads falsely wait for
// stores to the same page offset), which made the exchange of 4-8 KiB payloads 3x slower.
inline std::byte* exchange_buffer(std::size_t bytes, int which) {
  struct buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };
  constexpr std::size_t page = 4096;
  thread_local buffer buffers[2];
  buffer& b = buffers[which];
  if (b.capacity < bytes) {
    b.data.reset(new std::byte[bytes + 2 * page]);
    b.capacity = bytes;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(b.data.get());
  const std::size_t offset = (page - address % page) % page + static_cast<std::size_t>(which + 1) * 1088;
  return b.data.get() + offset;
}

// A communicator whose ranks share one node through shared memory (mpi_communicator):
// shared_node() is that node, or null when there is none or it is not the whole communicator.
template <class C>
concept with_shared_node = requires(C& c) {
  { c.shared_node() } -> std::same_as<shm_node*>;
};

template <class C> shm_node* shared_node_of(C& comm) {
  if constexpr (with_shared_node<C>) return comm.shared_node();
  else return nullptr;
}

// The most bytes of data an agreement on `comm` carries: more through shared memory, where a
// rank's buffer holds a whole slice.
template <class C> std::size_t payload_capacity(C& comm) {
  const shm_node* node = shared_node_of(comm);
  return node != nullptr ? node->slice_bytes() : payload_max_bytes;
}

// The exchange through shared memory: one step. Every rank writes its signature into its header
// and, with `write(t)` (t: the step's ticket), the step's data into its buffer, and reads the
// others' where they are; the buffers stay valid only until this rank publishes its next step
// (after that a peer may pass that step's wait and write the step after it into the same buffer),
// so callers use or copy them at once. `payload_bytes` is what the signature announces of the
// data (0 where the caller reads the buffers by a layout of its own: the first step of
// shm_allreduce, agree_with_step). The steps pair by operation number only, so that the signatures
// name any other difference, unless `pair` says otherwise.
template <class C, class Write>
exchanged shm_exchange(C& comm, shm_node& node, const signature& mine, std::size_t payload_bytes, Write&& write,
                       shm_node::pairing pair = shm_node::pairing::number) {
  static_assert(sizeof(signature) <= shm_header_bytes - sizeof(std::uint64_t));  // the step's operation last
  const std::uint64_t t = node.next_ticket(comm);
  signature own = mine;
  own.payload_bytes = static_cast<std::uint32_t>(payload_bytes);
  std::memcpy(node.header(node.rank(), t), &own, sizeof own);
  write(t);
  node.publish(t);
  node.wait_all(comm, t, shm_node::arrived, pair);
  const auto parts = static_cast<std::size_t>(node.size());
  std::vector<signature>& by_owner = signature_buffer(1);
  std::vector<const std::byte*>& where = payload_pointers();
  by_owner.resize(parts);
  where.resize(parts);
  for (std::size_t q = 0; q < parts; ++q) {
    std::memcpy(&by_owner[q], node.header(static_cast<int>(q), t), sizeof(signature));
    by_owner[q].payload_bytes = static_cast<std::uint32_t>(std::min<std::size_t>(by_owner[q].payload_bytes, node.slice_bytes()));
    where[q] = node.buffer(static_cast<int>(q), t);
  }
  return {by_owner, where, 0};
}

// Bruck's allgather of (signature, payload): ceil(log2 p) rounds; in the round at distance d a
// rank passes on the first min(d, p - have) blocks it holds, its own first. On the wire a message
// is the blocks' signatures followed by their payloads, packed; the receiver reads the sizes from
// the signatures. Every round sends from and receives into memory of its own, so a payload stays
// where it arrived: this rank's is copied once (into the first message), the others' never.
template <class C>
exchanged exchange(C& comm, const signature& mine, const void* payload, std::size_t payload_bytes) {
  if (shm_node* node = shared_node_of(comm)) {
    return shm_exchange(comm, *node, mine, payload_bytes, [&](std::uint64_t t) {
      if (payload_bytes != 0) std::memcpy(node->buffer(node->rank(), t), payload, payload_bytes);
    });
  }
  const int p = comm.size();
  const int r = comm.rank();
  const auto parts = static_cast<std::size_t>(p);
  constexpr std::size_t block = sizeof(signature) + payload_max_bytes;
  std::vector<signature>& rotated = signature_buffer(0);  // rotated[j] comes from rank r + j
  std::vector<const std::byte*>& where = payload_pointers();
  rotated.resize(parts);
  where.assign(parts, nullptr);
  std::byte* wire = exchange_buffer(2 * (parts - 1) * block, 1);
  rotated[0] = mine;
  rotated[0].payload_bytes = static_cast<std::uint32_t>(payload_bytes);
  where[0] = static_cast<const std::byte*>(payload);
  std::size_t have = 1;
  for (std::size_t distance = 1; distance < parts; distance *= 2) {
    const std::size_t count = std::min(distance, parts - have);
    std::byte* out = wire;
    std::byte* in = wire + count * block;
    wire = in + count * block;
    std::memcpy(out, rotated.data(), count * sizeof(signature));
    std::size_t used = count * sizeof(signature);
    for (std::size_t j = 0; j < count; ++j) {
      if (rotated[j].payload_bytes != 0) std::memcpy(out + used, where[j], rotated[j].payload_bytes);
      if (distance == 1) where[j] = out + used;  // this rank's own: the caller's memory may change
      used += rotated[j].payload_bytes;
    }
    const int d = static_cast<int>(distance);
    comm.sendrecv(out, used, (r - d + p) % p, in, count * block, (r + d) % p, control_tag);
    std::memcpy(rotated.data() + have, in, count * sizeof(signature));
    std::size_t at = count * sizeof(signature);
    for (std::size_t j = have; j < have + count; ++j) {
      const std::size_t bytes = std::min<std::size_t>(rotated[j].payload_bytes, payload_max_bytes);
      rotated[j].payload_bytes = static_cast<std::uint32_t>(bytes);
      where[j] = in + at;
      at += bytes;
    }
    have += count;
  }
  // The signatures in rank order: rank (r + j) % p's is at j.
  std::vector<signature>& by_owner = signature_buffer(1);
  by_owner.resize(parts);
  for (std::size_t j = 0; j < parts; ++j) by_owner[(static_cast<std::size_t>(r) + j) % parts] = rotated[j];
  return {by_owner, where, r};
}

// The other ranks' words for a fault code (collectives/detail/agreement.hpp records them).
constexpr const char* fault_text(std::uint32_t code) noexcept {
  switch (code) {
    case 1: return "a tensor with an invalid dtype";
    case 2: return "a null data pointer with a non-zero element count";
    case 3: return "an invalid reduce_op";
    case 4: return "a reduce_op its dtype does not support";
    case 5: return "a tensor on a device the communicator cannot reach";
    case 6: return "input and output tensors of different dtypes";
    case 7: return "a tensor of the wrong size";
    case 8: return "overlapping input and output buffers";
    case 9: return "a root out of range";
    case 10: return "a tensor its adapter rejected";
    case 11: return "input and output tensors on different devices";
    case 12: return "an operation this communicator cannot do in this translation unit";
    case 13: return "a tensor whose size in bytes overflows";
    case 14: return "gradients that differ from those of the first step";
    case 15: return "a negative color";
    case 16: return "gradients it did not mark ready in this backward pass";
    case 17: return "optimizer state of another shard layout (another rank's or world size's zero_optimizer checkpoint)";
    case 18: return "a tensor whose elements do not split into equal blocks, one per rank";
    case 19: return "a list of per-rank counts (splits) with one entry too many or too few";
    case 20: return "receive splits that differ from what the other ranks send it";
    default: return "invalid arguments";
  }
}

// "rank 0: 100, rank 1: 128, rank 2: 100" (the first 16 ranks).
template <class Field>
std::string per_rank(std::span<const signature> all, Field field) {
  std::string text;
  for (std::size_t i = 0; i < all.size() && i < 16; ++i) {
    if (i) text += ", ";
    text += "rank " + std::to_string(i) + ": " + field(all[i]);
  }
  if (all.size() > 16) text += ", ...";
  return text;
}

template <class Field> bool differs(std::span<const signature> all, Field field) {
  for (const auto& s : all)
    if (field(s) != field(all[0])) return true;
  return false;
}

// A wire-protocol option in words, as an error names each rank's.
template <class T> std::string option_text(T value) {
  if constexpr (std::is_enum_v<T>) return std::string(name(value));
  else return std::to_string(value);
}

// The error of require_same_option, out of line: every operation's agreement runs the check, and
// the words of the error inlined there cost small collectives about 10 ns.
template <class Field>
[[noreturn, gnu::cold, gnu::noinline]] void raise_differing_option(const error_site& site, std::span<const signature> all,
                                                                  const char* variable, Field field, const char* advice) {
  raise_agreed(site, std::string(variable) + " differs across ranks (" +
                         per_rank(all, [&](const signature& s) { return option_text(field(s)); }) + ")",
               advice);
}

// Raises on every rank if the wire-protocol option `variable` (`field` of a signature) differs
// across ranks, naming each rank's; `advice` says what to do.
template <class Field>
void require_same_option(const error_site& site, std::span<const signature> all, const char* variable, Field field,
                         const char* advice) {
  if (differs(all, field)) [[unlikely]] raise_differing_option(site, all, variable, field, advice);
}

// Raises on every rank if the ranks are not in the same operation (kind and sequence number),
// run different wire protocols, or if any rank reported a fault of its own. `own_fault()` raises
// this rank's own fault in its own words, before the others' are named.
inline void no_fault() noexcept {}
template <class OwnFault = void (*)() noexcept>
void verify_identity(const error_site& site, std::span<const signature> all, OwnFault own_fault = no_fault) {
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].magic != signature{}.magic) {
      raise_agreed(site, "rank " + std::to_string(i) + " runs a different herd build or is not in a herd operation",
                   "Build every rank from the same sources and call the same collectives in the same order");
    }
  }
  const bool numbers_differ = differs(all, [](const signature& s) { return s.seq; });
  const bool names_differ = differs(all, [](const signature& s) { return s.name; });
  if (numbers_differ || names_differ || differs(all, [](const signature& s) { return s.kind; })) {
    std::string text;
    for (std::size_t i = 0; i < all.size() && i < 16; ++i) {
      text += (i == 0 ? "rank 0 is in " : ", rank " + std::to_string(i) + " in ") + all[i].label().str();
    }
    if (all.size() > 16) text += ", ...";
    const std::string what = "the ranks are in different operations: " + text;
    const char* todo = "Every rank must call the same collectives on a communicator, in the same order; look for a "
                       "rank that skipped one or called another";
    // Different numbers mean the ranks' sequences went apart for good (a collective without an
    // agreement ran on some ranks only): an abort, not an error to go on from.
    if (numbers_differ) raise(site, what, todo);
    raise_agreed(site, what, todo);
  }
  own_fault();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].faulty) {
      raise_agreed(site, "rank " + std::to_string(i) + " passed " + fault_text(all[i].fault_code) + " (its own error says more)",
                   "Fix the call on rank " + std::to_string(i) + "; every rank stops so that none waits forever");
    }
  }
  require_same_option(site, all, "HERD_CHECK_ARGUMENTS", [](const signature& s) { return s.check_arguments; },
                      "Give every rank the same HERD_CHECK_ARGUMENTS (comm_options::check_arguments): it changes which "
                      "messages a collective sends");
  require_same_option(site, all, "HERD_RING_SEGMENT_BYTES", [](const signature& s) { return s.segment_bytes; },
                      "Give every rank the same HERD_RING_SEGMENT_BYTES (comm_options::ring_segment_bytes): the ring's "
                      "messages must pair up one to one");
  require_same_option(site, all, "HERD_ALLREDUCE_ALGORITHM", [](const signature& s) { return s.algo; },
                      "Give every rank the same HERD_ALLREDUCE_ALGORITHM (comm_options::allreduce_algorithm): the ranks "
                      "must take the same path");
  require_same_option(site, all, "HERD_SHM_SLICE_BYTES", [](const signature& s) { return s.slice_bytes; },
                      "Give every rank the same HERD_SHM_SLICE_BYTES (comm_options::shm_slice_bytes): the ranks share "
                      "one layout of shared memory");
  require_same_option(site, all, "HERD_REPRODUCIBLE", [](const signature& s) { return s.reproducible; },
                      "Give every rank the same HERD_REPRODUCIBLE (comm_options::reproducible): the ranks must reduce "
                      "the same way");
  require_same_option(site, all, "HERD_SIMULATE_NODE_SIZE", [](const signature& s) { return s.node_size; },
                      "Give every rank the same HERD_SIMULATE_NODE_SIZE (comm_options::simulated_node_size), or none");
}

// The communicator small host messages (agreements) travel on: its control() when it has one
// (nccl_communicator moves device memory only), itself otherwise.
template <class C> auto& control_of(C& comm) {
  if constexpr (requires { comm.control(); }) return comm.control();
  else return comm;
}

// Writes into `s` what every agreement of the running operation carries besides its arguments:
// the operation's identity and the communicator's wire-protocol options.
inline void stamp_identity(signature& s, const operation_state& ops) {
  s.kind = ops.current().kind;
  s.seq = ops.current().seq;
  s.typed = ops.current().typed ? 1 : 0;
  s.check_arguments = ops.options().check_arguments ? 1 : 0;
  s.segment_bytes = ops.options().ring_segment_bytes;
  s.algo = ops.options().allreduce_algorithm;
  s.slice_bytes = ops.options().shm_slice_bytes;
  s.reproducible = ops.options().reproducible ? 1 : 0;
  s.node_size = ops.options().simulated_node_size;
  s.name = ops.current().name_;
}

// A signature for the running operation, carrying the communicator's wire-protocol options.
inline signature signature_of(const operation_state& ops) {
  signature s;
  s.count = ops.current().count;
  s.type = ops.current().type;
  stamp_identity(s, ops);
  return s;
}

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_AGREEMENT_HPP
