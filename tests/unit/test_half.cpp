// herd::half and herd::bfloat16: exact round trips over every bit pattern, and float -> 16-bit
// rounding checked against references that share no code with the header.
#include <herd/core/half.hpp>

#include <doctest/doctest.h>

#include "../support/half_reference.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using herd::bfloat16;
using herd::half;
using herd_test::bfloat16_reference;
using herd_test::bits_of;
using herd_test::float_of;
using herd_test::u16;

std::string hex(std::uint32_t u) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(u));
  return text;
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

// ---------------------------------------------------------------------------------------------
// Own half reference: the value of each non-negative finite half from the IEEE 754 definition,
// then "nearest neighbour in a sorted table". It never looks at the bit layout of a float.

double half_magnitude_value(std::uint32_t magnitude_bits) {
  const int exponent = static_cast<int>(magnitude_bits >> 10);
  const int mantissa = static_cast<int>(magnitude_bits & 0x3ffu);
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), -24);
  return std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
}

// Index i holds the value of the half with bits i, for i in [0, 0x7c00): ascending.
const std::vector<double>& finite_halves() {
  static const std::vector<double> table = [] {
    std::vector<double> t(0x7c00);
    for (std::uint32_t i = 0; i < 0x7c00u; ++i) t[i] = half_magnitude_value(i);
    return t;
  }();
  return table;
}

// Bits of the half nearest to f; NaN gives some NaN (callers only check NaN-ness).
std::uint16_t half_reference(float f) {
  const auto sign = static_cast<std::uint32_t>(std::signbit(f) ? 0x8000u : 0u);
  if (std::isnan(f)) return u16(sign | 0x7e00u);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return u16(sign | 0x7c00u);  // 65504 + half an ulp and beyond: infinity
  const std::vector<double>& table = finite_halves();
  // Hand-rolled binary search for the first entry above a (cheap enough in a debug build too).
  std::size_t lo = 0, hi = table.size();
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (table[mid] <= a) lo = mid + 1;
    else hi = mid;
  }
  if (hi == table.size()) return u16(sign | 0x7bffu);  // in (65504, 65520): 65504 is nearer
  const std::size_t below = hi - 1;                      // table[below] <= a < table[hi]
  // Both distances are exact in double: each is below a and a multiple of a's float ulp.
  const double to_below = a - table[below];
  const double to_above = table[hi] - a;
  std::size_t pick;
  if (to_below < to_above) pick = below;
  else if (to_above < to_below) pick = hi;
  else pick = (below % 2 == 0) ? below : hi;  // tie: the even bit pattern
  return u16(sign | static_cast<std::uint32_t>(pick));
}

#ifdef __FLT16_MAX__
// The compiler's own conversion (libgcc's __truncsfhf2, or F16C/AVX512-FP16 instructions).
std::uint16_t half_compiler(float f) {
  const auto h = static_cast<_Float16>(f);
  std::uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
#endif

// The strided sweep: every 97th float bit pattern (97 is odd, so every low-bit residue, and thus
// every rounding situation, is visited), about 44 million inputs.
constexpr std::uint64_t sweep_stride = 97;
constexpr std::uint64_t all_floats = std::uint64_t{1} << 32;
constexpr int max_reported = 8;

}  // namespace

// =============================================================================================

TEST_CASE("half: every bit pattern decodes to its IEEE value and round-trips through float") {
  int failures = 0;
  for (std::uint32_t b = 0; b <= 0xffffu && failures < max_reported; ++b) {
    const std::uint16_t bits = u16(b);
    const float f = static_cast<float>(half::from_bits(bits));
    const std::uint16_t back = half(f).bits;
    if (half_is_nan(bits)) {
      const bool ok = std::isnan(f) && half_is_nan(back) && ((bits & 0x0200u) == 0 || back == bits);
      if (!ok) {
        ++failures;
        CHECK_MESSAGE(ok, "NaN half ", hex(bits), " -> float ", hex(bits_of(f)), " -> half ", hex(back));
      }
      continue;
    }
    const std::uint32_t magnitude = b & 0x7fffu;
    double expected = magnitude == 0x7c00u ? std::numeric_limits<double>::infinity() : half_magnitude_value(magnitude);
    if (b & 0x8000u) expected = -expected;
    const bool ok = back == bits && static_cast<double>(f) == expected && std::signbit(f) == ((b & 0x8000u) != 0);
    if (!ok) {
      ++failures;
      CHECK_MESSAGE(ok, "half ", hex(bits), " -> float ", hex(bits_of(f)), " -> half ", hex(back));
    }
#ifdef __FLT16_MAX__
    _Float16 h;
    std::memcpy(&h, &bits, sizeof h);
    if (bits_of(static_cast<float>(h)) != bits_of(f)) {
      ++failures;
      CHECK_MESSAGE(false, "half ", hex(bits), " -> float ", hex(bits_of(f)), ", _Float16 says ",
                    hex(bits_of(static_cast<float>(h))));
    }
#endif
  }
  CHECK(failures == 0);
}

TEST_CASE("bfloat16: every bit pattern decodes to the top half of a float and round-trips") {
  int failures = 0;
  for (std::uint32_t b = 0; b <= 0xffffu && failures < max_reported; ++b) {
    const std::uint16_t bits = u16(b);
    const float f = static_cast<float>(bfloat16::from_bits(bits));
    const std::uint16_t back = bfloat16(f).bits;
    bool ok = bits_of(f) == (b << 16);
    if (bf16_is_nan(bits)) ok = ok && std::isnan(f) && bf16_is_nan(back) && ((bits & 0x0040u) == 0 || back == bits);
    else ok = ok && back == bits;
    if (!ok) {
      ++failures;
      CHECK_MESSAGE(ok, "bfloat16 ", hex(bits), " -> float ", hex(bits_of(f)), " -> bfloat16 ", hex(back));
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("half reference: the table is strictly increasing and ends at 65504") {
  const std::vector<double>& table = finite_halves();
  REQUIRE(table.size() == 0x7c00u);
  CHECK(table.front() == 0.0);
  CHECK(table[1] == std::ldexp(1.0, -24));
  CHECK(table[0x3ff] == 1023 * std::ldexp(1.0, -24));
  CHECK(table[0x400] == std::ldexp(1.0, -14));
  CHECK(table[0x3c00] == 1.0);
  CHECK(table.back() == 65504.0);
  bool increasing = true;
  for (std::size_t i = 1; i < table.size(); ++i) increasing = increasing && table[i - 1] < table[i];
  CHECK(increasing);
}

TEST_CASE("half: float -> half rounds to nearest even (strided sweep over all float bit patterns)") {
  int failures = 0;
  std::uint64_t checked = 0;
  for (std::uint64_t i = 0; i < all_floats && failures < max_reported; i += sweep_stride, ++checked) {
    const auto u = static_cast<std::uint32_t>(i);
    const float f = float_of(u);
    const std::uint16_t got = half(f).bits;
    const std::uint16_t want = half_reference(f);
    const bool ok = std::isnan(f) ? half_is_nan(got) : got == want;
    if (!ok) {
      ++failures;
      CHECK_MESSAGE(ok, "float ", hex(u), " (", f, "): header ", hex(got), ", table reference ", hex(want));
    }
  }
  CHECK(failures == 0);
  CHECK(checked == (all_floats + sweep_stride - 1) / sweep_stride);
}

#ifdef __FLT16_MAX__
TEST_CASE("half: float -> half agrees with the compiler's _Float16 (strided sweep over all float bit patterns)") {
  // Without F16C in the target flags each _Float16 conversion is a libgcc soft-float call of
  // about 100 ns, so this sweep takes a coarser (still odd) stride than the table sweep.
  constexpr std::uint64_t stride = 1021;
  int failures = 0;
  for (std::uint64_t i = 0; i < all_floats && failures < max_reported; i += stride) {
    const auto u = static_cast<std::uint32_t>(i);
    const float f = float_of(u);
    const std::uint16_t got = half(f).bits;
    const std::uint16_t want = half_compiler(f);
    const bool ok = std::isnan(f) ? half_is_nan(got) && half_is_nan(want) : got == want;
    if (!ok) {
      ++failures;
      CHECK_MESSAGE(ok, "float ", hex(u), " (", f, "): header ", hex(got), ", _Float16 ", hex(want));
    }
  }
  CHECK(failures == 0);
}
#endif

TEST_CASE("half: every tie between neighbouring halves, and the floats just around it") {
  // The midpoint of two neighbouring halves fits in a float (12 significant bits); it must go to
  // the even pattern, and one float ulp either side must go to the nearer neighbour. The last
  // midpoint, between 65504 and the next binade (65536), is 65520, which overflows to infinity.
  const std::vector<double>& table = finite_halves();
  int failures = 0;
  for (std::uint32_t lo = 0; lo < 0x7c00u && failures < max_reported; ++lo) {
    const double next = lo + 1 < 0x7c00u ? table[lo + 1] : 65536.0;
    const double exact_mid = (table[lo] + next) / 2;
    const auto mid = static_cast<float>(exact_mid);
    const std::uint32_t even = (lo % 2 == 0) ? lo : lo + 1;
    for (const std::uint32_t sign : {0u, 0x8000u}) {
      const float s = sign ? -1.0f : 1.0f;
      const std::uint16_t at = half(s * mid).bits;
      const std::uint16_t below = half(s * std::nextafter(mid, 0.0f)).bits;
      const std::uint16_t above = half(s * std::nextafter(mid, 1e30f)).bits;
      const bool ok = static_cast<double>(mid) == exact_mid && at == (sign | even) && below == (sign | lo) &&
                      above == (sign | (lo + 1));
      if (!ok) {
        ++failures;
        CHECK_MESSAGE(ok, "tie above half ", hex(sign | lo), " at float ", hex(bits_of(s * mid)), ": got ", hex(below),
                      " / ", hex(at), " / ", hex(above));
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("half: targeted conversions from float") {
  struct conversion {
    float in;
    std::uint16_t out;
  };
  const float inf = std::numeric_limits<float>::infinity();
  const conversion cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.1f, 0x2e66},
      {std::ldexp(1.0f, -24), 0x0001},                             // smallest subnormal
      {-std::ldexp(1.0f, -24), 0x8001},
      {std::ldexp(1.0f, -25), 0x0000},                             // half of it: ties to even zero
      {-std::ldexp(1.0f, -25), 0x8000},                            // ... keeping the sign
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},       // just above the tie
      {std::ldexp(1.0f, -26), 0x0000},
      {std::numeric_limits<float>::denorm_min(), 0x0000},
      {-std::numeric_limits<float>::min(), 0x8000},
      {3 * std::ldexp(1.0f, -26), 0x0001},                         // 0.75 of the smallest subnormal
      {3 * std::ldexp(1.0f, -25), 0x0002},                         // 1.5: tie, to even 2
      {5 * std::ldexp(1.0f, -25), 0x0002},                         // 2.5: tie, to even 2
      {std::ldexp(1.0f, -15), 0x0200},
      {1023 * std::ldexp(1.0f, -24), 0x03ff},                      // largest subnormal
      {1023.5f * std::ldexp(1.0f, -24), 0x0400},                   // tie, carries into the smallest normal
      {std::ldexp(1.0f, -14), 0x0400},                             // smallest normal
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},                      // tie between 0x3c00 and 0x3c01
      {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},                  // tie between 0x3c01 and 0x3c02
      {1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23), 0x3c01},
      {2.0f - std::ldexp(1.0f, -11), 0x4000},                      // tie, carries into the next binade
      {2049.0f, 0x6800},                                           // tie between 2048 and 2050
      {2051.0f, 0x6802},                                           // tie between 2050 and 2052
      {65504.0f, 0x7bff},                                          // largest finite half
      {-65504.0f, 0xfbff},
      {65519.99f, 0x7bff},
      {65520.0f, 0x7c00},                                          // halfway to 2^16: overflows
      {-65520.0f, 0xfc00},
      {65536.0f, 0x7c00},
      {std::numeric_limits<float>::max(), 0x7c00},
      {inf, 0x7c00},
      {-inf, 0xfc00},
  };
  for (const conversion& c : cases) {
    CAPTURE(c.in);
    INFO("float bits ", hex(bits_of(c.in)));
    CHECK(half(c.in).bits == c.out);
    CHECK(half_reference(c.in) == c.out);
#ifdef __FLT16_MAX__
    CHECK(half_compiler(c.in) == c.out);
#endif
  }
  // NaNs stay NaN, including one whose payload lies entirely in bits a half cannot hold.
  for (const std::uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu}) {
    INFO("float bits ", hex(nan));
    const std::uint16_t got = half(float_of(nan)).bits;
    CHECK(half_is_nan(got));
    CHECK((got & 0x8000u) == ((nan >> 16) & 0x8000u));
    CHECK(std::isnan(static_cast<float>(half(float_of(nan)))));
  }
  CHECK(half(std::numeric_limits<float>::quiet_NaN()).bits == 0x7e00);
}

TEST_CASE("bfloat16: float -> bfloat16 rounds to nearest even (strided sweep over all float bit patterns)") {
  int failures = 0;
  std::uint64_t checked = 0;
  for (std::uint64_t i = 0; i < all_floats && failures < max_reported; i += sweep_stride, ++checked) {
    const auto u = static_cast<std::uint32_t>(i);
    const float f = float_of(u);
    const std::uint16_t got = bfloat16(f).bits;
    const std::uint16_t want = bfloat16_reference(f);
    const bool ok = std::isnan(f) ? bf16_is_nan(got) : got == want;
    if (!ok) {
      ++failures;
      CHECK_MESSAGE(ok, "float ", hex(u), " (", f, "): header ", hex(got), ", reference ", hex(want));
    }
  }
  CHECK(failures == 0);
  CHECK(checked == (all_floats + sweep_stride - 1) / sweep_stride);
}

TEST_CASE("bfloat16: every tie between neighbouring values, and the floats just around it") {
  // For bfloat16 the midpoint above the value with bits b is the float with bits (b << 16) | 0x8000.
  int failures = 0;
  for (std::uint32_t lo = 0; lo < 0x7f80u && failures < max_reported; ++lo) {
    const std::uint32_t even = (lo % 2 == 0) ? lo : lo + 1;
    for (const std::uint32_t sign : {0u, 0x8000u}) {
      const std::uint32_t mid = ((sign | lo) << 16) | 0x8000u;
      const std::uint16_t at = bfloat16(float_of(mid)).bits;
      const std::uint16_t below = bfloat16(float_of(mid - 1)).bits;
      const std::uint16_t above = bfloat16(float_of(mid + 1)).bits;
      const bool ok = at == (sign | even) && below == (sign | lo) && above == (sign | (lo + 1));
      if (!ok) {
        ++failures;
        CHECK_MESSAGE(ok, "tie at float ", hex(mid), ": got ", hex(below), " / ", hex(at), " / ", hex(above));
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("bfloat16: targeted conversions from float") {
  struct conversion {
    std::uint32_t in;  // float bits: most cases here are easiest to state as bit patterns
    std::uint16_t out;
  };
  const conversion cases[] = {
      {0x00000000u, 0x0000},  // +0
      {0x80000000u, 0x8000},  // -0
      {0x3f800000u, 0x3f80},  // 1
      {0x3f808000u, 0x3f80},  // 1 + 2^-8: tie, to even 0x3f80
      {0x3f818000u, 0x3f82},  // tie between 0x3f81 and 0x3f82
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f807fffu, 0x3f80},  // just below it
      {0x3fff8000u, 0x4000},  // 2 - 2^-8: tie, carries into the next binade
      {0xbfff8000u, 0xc000},
      {0x7f7f0000u, 0x7f7f},  // largest finite bfloat16
      {0x7f7f7fffu, 0x7f7f},  // below the overflow threshold
      {0x7f7f8000u, 0x7f80},  // halfway to 2^128: ties to the even pattern, infinity
      {0x7f7fffffu, 0x7f80},  // FLT_MAX overflows
      {0xff7fffffu, 0xff80},  // -FLT_MAX
      {0x7f800000u, 0x7f80},  // inf
      {0xff800000u, 0xff80},  // -inf
      {0x00000001u, 0x0000},  // smallest subnormal float
      {0x80000001u, 0x8000},
      {0x00008000u, 0x0000},  // subnormal tie, to even
      {0x00018000u, 0x0002},  // subnormal tie, to even
      {0x00008001u, 0x0001},
      {0x80008001u, 0x8001},
      {0x00010000u, 0x0001},  // smallest subnormal bfloat16
      {0x007f0000u, 0x007f},  // largest subnormal bfloat16
      {0x007fffffu, 0x0080},  // largest subnormal float: carries into the smallest normal
      {0x00800000u, 0x0080},  // smallest normal float
  };
  for (const conversion& c : cases) {
    INFO("float bits ", hex(c.in));
    CHECK(bfloat16(float_of(c.in)).bits == c.out);
    CHECK(bfloat16_reference(float_of(c.in)) == c.out);
  }
  // NaNs stay NaN, also one whose payload lies only in the 16 bits that are dropped.
  for (const std::uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7fffffffu}) {
    INFO("float bits ", hex(nan));
    const std::uint16_t got = bfloat16(float_of(nan)).bits;
    CHECK(bf16_is_nan(got));
    CHECK((got & 0x8000u) == ((nan >> 16) & 0x8000u));
  }
  CHECK(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7fc0);
}

TEST_CASE("conversions from double round once, not twice through float") {
  // 1 + 2^-11 + 2^-40 lies just above the tie between the halves 1 and 1 + 2^-10: it rounds up.
  // Through a plain float it would first become the tie 1 + 2^-11 and then round to even, 1.
  CHECK(herd::half(1.0 + 0x1.0p-11 + 0x1.0p-40).bits == 0x3c01);
  CHECK(herd::half(-(1.0 + 0x1.0p-11 + 0x1.0p-40)).bits == 0xbc01);
  CHECK(herd::half(1.0 + 0x1.0p-11 - 0x1.0p-40).bits == 0x3c00);
  CHECK(herd::bfloat16(1.0 + 0x1.0p-8 + 0x1.0p-40).bits == 0x3f81);
  CHECK(herd::bfloat16(1.0 + 0x1.0p-8).bits == 0x3f80);  // an exact tie still goes to even
  CHECK(herd::half(65520.0).bits == 0x7c00);
  CHECK(herd::half(65519.999).bits == 0x7bff);
  CHECK(herd::half(1e300).bits == 0x7c00);
  CHECK(herd::half(0.1).bits == herd::half(0.1f).bits);
}
