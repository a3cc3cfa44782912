#ifndef HERD_CORE_HALF_HPP
#define HERD_CORE_HALF_HPP
// Host (and device) storage types for IEEE binary16 and bfloat16, with round-to-nearest-even
// conversions from float that keep NaN a NaN, overflow to infinity, and round into subnormals.
// Arithmetic goes through float: herd only converts, compares and reduces these values.
// On the GPU the conversions are the hardware's (see "On the device" below).

#include <herd/core/config.hpp>

#include <cstdint>
#include <type_traits>
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// The dispatch below calls whatever converter it is given, on the host or the device.
#define HERD_ANY_CONVERTER _Pragma("nv_exec_check_disable")
#else
#define HERD_ANY_CONVERTER
#endif

namespace herd {
namespace detail {

HERD_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(std::uint32_t, f);
#endif
}

HERD_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

HERD_HOST_DEVICE inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // infinity, or NaN: keep the top payload bits and force a quiet NaN
    if (abs == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs < 0x38800000u) {  // below 2^-14, the smallest normal half: zero or a subnormal
    if (abs < 0x33000000u) return sign;  // under 2^-25: rounds to zero (2^-25 itself ties to even 0)
    const std::uint32_t exponent = abs >> 23;                   // 102..112
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;                // 14..24
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | result);
  }
  // Normal range: rebias the exponent (127 -> 15) and round 23 mantissa bits to 10. A carry out
  // of the mantissa bumps the exponent, and past the largest half it lands exactly on infinity.
  std::uint32_t rebiased = abs - 0x38000000u;
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);
  if (rebiased >= 0x0f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | (rebiased >> 13));
}

HERD_HOST_DEVICE inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

HERD_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  // bfloat16 keeps float's exponent, so one rounding of the low 16 bits covers normals,
  // subnormals and the overflow to infinity.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

HERD_HOST_DEVICE inline float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

// double -> float rounded to odd: when inexact, the neighbour of the exact value whose last bit
// is 1. A second rounding of that float to a type with at least two fewer mantissa bits (half,
// bfloat16) then equals one correct rounding of the double.
HERD_HOST_DEVICE inline float round_to_odd_float(double d) noexcept {
  const float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || f != f) return f;
  std::uint32_t bits = float_bits(f);
  if ((bits & 0x7f800000u) == 0x7f800000u || (bits & 1u)) return f;  // overflowed to infinity, or already odd
  const double magnitude_f = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
  const double magnitude_d = d < 0 ? -d : d;
  bits = magnitude_f > magnitude_d ? bits - 1u : bits + 1u;  // the neighbour on the other side of d
  return bits_float(bits);
}

// On the device: the hardware converts in one instruction (cvt.rn), where the functions above
// take about sixty. Its rounding is IEEE round-to-nearest-even, as theirs, so for every value
// but a NaN the bits are the same; a NaN's payload is not kept by the hardware, so NaNs take the
// software path (a branch that is almost never taken). The choice is written once, for any
// `hardware` converter, so that a host test can run it with the host's IEEE conversions in the
// hardware's place over every bit pattern.
HERD_ANY_CONVERTER
template <class Hardware> HERD_HOST_DEVICE inline std::uint16_t float_to_half_bits_with(float f, Hardware hardware) noexcept {
  return f != f ? float_to_half_bits(f) : hardware(f);
}
HERD_ANY_CONVERTER
template <class Hardware> HERD_HOST_DEVICE inline float half_bits_to_float_with(std::uint16_t h, Hardware hardware) noexcept {
  return (h & 0x7fffu) > 0x7c00u ? half_bits_to_float(h) : hardware(h);
}
HERD_ANY_CONVERTER
template <class Hardware>
HERD_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits_with(float f, Hardware hardware) noexcept {
  return f != f ? float_to_bfloat16_bits(f) : hardware(f);
}

#if defined(__CUDA_ARCH__)
struct device_half {
  __device__ std::uint16_t operator()(float f) const { return __half_as_ushort(__float2half_rn(f)); }
  __device__ float operator()(std::uint16_t h) const { return __half2float(__ushort_as_half(h)); }
};
struct device_bfloat16 {
  __device__ std::uint16_t operator()(float f) const { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
#endif

// The conversions half and bfloat16 use: the hardware's on the device, the software ones on the host.
HERD_HOST_DEVICE inline std::uint16_t to_half_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return float_to_half_bits_with(f, device_half{});
#else
  return float_to_half_bits(f);
#endif
}
HERD_HOST_DEVICE inline float from_half_bits(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  return half_bits_to_float_with(h, device_half{});
#else
  return half_bits_to_float(h);
#endif
}
HERD_HOST_DEVICE inline std::uint16_t to_bfloat16_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return float_to_bfloat16_bits_with(f, device_bfloat16{});
#else
  return float_to_bfloat16_bits(f);
#endif
}

// The hardware's conversions without the NaN check, for values that cannot be NaN (the kernels'
// vectors that hold no NaN and no infinity). On the host they model the GPU, NaNs included: its
// cvt gives the canonical NaN (0x7fff, 0x7fffffff in f32) whatever the payload, so that a host
// test sees a NaN that reached this path.
HERD_HOST_DEVICE inline std::uint16_t unchecked_half_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return device_half{}(f);
#else
  return f != f ? std::uint16_t{0x7fffu} : float_to_half_bits(f);
#endif
}
HERD_HOST_DEVICE inline float unchecked_half_to_float(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  return device_half{}(h);
#else
  return (h & 0x7fffu) > 0x7c00u ? bits_float(0x7fffffffu) : half_bits_to_float(h);
#endif
}
HERD_HOST_DEVICE inline std::uint16_t unchecked_bfloat16_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return device_bfloat16{}(f);
#else
  return f != f ? std::uint16_t{0x7fffu} : float_to_bfloat16_bits(f);
#endif
}

}  // namespace detail

// IEEE 754 binary16. Layout-compatible with CUDA's __half.
struct half {
  std::uint16_t bits = 0;

  half() = default;
  HERD_HOST_DEVICE explicit half(float f) noexcept : bits(detail::to_half_bits(f)) {}
  HERD_HOST_DEVICE explicit half(double d) noexcept : half(detail::round_to_odd_float(d)) {}
  HERD_HOST_DEVICE explicit operator float() const noexcept { return detail::from_half_bits(bits); }
  HERD_HOST_DEVICE static half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
};

// bfloat16: float's sign and exponent with 7 mantissa bits. Layout-compatible with __nv_bfloat16.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  HERD_HOST_DEVICE explicit bfloat16(float f) noexcept : bits(detail::to_bfloat16_bits(f)) {}
  HERD_HOST_DEVICE explicit bfloat16(double d) noexcept : bfloat16(detail::round_to_odd_float(d)) {}
  HERD_HOST_DEVICE explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  HERD_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

namespace detail {
// half or bfloat16: stored in 16 bits, computed in float.
template <class T> inline constexpr bool is_16bit_float = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

// Any element type to double and back, the way back rounded once (16-bit floats round from a
// double in one step, above).
template <class T> inline double to_double(T x) noexcept {
  if constexpr (is_16bit_float<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}
template <class T> inline T from_double(double x) noexcept {
  if constexpr (is_16bit_float<T>) return T(x);
  else return static_cast<T>(x);
}
}  // namespace detail

}  // namespace herd

#endif  // HERD_CORE_HALF_HPP
