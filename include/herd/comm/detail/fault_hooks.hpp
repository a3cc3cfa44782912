#ifndef HERD_COMM_DETAIL_FAULT_HOOKS_HPP
#define HERD_COMM_DETAIL_FAULT_HOOKS_HPP
// Tests only: four points where a test can make this process misbehave in the middle of an
// operation (stall, throw), on every path herd has. Unset (the default) they cost one load and one
// predictable branch. Not for production use: nothing else in herd sets them.
// - shm_step_hook: called with each step's ticket before this process publishes it in a node's
//   shared memory (an agreement's header or a slice of data).
// - post_hook: called before an mpi_communicator posts a message on one of herd's own tags (an
//   agreement's exchange, or an operation's data), with the tag and whether it is a receive; on the
//   thread that runs the operation (the progress thread for asynchronous ones).
// - shrink_hook: called with this rank's number in the communicator it shrinks, after it heard
//   who stays and before it proposes them to the others.
// - pack_hook: called with this rank's number and a bucket's index before the gradient reducer
//   packs that bucket (where a GPU may run out of memory for it).

#include <cstddef>
#include <cstdint>

namespace herd::detail {

using shm_hook = void (*)(std::uint64_t ticket);
inline shm_hook& shm_step_hook() noexcept {
  static shm_hook hook = nullptr;
  return hook;
}

using message_hook = void (*)(int tag, bool receiving);
inline message_hook& post_hook() noexcept {
  static message_hook hook = nullptr;
  return hook;
}

using rank_hook = void (*)(int rank);
inline rank_hook& shrink_hook() noexcept {
  static rank_hook hook = nullptr;
  return hook;
}

using bucket_hook = void (*)(int rank, std::size_t bucket);
inline bucket_hook& pack_hook() noexcept {
  static bucket_hook hook = nullptr;
  return hook;
}

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_FAULT_HOOKS_HPP
