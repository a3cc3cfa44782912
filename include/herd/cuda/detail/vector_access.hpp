#pragma once
// Wide memory access for the kernels: V elements moved as one aligned 4-, 8- or 16-byte word
// (a single vector load or store on the GPU), and the arithmetic that finds where a range of
// elements becomes aligned. Host-callable, so that tests can run the kernels' bodies on the CPU.

#include <herd/core/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace herd::cuda::detail {

// V elements of T, aligned to their combined size (at most 16 bytes).
template <class T, std::size_t V> struct alignas(sizeof(T) * V) lanes {
  T v[V];
};

template <class T, std::size_t V> HERD_HOST_DEVICE inline lanes<T, V> load_lanes(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const lanes<T, V>*>(p);
#else
  lanes<T, V> r;
  std::memcpy(static_cast<void*>(&r), p, sizeof r);
  return r;
#endif
}

template <class T, std::size_t V> HERD_HOST_DEVICE inline void store_lanes(T* p, const lanes<T, V>& value) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<lanes<T, V>*>(p) = value;
#else
  std::memcpy(static_cast<void*>(p), &value, sizeof value);
#endif
}

HERD_HOST_DEVICE inline std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Elements of `element_bytes` to step over from `p` until it is a multiple of `alignment`;
// `alignment` when that never happens (p not even element-aligned).
HERD_HOST_DEVICE inline std::size_t steps_to_alignment(const void* p, std::size_t element_bytes, std::size_t alignment) {
  const std::size_t misalignment = address(p) % alignment;
  if (misalignment == 0) return 0;
  const std::size_t gap = alignment - misalignment;
  return gap % element_bytes == 0 ? gap / element_bytes : alignment;
}

}  // namespace herd::cuda::detail
