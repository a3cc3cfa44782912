#ifndef HERD_TENSOR_THRUST_HPP
#define HERD_TENSOR_THRUST_HPP
// tensor_traits for thrust::device_vector (on the GPU that holds its memory) and
// thrust::host_vector. Thrust needs nvcc, so this header is empty to other compilers.

#include <herd/core/config.hpp>
#include <herd/cuda/error.hpp>
#include <herd/tensor/traits.hpp>

#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>

#include <cstddef>

namespace herd {
namespace detail {

// The GPU that owns `p`; the current one for an empty vector.
inline int device_of(const void* p) {
  int device = 0;
  if (p == nullptr) {
    HERD_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }
  cudaPointerAttributes attributes{};
  HERD_CUDA_CHECK(cudaPointerGetAttributes(&attributes, p));
  return attributes.device;
}

}  // namespace detail

template <element T, class Allocator> struct tensor_traits<thrust::device_vector<T, Allocator>> {
  using vector = thrust::device_vector<T, Allocator>;
  static void* data(vector& v) { return thrust::raw_pointer_cast(v.data()); }
  static std::size_t size(const vector& v) { return v.size(); }
  static herd::dtype dtype(const vector&) { return dtype_of_v<T>; }
  static herd::device device(const vector& v) {
    return herd::device::cuda(detail::device_of(v.empty() ? nullptr : thrust::raw_pointer_cast(v.data())));
  }
};

template <element T, class Allocator> struct tensor_traits<thrust::host_vector<T, Allocator>> {
  using vector = thrust::host_vector<T, Allocator>;
  static void* data(vector& v) { return thrust::raw_pointer_cast(v.data()); }
  static std::size_t size(const vector& v) { return v.size(); }
  static herd::dtype dtype(const vector&) { return dtype_of_v<T>; }
  static herd::device device(const vector&) { return herd::device::cpu(); }
};

}  // namespace herd
#endif

#endif  // HERD_TENSOR_THRUST_HPP
