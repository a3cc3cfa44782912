#ifndef HERD_CORE_REDUCE_OP_HPP
#define HERD_CORE_REDUCE_OP_HPP
// Reduction operators and the per-element functions that apply them. The same functions run in
// herd's host loops and, compiled by nvcc, in its CUDA kernels.
//
// Semantics, identical on every dtype and every path:
// - sum, prod: in the element type. Integers wrap around (two's complement), like NCCL.
//   f16 and bf16 are combined in float and rounded back once per combination.
// - avg: the sum, then divided by the number of ranks. On floating-point types the division is
//   exact-rounded (x / n); on integer types it is C++ integer division, which truncates toward
//   zero, applied to the wrapped sum: avg of {1, 2} on i32 is 1, avg of {-1, -2} is -1.
// - min, max: a NaN on any rank gives NaN.
// - band, bor, bxor: bitwise, on integer types only (like MPI_BAND, MPI_BOR, MPI_BXOR).

#include <herd/core/dtype.hpp>

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace herd {

enum class reduce_op : std::uint8_t { sum, avg, min, max, prod, band, bor, bxor };

inline constexpr reduce_op all_reduce_ops[] = {reduce_op::sum, reduce_op::avg,  reduce_op::min, reduce_op::max,
                                               reduce_op::prod, reduce_op::band, reduce_op::bor, reduce_op::bxor};

constexpr bool is_valid(reduce_op op) noexcept {
  return static_cast<std::uint8_t>(op) <= static_cast<std::uint8_t>(reduce_op::bxor);
}

constexpr std::string_view name(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::prod: return "prod";
    case reduce_op::band: return "band";
    case reduce_op::bor: return "bor";
    case reduce_op::bxor: return "bxor";
  }
  return "invalid reduce_op";
}

constexpr bool is_bitwise(reduce_op op) noexcept {
  return op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
}

// Whether herd can reduce `t` with `op`: every valid pair except bitwise operators on floats.
constexpr bool supports(dtype t, reduce_op op) noexcept {
  return is_valid(t) && is_valid(op) && (is_integral(t) || !is_bitwise(op));
}

namespace detail {

// The type the arithmetic of T happens in: float for the 16-bit floats, an unsigned type of the
// same width for integers (so that overflow wraps instead of being undefined).
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<half> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };
template <> struct compute_type<std::int8_t> { using type = std::uint8_t; };
template <> struct compute_type<std::int32_t> { using type = std::uint32_t; };
template <> struct compute_type<std::int64_t> { using type = std::uint64_t; };
template <class T> using compute_type_t = typename compute_type<T>::type;

template <class T> HERD_HOST_DEVICE inline compute_type_t<T> widen(T x) noexcept {
  return static_cast<compute_type_t<T>>(x);
}
template <class T, class C> HERD_HOST_DEVICE inline T narrow(C x) noexcept {
  return static_cast<T>(x);  // for integers: modular since C++20
}

template <class T> HERD_HOST_DEVICE inline bool is_nan(T x) noexcept {
  if constexpr (std::is_integral_v<T>) {
    (void)x;
    return false;
  } else {
    const auto v = static_cast<compute_type_t<T>>(x);
    return v != v;
  }
}

}  // namespace detail

// combine<Op>{}(a, b): one element of a ∘ b. For avg this is the sum; finalize_avg divides.
template <reduce_op Op> struct combine {
  template <class T> HERD_HOST_DEVICE T operator()(T a, T b) const noexcept {
    using detail::narrow;
    using detail::widen;
    if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) {
      return narrow<T>(widen(a) + widen(b));
    } else if constexpr (Op == reduce_op::prod) {
      return narrow<T>(widen(a) * widen(b));
    } else if constexpr (Op == reduce_op::min || Op == reduce_op::max) {
      if (detail::is_nan(a)) return a;
      if (detail::is_nan(b)) return b;
      if constexpr (std::is_integral_v<T>) {  // compare in T itself, not in its wrapping type
        if constexpr (Op == reduce_op::min) return b < a ? b : a;
        else return a < b ? b : a;
      } else {
        const auto x = widen(a);
        const auto y = widen(b);
        if constexpr (Op == reduce_op::min) return y < x ? b : a;
        else return x < y ? b : a;
      }
    } else if constexpr (Op == reduce_op::band) {
      return narrow<T>(widen(a) & widen(b));
    } else if constexpr (Op == reduce_op::bor) {
      return narrow<T>(widen(a) | widen(b));
    } else {
      static_assert(Op == reduce_op::bxor);
      return narrow<T>(widen(a) ^ widen(b));
    }
  }
};

// The last step of avg: the sum divided by the number of ranks `n` (see the note at the top).
template <class T> HERD_HOST_DEVICE inline T finalize_avg(T sum, int n) noexcept {
  if constexpr (std::is_integral_v<T>) {
    if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<std::int64_t>(sum) / n);
    else return static_cast<T>(static_cast<std::uint64_t>(sum) / static_cast<std::uint64_t>(n));
  } else {
    using C = detail::compute_type_t<T>;
    return static_cast<T>(static_cast<C>(sum) / static_cast<C>(n));
  }
}

}  // namespace herd

#endif  // HERD_CORE_REDUCE_OP_HPP
