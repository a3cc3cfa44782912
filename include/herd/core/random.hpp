#ifndef HERD_CORE_RANDOM_HPP
#define HERD_CORE_RANDOM_HPP
// herd::random_engine: a small seeded PRNG whose stream is the same on every platform, compiler
// and standard library, so that every rank of a job (and every rerun) draws the same numbers.
// std:: engines are portable but std:: distributions are not, hence our own uniform_below.
//
// The exact algorithms, enough to reproduce the stream elsewhere (all arithmetic mod 2^64):
//
//   splitmix64(x):  x += 0x9e3779b97f4a7c15; z = x;
//                   z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
//                   z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
//                   return z ^ (z >> 31)               (x is the caller's running state)
//
//   seeding:        x = seed; s[0], s[1], s[2], s[3] = four successive splitmix64(x) outputs
//                   (never all zero: splitmix64 is a bijection of distinct counters)
//
//   next():         xoshiro256** (Blackman and Vigna, 2018), rotl = rotate left
//                   result = rotl(s[1] * 5, 7) * 9;
//                   t = s[1] << 17;
//                   s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
//                   s[2] ^= t; s[3] = rotl(s[3], 45);
//                   return result
//
//   uniform_below(n), n >= 1: Lemire's multiply-and-reject ("Fast random integer generation in
//   an interval", 2019), unbiased in [0, n):
//                   m = next() * n as a 128-bit product; low = m mod 2^64
//                   if low < n:
//                     threshold = (2^64 - n) mod n
//                     while low < threshold: m = next() * n; low = m mod 2^64
//                   return m >> 64
//   It consumes one next() per call except on rejection, which happens with probability
//   threshold / 2^64 < n / 2^64.

#include <herd/core/error.hpp>

#include <bit>
#include <cstdint>
#include <limits>

namespace herd {
namespace detail {

// One step of splitmix64: advances `state` and returns the mixed output.
constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

struct u128_parts {
  std::uint64_t high;
  std::uint64_t low;
};

// The same product without __int128; kept callable everywhere so tests can compare the two.
constexpr u128_parts multiply_wide_portable(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t mask = 0xffffffffu;
  const std::uint64_t a_lo = a & mask, a_hi = a >> 32, b_lo = b & mask, b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  // At most (2^32 - 1)^2 + 2 * (2^32 - 1) = 2^64 - 1: no carry is lost.
  const std::uint64_t middle = (lo_lo >> 32) + (hi_lo & mask) + lo_hi;
  return {hi_hi + (hi_lo >> 32) + (middle >> 32), (middle << 32) | (lo_lo & mask)};
}

// The full 64x64 -> 128-bit product. Compilers without __int128 (MSVC) take the schoolbook route
// on 32-bit halves, which gives the same bits.
constexpr u128_parts multiply_wide(std::uint64_t a, std::uint64_t b) noexcept {
#if defined(__SIZEOF_INT128__)
  __extension__ typedef unsigned __int128 u128;  // __extension__: quiet under -Wpedantic
  const u128 m = static_cast<u128>(a) * b;
  return {static_cast<std::uint64_t>(m >> 64), static_cast<std::uint64_t>(m)};
#else
  return multiply_wide_portable(a, b);
#endif
}

}  // namespace detail

class random_engine {
 public:
  using result_type = std::uint64_t;

  explicit constexpr random_engine(std::uint64_t seed_value = 0) noexcept { seed(seed_value); }

  // Restarts the stream: the same seed gives the same numbers.
  constexpr void seed(std::uint64_t seed_value) noexcept {
    std::uint64_t x = seed_value;
    for (auto& word : state_) word = detail::splitmix64(x);
  }

  // The next 64 random bits (xoshiro256**).
  constexpr std::uint64_t next() noexcept {
    const std::uint64_t result = std::rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = std::rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, n), without modulo bias; n == 0 is a herd::error (the interval is empty).
  constexpr std::uint64_t uniform_below(std::uint64_t n) {
    if (n == 0) {
      detail::raise({"random_engine::uniform_below"}, "the bound is 0, so [0, n) is empty",
                    "Pass n >= 1");
    }
    detail::u128_parts m = detail::multiply_wide(next(), n);
    if (m.low < n) {
      // 2^64 mod n: products whose low word falls below it would make some results more likely.
      const std::uint64_t threshold = (std::uint64_t{0} - n) % n;
      while (m.low < threshold) m = detail::multiply_wide(next(), n);
    }
    return m.high;
  }

  // UniformRandomBitGenerator, for code that wants one; std:: distributions on top of it are
  // not portable across standard libraries, uniform_below is.
  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return std::numeric_limits<result_type>::max(); }
  constexpr result_type operator()() noexcept { return next(); }

  friend constexpr bool operator==(const random_engine&, const random_engine&) noexcept = default;

 private:
  std::uint64_t state_[4] = {};
};

}  // namespace herd

#endif  // HERD_CORE_RANDOM_HPP
