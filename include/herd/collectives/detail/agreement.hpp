#ifndef HERD_COLLECTIVES_DETAIL_AGREEMENT_HPP
#define HERD_COLLECTIVES_DETAIL_AGREEMENT_HPP
// The arguments of a collective, checked on this rank (call_check) and then across ranks in the
// agreement its operation starts with (comm/detail/agreement.hpp): the dtype, reduce op, element
// count, root and device kind every rank passed, and whether each rank's arguments were valid. A
// disagreement or a bad argument on any rank then raises herd::error on every rank, each naming
// the ranks and values concerned, and the communicator stays usable.
//
// Small allreduces send their data along with the agreement and need no other message. For larger
// collectives the exchange can be turned off (HERD_CHECK_ARGUMENTS=0, on every rank alike): local
// checks still run then, and a bad argument on one rank aborts the communicator, which its
// peers learn at once; but a disagreement between ranks goes unnoticed until the data do not pair
// up (the watchdog reports the stall) or, if they happen to, gives wrong results.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace herd::detail {

// Accumulates the first local problem with a call's arguments, to be raised after the exchange.
class call_check {
 public:
  // A communicator of no ranks is one this rank is not a member of: no operation can start on it.
  call_check(op_kind kind, int rank, int size) : kind_(kind), rank_(rank), size_(size) {
    if (size < 1) raise_not_member(name(kind));
  }

  bool ok() const noexcept { return what_.empty(); }
  const std::string& what() const noexcept { return what_; }
  std::uint32_t code() const noexcept { return code_; }
  op_kind kind() const noexcept { return kind_; }

  // Records a problem (only the first one counts). `code` names it to the other ranks (fault_text).
  void fail(std::uint32_t code, std::string what, std::string todo) {
    if (!ok()) return;
    code_ = code;
    what_ = std::move(what);
    todo_ = std::move(todo);
  }

  void require_valid(const char* role, const const_buffer_view& v);

  void require_op(dtype t, reduce_op op);

  // `reachable` and `advice` come from detail::reaches and detail::unreachable_advice (dispatch.hpp).
  void require_reachable(const char* role, const const_buffer_view& v, bool reachable, const char* advice);

  void require_same_device(const const_buffer_view& in, const const_buffer_view& out);

  void require_same_dtype(const const_buffer_view& in, const const_buffer_view& out);

  void require_count(const char* role, std::size_t actual, std::size_t expected, const char* why);

  // Any overlap between the two, except the one exact aliasing `allowed` (nullptr: none allowed).
  void require_disjoint(const const_buffer_view& in, const const_buffer_view& out, const void* allowed,
                        const char* allowed_text);

  void require_root(int root);

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

  // This rank's own problem: agreed when the other ranks learnt of it in the exchange.
  [[noreturn]] void raise_local(bool agreed) const {
    const error_site site{name(kind_), rank_, size_};
    if (agreed) raise_agreed(site, what_, todo_);
    raise(site, what_, todo_);
  }

 private:
  op_kind kind_;
  int rank_;
  int size_;
  std::uint32_t code_ = 0;
  std::string what_;
  std::string todo_;
};

// call_check's checks: inline, or with HERD_SEPARATE_COMPILATION only in the program's
// implementation file (core/config.hpp).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE void call_check::require_valid(const char* role, const const_buffer_view& v) {
  if (!is_valid(v.type)) {
    fail(1, std::string("the ") + role + " tensor has an invalid dtype (value " +
                std::to_string(static_cast<int>(v.type)) + ")",
         "Return one of herd::dtype's values from tensor_traits::dtype");
  } else if (v.data == nullptr && v.count != 0) {
    fail(2, std::string("the ") + role + " tensor has a null data pointer and " + std::to_string(v.count) +
                " elements",
         "Pass allocated memory, or a tensor of 0 elements");
  } else if (v.count > std::numeric_limits<std::size_t>::max() / size_of(v.type)) {
    fail(13, std::string("the ") + role + " tensor's " + std::to_string(v.count) + " elements of " +
                 std::string(name(v.type)) + " overflow a byte count",
         "Check the size its tensor_traits::size returns");
  }
}

HERD_SEPARATE void call_check::require_op(dtype t, reduce_op op) {
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

HERD_SEPARATE void call_check::require_reachable(const char* role, const const_buffer_view& v, bool reachable,
                                                 const char* advice) {
  if (!ok() || reachable) return;
  fail(5, std::string("the ") + role + " tensor lives on " + v.device.str() + ", which this communicator cannot reach",
       advice);
}

HERD_SEPARATE void call_check::require_same_device(const const_buffer_view& in, const const_buffer_view& out) {
  if (!ok() || in.device == out.device) return;
  fail(11, "the input lives on " + in.device.str() + " but the output on " + out.device.str(),
       "Put input and output on the same device");
}

HERD_SEPARATE void call_check::require_same_dtype(const const_buffer_view& in, const const_buffer_view& out) {
  if (!ok() || in.type == out.type) return;
  fail(6, "the input is " + std::string(name(in.type)) + " but the output is " + std::string(name(out.type)),
       "Pass input and output tensors of the same dtype");
}

HERD_SEPARATE void call_check::require_count(const char* role, std::size_t actual, std::size_t expected,
                                             const char* why) {
  if (!ok() || actual == expected) return;
  fail(7, std::string("the ") + role + " tensor has " + std::to_string(actual) + " elements but " +
              std::to_string(expected) + " are needed (" + why + ")",
       "Size the tensors as the collective requires");
}

HERD_SEPARATE void call_check::require_disjoint(const const_buffer_view& in, const const_buffer_view& out,
                                                const void* allowed, const char* allowed_text) {
  if (!ok() || in.bytes() == 0 || out.bytes() == 0) return;
  const auto* a = static_cast<const std::byte*>(in.data);
  const auto* b = static_cast<const std::byte*>(out.data);
  const bool overlap = a < b + out.bytes() && b < a + in.bytes();
  if (!overlap || (allowed != nullptr && in.data == allowed)) return;
  fail(8, "the input and output buffers overlap",
       std::string("Use separate buffers") + (allowed_text ? std::string(", or ") + allowed_text : std::string()));
}

HERD_SEPARATE void call_check::require_root(int root) {
  if (!ok() || (root >= 0 && root < size_)) return;
  fail(9, "root " + std::to_string(root) + " is out of range", "Pass a root in [0, " + std::to_string(size_) + ")");
}
#endif  // HERD_SEPARATE_DEFINITIONS

// Raises on every rank if the ranks passed different arguments.
HERD_SEPARATE void verify_arguments(const error_site& site, std::span<const signature> all);

// What every rank's signature says, raised on every rank where anything is wrong anywhere (this
// rank's own problem in its own words first).
template <communicator C>
void verify_agreement(C& comm, const signature& mine, const call_check& check, const exchanged& all) {
  const error_site site{name(mine.kind), comm.rank(), comm.size()};
  verify_identity(site, all.signatures, [&] {
    if (!check.ok()) check.raise_local(true);
  });
  verify_arguments(site, all.signatures);
}

// The agreement of the running operation of `comm`, carrying this rank's signature (`mine`: its
// arguments; the operation's identity and the protocol options are filled in here) and `payload`
// when given. Raises on every rank if anything is wrong anywhere; returns every rank's payload.
// Without a payload, and with the checks turned off, it exchanges nothing.
template <communicator C>
exchanged agree(C& comm, signature mine, const call_check& check, bool carries_payload = false,
                const void* payload = nullptr, std::size_t payload_bytes = 0) {
  stamp_identity(mine, comm.operations());
  mine.faulty = check.ok() ? 0 : 1;
  mine.fault_code = check.code();
  // Without argument checks a rank's own problem is not exchanged (its peers may not be in an
  // exchange at all): it raises here, and the abort that follows tells the peers at once.
  if (!check.ok() && !comm.options().check_arguments && comm.size() > 1) check.raise_local(false);
  if (comm.size() == 1 || (!carries_payload && !comm.options().check_arguments)) {
    if (!check.ok()) check.raise_local(comm.size() == 1);
    return {};
  }
  const trace::span phase(comm.operations().track(), "agreement");
  exchanged all = exchange(control_of(comm), mine, check.ok() ? payload : nullptr, check.ok() ? payload_bytes : 0);
  verify_agreement(comm, mine, check, all);
  return all;
}

// The agreement as the first step of a collective through the node's shared memory (`node`, the
// whole communicator's, more than one rank): `write(t)` fills this rank's buffer of that step (t)
// with the collective's first data (shm_allreduce's first slice), so that the data and the
// signatures cross in one synchronization instead of one each. Nobody reads the buffers before
// every signature is verified; a rank whose own arguments are bad writes nothing. It always
// exchanges, checks or not, as the data must cross anyway; with the checks off its step pairs with
// the peers' as the collective's own steps do (the whole operation: a peer in another collective,
// which exchanges no signature then, is named as such). Returns the step's ticket.
template <communicator C, class Write>
std::uint64_t agree_with_step(C& comm, shm_node& node, signature mine, const call_check& check, Write&& write) {
  stamp_identity(mine, comm.operations());
  mine.faulty = check.ok() ? 0 : 1;
  mine.fault_code = check.code();
  const bool checks = comm.options().check_arguments;
  if (!check.ok() && !checks) check.raise_local(false);  // as agree()
  const trace::span phase(comm.operations().track(), "agreement");
  const exchanged all = shm_exchange(
      comm, node, mine, 0,
      [&](std::uint64_t t) {
        if (check.ok()) write(t);
      },
      checks ? shm_node::pairing::number : shm_node::pairing::whole);
  verify_agreement(comm, mine, check, all);
  return node.ticket();
}

// FNV-1a over a list of numbers (the per-rank counts of an allgatherv, a grouped allreduce's tensors).
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

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void verify_arguments(const error_site& site, std::span<const signature> all) {
  const char* const every = "Every rank must call the same collective with the same ";
  if (all[0].kind == op_kind::grouped_allreduce && differs(all, [](const signature& s) { return s.layout; })) {
    raise_agreed(site, "the list of tensors (their number, sizes, dtypes or devices) differs across ranks",
                 std::string(every) + "list of tensors, in the same order");
  }
  if (differs(all, [](const signature& s) { return s.type; })) {
    raise_agreed(site, "the dtype differs across ranks (" +
                           per_rank(all, [](const signature& s) { return std::string(name(s.type)); }) + ")",
                 std::string(every) + "dtype");
  }
  if (differs(all, [](const signature& s) { return s.op; })) {
    raise_agreed(site, "the reduce_op differs across ranks (" +
                           per_rank(all, [](const signature& s) { return std::string(name(s.op)); }) + ")",
                 std::string(every) + "reduce_op");
  }
  if (differs(all, [](const signature& s) { return s.count; })) {
    raise_agreed(site, "the element count differs across ranks (" +
                           per_rank(all, [](const signature& s) { return std::to_string(s.count); }) + ")",
                 std::string(every) + "number of elements");
  }
  if (differs(all, [](const signature& s) { return s.root; })) {
    raise_agreed(site, "the root differs across ranks (" +
                           per_rank(all, [](const signature& s) { return std::to_string(s.root); }) + ")",
                 std::string(every) + "root");
  }
  if (differs(all, [](const signature& s) { return s.layout; })) {
    raise_agreed(site, "the per-rank counts differ across ranks", std::string(every) + "list of per-rank counts");
  }
  if (differs(all, [](const signature& s) { return s.memory; })) {
    raise_agreed(site, "the tensors live on different kinds of device across ranks (" +
                           per_rank(all, [](const signature& s) {
                             return std::string(s.memory == device::kind::cpu ? "cpu" : "cuda");
                           }) + ")",
                 "Every rank must pass host tensors, or every rank GPU tensors, to one collective");
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_AGREEMENT_HPP
