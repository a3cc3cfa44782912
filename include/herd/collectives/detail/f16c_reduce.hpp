#ifndef HERD_COLLECTIVES_DETAIL_F16C_REDUCE_HPP
#define HERD_COLLECTIVES_DETAIL_F16C_REDUCE_HPP
// Sums, averages and products of f16 on x86-64 CPUs with F16C (Intel's and AMD's since
// 2012): one instruction converts 8 values between f16 and f32, where the portable conversions
// (core/half.hpp) take about twenty instructions a value, which made an f16 reduction on the host
// about 20 times slower per element than one of f32. The CPU is asked once, at run time, so a
// program built for any x86-64 takes this path where it can.
//
// The same bits as the portable loop: F16C converts f32 to f16 rounding to nearest even whatever
// the MXCSR's flush modes, as the portable conversion does (checked over every f32 and every f16
// on an AMD EPYC with FTZ and DAZ off and on), and the arithmetic between the conversions is the
// same IEEE operations in the same order. Only a signaling NaN read from f16 is made quiet on the
// way in, which the addition or product that follows does anyway.

#include <herd/core/half.hpp>
#include <herd/core/reduce_op.hpp>

#include <cstddef>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__CUDACC__)
#include <cpuid.h>
#include <immintrin.h>
#define HERD_F16C_REDUCE 1
#endif

namespace herd::detail {

#if defined(HERD_F16C_REDUCE)
// F16C's instructions take AVX's registers: AVX with the operating system's support for them (the
// compiler's check), and the F16C bit of CPUID leaf 1 (not every compiler's check knows it).
inline bool cpu_has_f16c() noexcept {
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return yes;
}

// dst[i] = a[i] ∘ b[i] for the first n - n % 8 elements (8 at a time), as reduce_loop<half, Op>
// does: the sum or product rounded to f16, then, when avg_ranks > 0, divided in f32 and rounded
// again. Each block of 8 is read before it is written, so dst may be a or b.
template <reduce_op Op>
__attribute__((target("avx,f16c"))) std::size_t f16c_combine_blocks(half* dst, const half* a, const half* b,
                                                                    std::size_t n, int avg_ranks) {
  const __m256 ranks = _mm256_set1_ps(static_cast<float>(avg_ranks));
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m128i r = _mm256_cvtps_ph(Op == reduce_op::prod ? _mm256_mul_ps(x, y) : _mm256_add_ps(x, y),
                                _MM_FROUND_TO_NEAREST_INT);
    if (Op == reduce_op::avg && avg_ranks > 0) {
      r = _mm256_cvtps_ph(_mm256_div_ps(_mm256_cvtph_ps(r), ranks), _MM_FROUND_TO_NEAREST_INT);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), r);
  }
  return i;
}
#endif

// How many leading elements of dst = a ∘ b the F16C path combined: 0 where it does not apply (no
// F16C, another operation, buffers that overlap other than dst == a or dst == b); the caller
// combines the rest.
template <reduce_op Op>
std::size_t f16c_combine([[maybe_unused]] half* dst, [[maybe_unused]] const half* a, [[maybe_unused]] const half* b,
                         [[maybe_unused]] std::size_t n, [[maybe_unused]] int avg_ranks) {
#if defined(HERD_F16C_REDUCE)
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg || Op == reduce_op::prod) {
    const auto apart = [n](const half* x, const half* y) { return x + n <= y || y + n <= x; };
    if (n >= 8 && (dst == a || apart(dst, a)) && (dst == b || apart(dst, b)) && cpu_has_f16c()) {
      return f16c_combine_blocks<Op>(dst, a, b, n, avg_ranks);
    }
  }
#endif
  return 0;
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_F16C_REDUCE_HPP
