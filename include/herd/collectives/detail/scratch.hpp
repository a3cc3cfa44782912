#ifndef HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
#define HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
// Reusable per-thread staging memory, so that a collective in a training loop allocates nothing
// (and takes no page faults) after its first call.

#include <cstddef>
#include <memory>

namespace herd::detail {

// The buffers, one per slot and thread. A slot's memory stays valid until the next take of the same
// slot on this thread, so a function must not call one that takes a slot it still uses: every slot
// and its takers are listed here, where two takers of one slot in one call chain show.
enum class scratch_slot : int {
  // Messages inside a transport: the ring's receive windows (detail/ring.hpp), a tree's subtree
  // blocks (detail/rooted.hpp). They take no other slot.
  transit = 0,
  // A collective's staging around its transports: blocks in relative order (gather, scatter) or as
  // gathered (reduce's small path); the first of reduce-scatter's two alternating partial results
  // (reduce_scatter, reduce's large path).
  staging = 1,
  // The second of those partial results.
  alternate = 2,
  // What a collective keeps while its transports and staging run: a grouped allreduce's fusion
  // buffer (allreduce.hpp), the reduced chunk of a non-root rank in reduce's large path.
  kept = 3,
};
inline constexpr int scratch_slots = 4;

// Uninitialized memory of at least `bytes` bytes in `slot` (see scratch_slot).
inline std::byte* scratch(std::size_t bytes, scratch_slot slot) {
  struct buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };
  thread_local buffer buffers[scratch_slots];
  buffer& b = buffers[static_cast<int>(slot)];
  if (b.capacity < bytes) {
    b.data.reset(new std::byte[bytes]);
    b.capacity = bytes;
  }
  return b.data.get();
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
