#pragma once
// The communicator concept: what herd's collectives need from a transport. Two ship with herd:
// mpi_communicator (processes, over MPI) and local_communicator (threads of one process).
//
// A communicator moves bytes between ranks 0..size()-1 with nonblocking point-to-point messages.
// Messages between one pair of ranks with one tag arrive in the order they were sent (MPI's
// non-overtaking rule), which the pipelined ring collectives rely on.

#include <herd/core/device.hpp>
#include <herd/core/error.hpp>
#include <herd/runtime/env.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <string>

namespace herd {

template <class C>
concept communicator = std::movable<C> && requires(C& c, const C& cc, typename C::request& req, void* buf,
                                                   const void* cbuf, std::size_t bytes, int peer, int tag) {
  typename C::request;
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.isend(cbuf, bytes, peer, tag) } -> std::same_as<typename C::request>;
  { c.irecv(buf, bytes, peer, tag) } -> std::same_as<typename C::request>;
  c.wait(req);
  { c.test(req) } -> std::convertible_to<bool>;
  c.sendrecv(cbuf, bytes, peer, buf, bytes, peer, tag);
  c.barrier();
  { cc.split(0, 0) } -> std::same_as<C>;
  { cc.supports(herd::device::cpu()) } -> std::convertible_to<bool>;
};

// Tags at and above this value belong to herd's collectives; point-to-point calls of the user
// take tags in [0, reserved_tag_base). MPI guarantees tags up to 32767.
inline constexpr int reserved_tag_base = 1 << 14;

namespace detail {
// One tag per kind of internal message, so that no two of them can ever be matched by mistake.
enum class tag : int {
  barrier = reserved_tag_base,
  split,
  agreement,
  reduce_scatter,
  allgather,
  broadcast,
  small_allreduce,
};
constexpr int tag_value(tag t) noexcept { return static_cast<int>(t); }
}  // namespace detail

// How long a rank waits for a peer before it warns, and before it gives up with herd::error.
struct comm_options {
  double stall_check_seconds = runtime::defaults().stall_check_seconds;
  double stall_shutdown_seconds = runtime::defaults().stall_shutdown_seconds;
};

namespace detail {

// Watches one wait: warns once on stderr after stall_check_seconds, throws after
// stall_shutdown_seconds (when non-zero), naming the peer this rank is waiting for.
class stall_watch {
 public:
  explicit stall_watch(const comm_options& options) noexcept
      : options_(options), start_(std::chrono::steady_clock::now()) {}

  void check(int rank, int size, int peer, bool receiving, int tag) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    // peer -1: waiting for every rank (a barrier); -2: for this rank's GPU stream.
    const std::string waiting_for =
        peer == -1   ? std::string("in a barrier for the other ranks")
        : peer == -2 ? std::string("for its GPU stream (a NCCL operation)")
                     : std::string("to ") + (receiving ? "receive from" : "send to") + " rank " + std::to_string(peer) +
                           (tag >= reserved_tag_base ? std::string(" inside a collective")
                                                     : " (tag " + std::to_string(tag) + ")");
    const std::string what =
        "rank " + std::to_string(rank) + " has waited " + std::to_string(static_cast<int>(waited)) + " s " + waiting_for;
    if (options_.stall_shutdown_seconds > 0 && waited >= options_.stall_shutdown_seconds) {
      raise({"wait", rank, size}, what + " and gives up (HERD_STALL_SHUTDOWN_TIME_SECONDS=" +
                                      std::to_string(options_.stall_shutdown_seconds) + ")",
            "Every rank must call the same collectives in the same order; check that no rank skipped one, "
            "ran out of data early, or is stuck elsewhere");
    }
    if (!warned_ && options_.stall_check_seconds > 0 && waited >= options_.stall_check_seconds) {
      warned_ = true;
      std::fprintf(stderr,
                   "herd warning: %s. A rank may have skipped a collective, called them in another order, or be "
                   "stuck; set HERD_STALL_SHUTDOWN_TIME_SECONDS to turn this into an error.\n",
                   what.c_str());
    }
  }

 private:
  comm_options options_;
  std::chrono::steady_clock::time_point start_;
  bool warned_ = false;
};

inline void check_peer(const char* operation, int rank, int size, int peer) {
  if (peer < 0 || peer >= size) {
    raise({operation, rank, size}, "peer rank " + std::to_string(peer) + " is out of range",
          "Use a rank in [0, " + std::to_string(size) + ")");
  }
}

inline void check_buffer(const char* operation, int rank, int size, const void* data, std::size_t bytes) {
  if (data == nullptr && bytes != 0) {
    raise({operation, rank, size}, "null buffer with " + std::to_string(bytes) + " bytes",
          "Pass a valid pointer, or a byte count of 0");
  }
}

}  // namespace detail
}  // namespace herd
