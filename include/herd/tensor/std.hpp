#ifndef HERD_TENSOR_STD_HPP
#define HERD_TENSOR_STD_HPP
// tensor_traits for std::vector, std::array and std::span of herd's element types
// (float, double, herd::half, herd::bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::int64_t).

#include <herd/tensor/traits.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace herd {

template <element T, class Allocator> struct tensor_traits<std::vector<T, Allocator>> {
  static void* data(std::vector<T, Allocator>& v) noexcept { return v.data(); }
  static const void* data(const std::vector<T, Allocator>& v) noexcept { return v.data(); }
  static std::size_t size(const std::vector<T, Allocator>& v) noexcept { return v.size(); }
  static herd::dtype dtype(const std::vector<T, Allocator>&) noexcept { return dtype_of_v<T>; }
  static herd::device device(const std::vector<T, Allocator>&) noexcept { return herd::device::cpu(); }
};

// std::array<const T, N> is read-only, as std::span<const T> is.
template <element T, std::size_t N> struct tensor_traits<std::array<T, N>> {
  static auto* data(std::array<T, N>& a) noexcept {
    if constexpr (std::is_const_v<T>) return static_cast<const void*>(a.data());
    else return static_cast<void*>(a.data());
  }
  static const void* data(const std::array<T, N>& a) noexcept { return a.data(); }
  static std::size_t size(const std::array<T, N>&) noexcept { return N; }
  static herd::dtype dtype(const std::array<T, N>&) noexcept { return dtype_of_v<T>; }
  static herd::device device(const std::array<T, N>&) noexcept { return herd::device::cpu(); }
};

// std::span<const T> is read-only: usable as an input, refused (at compile time) as an output.
template <element T, std::size_t Extent> struct tensor_traits<std::span<T, Extent>> {
  static auto* data(const std::span<T, Extent>& s) noexcept {
    if constexpr (std::is_const_v<T>) return static_cast<const void*>(s.data());
    else return static_cast<void*>(s.data());
  }
  static std::size_t size(const std::span<T, Extent>& s) noexcept { return s.size(); }
  static herd::dtype dtype(const std::span<T, Extent>&) noexcept { return dtype_of_v<T>; }
  static herd::device device(const std::span<T, Extent>&) noexcept { return herd::device::cpu(); }
};

}  // namespace herd

#endif  // HERD_TENSOR_STD_HPP
