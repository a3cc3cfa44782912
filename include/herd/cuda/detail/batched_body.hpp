#ifndef HERD_CUDA_DETAIL_BATCHED_BODY_HPP
#define HERD_CUDA_DETAIL_BATCHED_BODY_HPP
// The body of herd's batched copy: many tensors packed into (or unpacked from) one fusion buffer
// in a single kernel launch, each element cast and scaled on the way. Work is cut into blocks of
// `elements_per_block` elements of one tensor; block b reads its tensor's index from a table the
// host made with the descriptors (batch_block_entries), and its threads share that block's range.
// (A binary search over the tensors' first blocks, which this table replaced, is about ten
// dependent loads before a block's first copy: with 1000 tensors it left the pack of 64 MiB at
// 0.68 of a device copy on an H200.)

#include <herd/core/config.hpp>
#include <herd/cuda/detail/elementwise_body.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace herd::cuda::detail {

struct batch_entry {
  const void* in;
  void* out;
  std::uint64_t count;        // elements
  std::uint64_t first_block;  // blocks of the tensors before this one
};

struct batch_args {
  const batch_entry* entries;
  const std::uint32_t* entry_of_block;  // the entry each block belongs to
  std::uint64_t elements_per_block;
  double scale;
};

// Thread `thread` of `threads` in block `block`: D and S are the element types of out and in
// (the same type and a scale of 1 take the byte-copy path).
template <class D, class S>
HERD_HOST_DEVICE void batch_thread(const batch_args& a, std::uint64_t block, std::size_t thread, std::size_t threads) {
  const batch_entry& e = a.entries[a.entry_of_block[block]];
  const std::uint64_t begin = (block - e.first_block) * a.elements_per_block;
  if (begin >= e.count) return;
  const std::uint64_t n = e.count - begin < a.elements_per_block ? e.count - begin : a.elements_per_block;
  if constexpr (std::is_same_v<D, S>) {
    if (a.scale == 1.0) {
      copy_thread({static_cast<std::byte*>(e.out) + begin * sizeof(D), static_cast<const std::byte*>(e.in) + begin * sizeof(S),
                   n * sizeof(D)},
                  thread, threads);
      return;
    }
  }
  cast_thread<D, S>({static_cast<D*>(e.out) + begin, static_cast<const S*>(e.in) + begin, n, a.scale}, thread, threads);
}

// Blocks a tensor of `count` elements needs.
HERD_HOST_DEVICE inline std::uint64_t batch_blocks(std::uint64_t count, std::uint64_t elements_per_block) {
  return count == 0 ? 0 : (count + elements_per_block - 1) / elements_per_block;
}

// The entry each block belongs to, for entries in order of their first blocks (batch_args).
HERD_SEPARATE std::vector<std::uint32_t> batch_block_entries(std::span<const batch_entry> entries,
                                                             std::uint64_t elements_per_block);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::vector<std::uint32_t> batch_block_entries(std::span<const batch_entry> entries,
                                                             std::uint64_t elements_per_block) {
  std::vector<std::uint32_t> owner;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    owner.resize(entries[i].first_block + batch_blocks(entries[i].count, elements_per_block), static_cast<std::uint32_t>(i));
  }
  return owner;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::cuda::detail

#endif  // HERD_CUDA_DETAIL_BATCHED_BODY_HPP
