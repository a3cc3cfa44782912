#pragma once
// Bit-level references for the 16-bit floats, shared by the tests of herd's host types and of the
// kernels' bodies: written from the formats' definitions, sharing no code with herd's headers.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace herd_test {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::uint16_t u16(std::uint32_t v) { return static_cast<std::uint16_t>(v); }

// Own bfloat16 reference: the two candidates around |f| are its truncation toward zero and the
// next bfloat16 magnitude up; the nearer one wins in double, a tie goes to the even mantissa.

inline std::uint16_t bfloat16_reference(float f) {
  const std::uint32_t u = bits_of(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return u16(sign | 0x7fc0u);
  if (magnitude == 0x7f800000u) return u16(sign | 0x7f80u);
  const std::uint32_t down = magnitude >> 16;
  const std::uint32_t up = down + 1;  // 0x7f80 is infinity, which stands for 2^128 here
  const double a = static_cast<double>(float_of(magnitude));
  const double down_value = static_cast<double>(float_of(down << 16));
  const double up_value = up == 0x7f80u ? std::ldexp(1.0, 128) : static_cast<double>(float_of(up << 16));
  const double to_down = a - down_value;
  const double to_up = up_value - a;
  std::uint32_t pick;
  if (to_down < to_up) pick = down;
  else if (to_up < to_down) pick = up;
  else pick = (down & 1u) == 0 ? down : up;
  return u16(sign | pick);
}

}  // namespace herd_test
