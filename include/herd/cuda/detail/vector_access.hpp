#ifndef HERD_CUDA_DETAIL_VECTOR_ACCESS_HPP
#define HERD_CUDA_DETAIL_VECTOR_ACCESS_HPP
// Wide memory access for the kernels: V elements moved as one aligned 4-, 8- or 16-byte word
// (a single vector load or store on the GPU), and the arithmetic that finds where a range of
// elements becomes aligned. Host-callable, so that tests can run the kernels' bodies on the CPU.
// On the CPU the accesses model the GPU's rule: a vector access at an address that is not a
// multiple of its size faults there (cudaErrorMisalignedAddress), so it throws here, and a body
// that would fault on the GPU fails its tests on any machine.

#include <herd/core/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#if !defined(__CUDA_ARCH__)
#include <herd/core/error.hpp>

#include <string>
#endif

namespace herd::cuda::detail {

// V elements of T, aligned to their combined size (at most 16 bytes).
template <class T, std::size_t V> struct alignas(sizeof(T) * V) lanes {
  T v[V];
};

HERD_HOST_DEVICE inline std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

#if !defined(__CUDA_ARCH__)
// The GPU's alignment rule, checked where the host runs a kernel's body.
HERD_SEPARATE void require_vector_alignment(const void* p, std::size_t bytes, const char* access);
#endif

// Bytes this thread has loaded with vector accesses on the host, in all and in 16-byte ones:
// lets tests see which path a body took. (Host code only; declared in nvcc's device pass too,
// where the tests' host functions are also read.)
struct vector_loads {
  std::size_t bytes = 0;
  std::size_t wide_bytes = 0;
};
inline vector_loads& host_vector_loads() noexcept {
  thread_local vector_loads loads;
  return loads;
}

template <class T, std::size_t V> HERD_HOST_DEVICE inline lanes<T, V> load_lanes(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const lanes<T, V>*>(p);
#else
  require_vector_alignment(p, sizeof(lanes<T, V>), "load");
  host_vector_loads().bytes += sizeof(lanes<T, V>);
  if (sizeof(lanes<T, V>) == 16) host_vector_loads().wide_bytes += 16;
  lanes<T, V> r;
  std::memcpy(static_cast<void*>(&r), p, sizeof r);
  return r;
#endif
}

template <class T, std::size_t V> HERD_HOST_DEVICE inline void store_lanes(T* p, const lanes<T, V>& value) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<lanes<T, V>*>(p) = value;
#else
  require_vector_alignment(p, sizeof value, "store");
  std::memcpy(static_cast<void*>(p), &value, sizeof value);
#endif
}

// What steps_to_alignment answers when stepping whole elements never reaches the alignment
// (p is not even element-aligned): larger than any element count, so that every caller's
// `head >= n` sends the whole range down the element-by-element path.
inline constexpr std::size_t never_aligned = SIZE_MAX;

// Elements of `element_bytes` to step over from `p` until it is a multiple of `alignment`, or
// never_aligned.
HERD_HOST_DEVICE inline std::size_t steps_to_alignment(const void* p, std::size_t element_bytes, std::size_t alignment) {
  const std::size_t misalignment = address(p) % alignment;
  if (misalignment == 0) return 0;
  const std::size_t gap = alignment - misalignment;
  return gap % element_bytes == 0 ? gap / element_bytes : never_aligned;
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void require_vector_alignment(const void* p, std::size_t bytes, const char* access) {
  if (address(p) % bytes == 0) return;
  herd::detail::raise({"cuda kernel body"},
                      std::string("misaligned ") + std::to_string(bytes) + "-byte vector " + access + " at address " +
                          std::to_string(address(p)) + " (" + std::to_string(address(p) % bytes) +
                          " bytes past a boundary): a GPU faults here with cudaErrorMisalignedAddress",
                      "The kernel's head/tail split must reach an aligned address before its vector loop");
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::cuda::detail

#endif  // HERD_CUDA_DETAIL_VECTOR_ACCESS_HPP
