#ifndef HERD_CORE_DTYPE_HPP
#define HERD_CORE_DTYPE_HPP
// The element types herd moves and reduces.

#include <herd/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace herd {

enum class dtype : std::uint8_t { f16, bf16, f32, f64, i8, u8, i32, i64 };

inline constexpr dtype all_dtypes[] = {dtype::f16, dtype::bf16, dtype::f32, dtype::f64,
                                       dtype::i8,  dtype::u8,   dtype::i32, dtype::i64};

// False for a value outside the enumeration (a cast from a corrupt integer, say).
constexpr bool is_valid(dtype t) noexcept { return static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(dtype::i64); }

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::f32: case dtype::i32: return 4;
    case dtype::f64: case dtype::i64: return 8;
    case dtype::i8: case dtype::u8: return 1;
  }
  return 0;
}

constexpr std::string_view name(dtype t) noexcept {
  switch (t) {
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::i8: return "i8";
    case dtype::u8: return "u8";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
  }
  return "invalid dtype";
}

constexpr bool is_floating_point(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 || t == dtype::f32 || t == dtype::f64;
}
constexpr bool is_integral(dtype t) noexcept { return is_valid(t) && !is_floating_point(t); }

// dtype_of<T>: the dtype of a C++ element type; absent for types herd does not know.
template <class T> struct dtype_of {};
template <> struct dtype_of<half> : std::integral_constant<dtype, dtype::f16> {};
template <> struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of<std::int8_t> : std::integral_constant<dtype, dtype::i8> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <class T> struct dtype_of<const T> : dtype_of<T> {};
template <class T> inline constexpr dtype dtype_of_v = dtype_of<T>::value;

template <class T>
concept element = requires { dtype_of<T>::value; };

// element_type<D>: the C++ type of a dtype, for code that dispatches on a runtime dtype.
template <dtype D> struct element_type;
template <> struct element_type<dtype::f16> { using type = half; };
template <> struct element_type<dtype::bf16> { using type = bfloat16; };
template <> struct element_type<dtype::f32> { using type = float; };
template <> struct element_type<dtype::f64> { using type = double; };
template <> struct element_type<dtype::i8> { using type = std::int8_t; };
template <> struct element_type<dtype::u8> { using type = std::uint8_t; };
template <> struct element_type<dtype::i32> { using type = std::int32_t; };
template <> struct element_type<dtype::i64> { using type = std::int64_t; };
template <dtype D> using element_type_t = typename element_type<D>::type;

// Calls fn(T{}) with the element type of `t`: the one place a runtime dtype becomes a C++ type.
// The caller checks is_valid(t) first.
template <class Fn>
constexpr decltype(auto) visit(dtype t, Fn&& fn) {
  switch (t) {
    case dtype::f16: return fn(half{});
    case dtype::bf16: return fn(bfloat16{});
    case dtype::f32: return fn(float{});
    case dtype::f64: return fn(double{});
    case dtype::i8: return fn(std::int8_t{});
    case dtype::u8: return fn(std::uint8_t{});
    case dtype::i32: return fn(std::int32_t{});
    case dtype::i64: break;
  }
  return fn(std::int64_t{});
}

}  // namespace herd

#endif  // HERD_CORE_DTYPE_HPP
