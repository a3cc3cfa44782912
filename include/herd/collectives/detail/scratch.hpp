#ifndef HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
#define HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
// Reusable per-thread staging memory, so that a collective in a training loop allocates nothing
// (and takes no page faults) after its first call.

#include <cstddef>
#include <memory>

namespace herd::detail {

// Up to four independent buffers per thread; `which` picks one (0: the ring's receive slots, 1 and 2:
// reduce_scatter's partial results, 3: a grouped allreduce's fusion buffer). The memory is uninitialized and
// stays valid until the next call with the same `which` on this thread.
inline std::byte* scratch(std::size_t bytes, int which = 0) {
  struct buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;
  };
  thread_local buffer buffers[4];
  buffer& b = buffers[which];
  if (b.capacity < bytes) {
    b.data.reset(new std::byte[bytes]);
    b.capacity = bytes;
  }
  return b.data.get();
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_SCRATCH_HPP
