#pragma once
// Before any data moves, every rank of a collective learns what every other rank passed (the
// operation, dtype, reduce op, element count, root, and whether its own arguments were valid).
// A disagreement or a bad argument on any rank then raises herd::error on every rank, each naming
// the ranks and values concerned, instead of a hang or a corrupt result.
//
// The exchange is one Bruck allgather of a 40-byte signature: ceil(log2 p) rounds. Small
// allreduces send their data along with it and need no other message. For larger collectives it
// can be turned off with HERD_CHECK_ARGUMENTS=0 (on every rank alike); local checks still run
// then, but a bad argument on one rank is reported on that rank alone and may leave the others
// waiting.

#include <herd/collectives/detail/scratch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/runtime/env.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace herd::detail {

enum class collective_kind : std::uint8_t { allreduce, broadcast, allgather, allgatherv, reduce_scatter };

constexpr const char* name(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::allgather: return "allgather";
    case collective_kind::allgatherv: return "allgatherv";
    case collective_kind::reduce_scatter: return "reduce_scatter";
  }
  return "collective";
}

// What one rank passed, as the others see it.
struct signature {
  std::uint32_t magic = 0x48524433;  // "HRD3": guards against a rank running another herd build
  collective_kind kind = collective_kind::allreduce;
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  std::uint8_t faulty = 0;  // 1 when this rank's own arguments failed a local check
  std::int32_t root = 0;
  std::uint32_t fault_code = 0;
  std::uint32_t payload_bytes = 0;  // data travelling with the signature (small allreduces)
  device::kind memory = device::kind::cpu;  // where the tensors live: picks the algorithm
  std::uint64_t count = 0;  // the element count every rank must agree on
  std::uint64_t layout = 0;  // allgatherv: a hash of the per-rank counts
  std::uint64_t segment_bytes = 0;  // the ring's segment: messages must pair up one to one
};

// Up to this many bytes of data may travel with a signature. Every rank posts receive buffers
// this large, so a rank that sends less (or none, having taken another path) never overflows them.
inline constexpr std::size_t payload_max_bytes = 8192;

// Every rank's signature and payload, indexed by rank.
struct exchanged {
  std::vector<signature> signatures;
  const std::byte* slots = nullptr;  // rank r's payload at slots + r * payload_max_bytes
  const std::byte* payload(int r) const { return slots + static_cast<std::size_t>(r) * payload_max_bytes; }
};

// Bruck's allgather of (signature, payload): ceil(log2 p) rounds; in the round at distance d a
// rank passes on the first min(d, p - have) blocks it holds. On the wire a message is the blocks'
// signatures followed by their payloads, packed; the receiver reads the sizes from the signatures.
template <communicator C>
exchanged exchange(C& comm, const signature& mine, const void* payload, std::size_t payload_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  const auto parts = static_cast<std::size_t>(p);
  std::vector<signature> rotated(parts);  // rotated[j] comes from rank r + j
  std::byte* slots = scratch(parts * payload_max_bytes, 1);
  std::byte* wire = scratch(2 * parts * (sizeof(signature) + payload_max_bytes), 2);
  rotated[0] = mine;
  rotated[0].payload_bytes = static_cast<std::uint32_t>(payload_bytes);
  if (payload_bytes != 0) std::memcpy(slots, payload, payload_bytes);
  std::size_t have = 1;
  for (std::size_t distance = 1; distance < parts; distance *= 2) {
    const std::size_t count = std::min(distance, parts - have);
    std::byte* out = wire;
    std::byte* in = wire + parts * (sizeof(signature) + payload_max_bytes);
    std::memcpy(out, rotated.data(), count * sizeof(signature));
    std::size_t used = count * sizeof(signature);
    for (std::size_t j = 0; j < count; ++j) {
      std::memcpy(out + used, slots + j * payload_max_bytes, rotated[j].payload_bytes);
      used += rotated[j].payload_bytes;
    }
    const int d = static_cast<int>(distance);
    comm.sendrecv(out, used, (r - d + p) % p, in, count * (sizeof(signature) + payload_max_bytes), (r + d) % p,
                  tag_value(tag::agreement));
    std::memcpy(rotated.data() + have, in, count * sizeof(signature));
    std::size_t at = count * sizeof(signature);
    for (std::size_t j = have; j < have + count; ++j) {
      const std::size_t bytes = std::min<std::size_t>(rotated[j].payload_bytes, payload_max_bytes);
      rotated[j].payload_bytes = static_cast<std::uint32_t>(bytes);
      std::memcpy(slots + j * payload_max_bytes, in + at, bytes);
      at += bytes;
    }
    have += count;
  }
  // Undo the rotation: rank (r + j) % p's block is at j.
  exchanged result;
  result.signatures.resize(parts);
  std::byte* by_rank = scratch(parts * payload_max_bytes, 0);
  for (std::size_t j = 0; j < parts; ++j) {
    const std::size_t owner = (static_cast<std::size_t>(r) + j) % parts;
    result.signatures[owner] = rotated[j];
    std::memcpy(by_rank + owner * payload_max_bytes, slots + j * payload_max_bytes, rotated[j].payload_bytes);
  }
  result.slots = by_rank;
  return result;
}

// Accumulates the first local problem with a call's arguments, to be raised after the exchange.
class call_check {
 public:
  call_check(collective_kind kind, int rank, int size) : kind_(kind), rank_(rank), size_(size) {}

  bool ok() const noexcept { return what_.empty(); }
  const std::string& what() const noexcept { return what_; }
  std::uint32_t code() const noexcept { return code_; }

  // Records a problem (only the first one counts).
  void fail(std::uint32_t code, std::string what, std::string todo) {
    if (!ok()) return;
    code_ = code;
    what_ = std::move(what);
    todo_ = std::move(todo);
  }

  void require_valid(const char* role, const const_buffer_view& v) {
    if (!is_valid(v.type)) {
      fail(1, std::string("the ") + role + " tensor has an invalid dtype (value " +
                  std::to_string(static_cast<int>(v.type)) + ")",
           "Return one of herd::dtype's values from tensor_traits::dtype");
    } else if (v.data == nullptr && v.count != 0) {
      fail(2, std::string("the ") + role + " tensor has a null data pointer and " + std::to_string(v.count) +
                  " elements",
           "Pass allocated memory, or a tensor of 0 elements");
    }
  }

  void require_op(dtype t, reduce_op op) {
    if (!ok()) return;
    if (!is_valid(op)) {
      fail(3, "invalid reduce_op (value " + std::to_string(static_cast<int>(op)) + ")",
           "Use one of herd::reduce_op's values");
    } else if (!supports(t, op)) {
      fail(4, std::string("reduce_op::") + std::string(name(op)) + " is not defined on dtype " +
                  std::string(name(t)),
           "The bitwise ops band, bor and bxor take integer dtypes only; use sum, avg, min, max or prod");
    }
  }

  // `reachable` and `advice` come from detail::reaches and detail::unreachable_advice (dispatch.hpp).
  void require_reachable(const char* role, const const_buffer_view& v, bool reachable, const std::string& advice) {
    if (!ok() || reachable) return;
    fail(5, std::string("the ") + role + " tensor lives on " + v.device.str() + ", which this communicator cannot reach",
         advice);
  }

  void require_same_device(const const_buffer_view& in, const const_buffer_view& out) {
    if (!ok() || in.device == out.device) return;
    fail(11, "the input lives on " + in.device.str() + " but the output on " + out.device.str(),
         "Put input and output on the same device");
  }

  void require_same_dtype(const const_buffer_view& in, const const_buffer_view& out) {
    if (!ok() || in.type == out.type) return;
    fail(6, "the input is " + std::string(name(in.type)) + " but the output is " + std::string(name(out.type)),
         "Pass input and output tensors of the same dtype");
  }

  void require_count(const char* role, std::size_t actual, std::size_t expected, const std::string& why) {
    if (!ok() || actual == expected) return;
    fail(7, std::string("the ") + role + " tensor has " + std::to_string(actual) + " elements but " +
                std::to_string(expected) + " are needed (" + why + ")",
         "Size the tensors as the collective requires");
  }

  // Any overlap between the two, except the one exact aliasing `allowed` (nullptr: none allowed).
  void require_disjoint(const const_buffer_view& in, const const_buffer_view& out, const void* allowed,
                        const char* allowed_text) {
    if (!ok() || in.bytes() == 0 || out.bytes() == 0) return;
    const auto* a = static_cast<const std::byte*>(in.data);
    const auto* b = static_cast<const std::byte*>(out.data);
    const bool overlap = a < b + out.bytes() && b < a + in.bytes();
    if (!overlap || (allowed != nullptr && in.data == allowed)) return;
    fail(8, "the input and output buffers overlap",
         std::string("Use separate buffers") + (allowed_text ? std::string(", or ") + allowed_text : std::string()));
  }

  void require_root(int root) {
    if (!ok() || (root >= 0 && root < size_)) return;
    fail(9, "root " + std::to_string(root) + " is out of range", "Pass a root in [0, " + std::to_string(size_) + ")");
  }

  // The views of the call's tensors. An adapter that rejects its tensor (a strided DLPack tensor,
  // say) becomes a local fault here, reported to the other ranks like any other.
  template <class T> buffer_view view(const char* role, T& t) {
    try {
      return view_of(t);
    } catch (const std::exception& e) {
      fail(10, std::string("the adapter of the ") + role + " tensor rejected it: " + e.what(), "");
      return {};
    }
  }
  template <class T> const_buffer_view const_view(const char* role, const T& t) {
    try {
      return const_view_of(t);
    } catch (const std::exception& e) {
      fail(10, std::string("the adapter of the ") + role + " tensor rejected it: " + e.what(), "");
      return {};
    }
  }

  [[noreturn]] void raise_local() const { raise({name(kind_), rank_, size_}, what_, todo_); }

 private:
  collective_kind kind_;
  int rank_;
  int size_;
  std::uint32_t code_ = 0;
  std::string what_;
  std::string todo_;
};

// The other ranks' words for a fault code of call_check.
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
    default: return "invalid arguments";
  }
}

// "rank 0: 100, rank 1: 128, rank 2: 100" (the first 16 ranks).
template <class Field>
std::string per_rank(const std::vector<signature>& all, Field field) {
  std::string text;
  for (std::size_t i = 0; i < all.size() && i < 16; ++i) {
    if (i) text += ", ";
    text += "rank " + std::to_string(i) + ": " + field(all[i]);
  }
  if (all.size() > 16) text += ", ...";
  return text;
}

// Raises on every rank if any rank's signature disagrees with the others or reports a fault.
inline void verify(const error_site& site, const signature& mine, const std::vector<signature>& all);

// The communicator small host messages (the argument checks) travel on: its control() when it
// has one (nccl_communicator moves device memory only), itself otherwise.
template <class C> auto& control_of(C& comm) {
  if constexpr (requires { comm.control(); }) return comm.control();
  else return comm;
}

// Runs the exchange (carrying `payload`, when given) and raises on every rank if anything is
// wrong anywhere. Returns every rank's payload; without a payload, and with the checks turned
// off, it exchanges nothing.
template <communicator C>
exchanged agree(C& comm, const signature& mine_in, const call_check& check, bool carries_payload = false,
                const void* payload = nullptr, std::size_t payload_bytes = 0) {
  signature mine = mine_in;
  mine.faulty = check.ok() ? 0 : 1;
  mine.fault_code = check.code();
  mine.segment_bytes = runtime::defaults().ring_segment_bytes;
  if (comm.size() == 1 || (!carries_payload && !runtime::defaults().check_arguments)) {
    if (!check.ok()) check.raise_local();
    return {};
  }
  exchanged all = exchange(control_of(comm), mine, check.ok() ? payload : nullptr, check.ok() ? payload_bytes : 0);
  if (!check.ok()) check.raise_local();
  verify({name(mine.kind), comm.rank(), comm.size()}, mine, all.signatures);
  return all;
}

inline void verify(const error_site& site, const signature& mine, const std::vector<signature>& all) {
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].magic != mine.magic) {
      raise(site, "rank " + std::to_string(i) + " runs a different herd build or is not in the same collective",
            "Build every rank from the same sources and call the same collectives in the same order");
    }
    if (all[i].faulty) {
      raise(site, "rank " + std::to_string(i) + " passed " + fault_text(all[i].fault_code) +
                      " (its own error says more)",
            "Fix the call on rank " + std::to_string(i) + "; every rank stops so that none waits forever");
    }
  }
  auto differs = [&](auto field) {
    for (const auto& s : all)
      if (field(s) != field(all[0])) return true;
    return false;
  };
  const std::string every = "Every rank must call the same collective with the same ";
  if (differs([](const signature& s) { return s.kind; })) {
    raise(site, "ranks called different collectives (" +
                    per_rank(all, [](const signature& s) { return std::string(name(s.kind)); }) + ")",
          "Every rank must call the same collectives in the same order");
  }
  if (differs([](const signature& s) { return s.type; })) {
    raise(site, "the dtype differs across ranks (" +
                    per_rank(all, [](const signature& s) { return std::string(name(s.type)); }) + ")",
          every + "dtype");
  }
  if (differs([](const signature& s) { return s.op; })) {
    raise(site, "the reduce_op differs across ranks (" +
                    per_rank(all, [](const signature& s) { return std::string(name(s.op)); }) + ")",
          every + "reduce_op");
  }
  if (differs([](const signature& s) { return s.count; })) {
    raise(site, "the element count differs across ranks (" +
                    per_rank(all, [](const signature& s) { return std::to_string(s.count); }) + ")",
          every + "number of elements");
  }
  if (differs([](const signature& s) { return s.root; })) {
    raise(site, "the root differs across ranks (" +
                    per_rank(all, [](const signature& s) { return std::to_string(s.root); }) + ")",
          every + "root");
  }
  if (differs([](const signature& s) { return s.layout; })) {
    raise(site, "the per-rank counts differ across ranks", every + "list of per-rank counts");
  }
  if (differs([](const signature& s) { return s.memory; })) {
    raise(site, "the tensors live on different kinds of device across ranks (" +
                    per_rank(all, [](const signature& s) { return std::string(s.memory == device::kind::cpu ? "cpu" : "cuda"); }) +
                    ")",
          "Every rank must pass host tensors, or every rank GPU tensors, to one collective");
  }
  if (differs([](const signature& s) { return s.segment_bytes; })) {
    raise(site, "the ring segment differs across ranks (" +
                    per_rank(all, [](const signature& s) { return std::to_string(s.segment_bytes); }) + " bytes)",
          "Give every rank the same HERD_RING_SEGMENT_BYTES (and the same herd::runtime::defaults())");
  }
}

// FNV-1a over the per-rank counts of an allgatherv.
inline std::uint64_t hash_counts(std::span<const std::size_t> counts) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t c : counts) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (static_cast<std::uint64_t>(c) >> (8 * byte)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace herd::detail
