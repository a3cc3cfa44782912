#ifndef HERD_COMM_COMMUNICATOR_HPP
#define HERD_COMM_COMMUNICATOR_HPP
// The communicator concept: what herd's collectives need from a transport. Three ship with herd:
// mpi_communicator (processes, over MPI), local_communicator (threads of one process) and
// nccl_communicator (GPUs).
//
// A communicator moves bytes between ranks 0..size()-1 with nonblocking point-to-point messages.
// Messages between one pair of ranks with one tag arrive in the order they were sent (MPI's
// non-overtaking rule), which the pipelined ring collectives rely on.
//
// Every collective is an operation of its communicator (comm/detail/operation.hpp): it has the
// communicator's next sequence number, starts with a cross-rank agreement, and, if it fails after
// that agreement, aborts the communicator. operations() holds that state; abort() runs the
// transport's part of an abort (telling the peers, settling requests still in flight).
//
// split(herd::no_color, key) leaves a rank out, as MPI_UNDEFINED does (so does a subset() that does
// not list it): what it gets back is not a member (is_member() false, rank() -1, size() 0), and
// every operation on it raises herd::error.

#include <herd/comm/detail/operation_state.hpp>
#include <herd/core/config.hpp>
#include <herd/core/device.hpp>
#include <herd/core/error.hpp>
#include <herd/runtime/env.hpp>

#include <concepts>
#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace herd {

// The color that leaves a rank out of split(). Other negative colors are an error on every rank.
inline constexpr int no_color = std::numeric_limits<int>::min();

template <class C>
concept communicator = std::movable<C> && requires(C& c, const C& cc, typename C::request& req, void* buf,
                                                   const void* cbuf, std::size_t bytes, int peer, int tag,
                                                   std::string_view reason) {
  typename C::request;
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.options() } -> std::convertible_to<const comm_options&>;
  { c.isend(cbuf, bytes, peer, tag) } -> std::same_as<typename C::request>;
  { c.irecv(buf, bytes, peer, tag) } -> std::same_as<typename C::request>;
  c.wait(req);
  { c.test(req) } -> std::convertible_to<bool>;
  c.sendrecv(cbuf, bytes, peer, buf, bytes, peer, tag);
  { cc.split(0, 0) } -> std::same_as<C>;
  { cc.supports(herd::device::cpu()) } -> std::convertible_to<bool>;
  { c.operations() } -> std::same_as<detail::operation_state&>;
  { c.abort(reason) } noexcept;
};

namespace detail {

// What every operation on a communicator this rank is not a member of raises.
[[noreturn]] inline void raise_not_member(std::string_view operation) {
  raise({operation, -1, 0},
        "this rank is not a member of this communicator (split() left it out with herd::no_color, or subset() did not "
        "list it)",
        "Call operations only on communicators this rank belongs to; comm.is_member() tells");
}

HERD_SEPARATE void check_peer(const char* operation, int rank, int size, int peer);

// Raises if a peer of `comm` aborted its running operation or left (for waits a collective
// makes itself rather than through comm.wait).
template <class C>
  requires requires(C& c) { c.check_peers(); }
void check_peers_of(C& comm) {
  if (comm.operations().in_operation()) comm.check_peers();
}
template <class C> void check_peers_of(C&) {}

inline void check_buffer(const char* operation, int rank, int size, const void* data, std::size_t bytes) {
  if (data == nullptr && bytes != 0) {
    raise({operation, rank, size}, "null buffer with " + std::to_string(bytes) + " bytes",
          "Pass a valid pointer, or a byte count of 0");
  }
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void check_peer(const char* operation, int rank, int size, int peer) {
  if (peer < 0 || peer >= size) {
    raise({operation, rank, size}, "peer rank " + std::to_string(peer) + " is out of range",
          "Use a rank in [0, " + std::to_string(size) + ")");
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail
}  // namespace herd

#endif  // HERD_COMM_COMMUNICATOR_HPP
