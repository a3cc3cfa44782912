#ifndef HERD_CORE_DETAIL_F16C_HPP
#define HERD_CORE_DETAIL_F16C_HPP
// f16 loops on x86-64 CPUs with F16C (Intel's and AMD's since 2012), where one instruction
// converts 8 values between f16 and f32 and the portable conversions (core/half.hpp) take about
// twenty instructions a value: sums, averages and products (host_reduce), casts between f16 and
// f32 (host_cast) and the masters' refresh (mixed_precision). The CPU is asked once, at run time,
// so a program built for any x86-64 takes these paths where it can; elsewhere each returns 0 and
// its caller's portable loop does the work.
//
// The same bits as the portable loops: F16C converts f32 to f16 rounding to nearest even whatever
// the MXCSR's flush modes, as the portable conversion does (checked over every f32 and every f16
// on an AMD EPYC with FTZ and DAZ off and on), and the arithmetic between the conversions is the
// same IEEE operations in the same order. Only a signaling NaN read from f16 is made quiet on the
// way in, which the portable loops' arithmetic or conversion to double that follows does anyway.

#include <herd/core/half.hpp>
#include <herd/core/reduce_op.hpp>

#include <cstddef>
#include <cstring>

// The compiler's F16C builtins and vector types, the same in g++ and clang, rather than
// <immintrin.h>, which would add about 0.4 s to every file that includes herd.
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(__CUDACC__)
#include <cpuid.h>
#define HERD_F16C 1
#endif

namespace herd::detail {

#if defined(HERD_F16C)
using f16c_v8hf = short __attribute__((vector_size(16)));  // 8 f16 bit patterns
using f16c_v8sf = float __attribute__((vector_size(32)));
using f16c_v4sf = float __attribute__((vector_size(16)));
using f16c_v4df = double __attribute__((vector_size(32)));

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
  const f16c_v8sf ranks = f16c_v8sf{} + static_cast<float>(avg_ranks);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f16c_v8hf ha, hb;
    std::memcpy(&ha, a + i, sizeof ha);
    std::memcpy(&hb, b + i, sizeof hb);
    const f16c_v8sf x = __builtin_ia32_vcvtph2ps256(ha);
    const f16c_v8sf y = __builtin_ia32_vcvtph2ps256(hb);
    f16c_v8sf z;
    if constexpr (Op == reduce_op::prod) z = x * y;
    else z = x + y;
    f16c_v8hf r = __builtin_ia32_vcvtps2ph256(z, 0);  // 0: to nearest even
    if (Op == reduce_op::avg && avg_ranks > 0) r = __builtin_ia32_vcvtps2ph256(__builtin_ia32_vcvtph2ps256(r) / ranks, 0);
    std::memcpy(static_cast<void*>(dst + i), &r, sizeof r);
  }
  return i;
}

// out[i] = float(double(in[i]) * scale) for the first n - n % 8 elements, as host_cast does
// (the product in double, rounded once). in and out do not overlap.
__attribute__((target("avx,f16c"))) inline std::size_t f16c_widen_blocks(float* out, const half* in, std::size_t n,
                                                                         double scale) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f16c_v8hf h;
    std::memcpy(&h, in + i, sizeof h);
    const f16c_v8sf x = __builtin_ia32_vcvtph2ps256(h);
    if (scale == 1.0) {
      std::memcpy(out + i, &x, sizeof x);
      continue;
    }
    f16c_v4sf parts[2];  // 4 and 4 values, each widened to double for the product
    std::memcpy(parts, &x, sizeof x);
    for (f16c_v4sf& part : parts) part = __builtin_convertvector(__builtin_convertvector(part, f16c_v4df) * scale, f16c_v4sf);
    std::memcpy(out + i, parts, sizeof parts);
  }
  return i;
}

// out[i] = half(in[i]) for the first n - n % 8 elements. in and out do not overlap.
__attribute__((target("avx,f16c"))) inline std::size_t f16c_narrow_blocks(half* out, const float* in, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f16c_v8sf x;
    std::memcpy(&x, in + i, sizeof x);
    const f16c_v8hf h = __builtin_ia32_vcvtps2ph256(x, 0);
    std::memcpy(static_cast<void*>(out + i), &h, sizeof h);
  }
  return i;
}

// refresh_masters (optim/detail/master_weights.hpp) for f16, 8 at a time: a block whose masters
// all round to its parameters, the usual case, is left as it is; another is done by the portable
// loop. Returns how many leading elements were decided here.
__attribute__((target("avx,f16c"))) inline std::size_t f16c_unchanged_blocks(const float* master, const half* param,
                                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f16c_v8sf x;
    std::memcpy(&x, master + i, sizeof x);
    const f16c_v8hf rounded = __builtin_ia32_vcvtps2ph256(x, 0);
    if (std::memcmp(&rounded, param + i, sizeof rounded) != 0) break;
  }
  return i;
}

// Whether [x, x + x_bytes) and [y, y + y_bytes) share no byte.
inline bool bytes_apart(const void* x, std::size_t x_bytes, const void* y, std::size_t y_bytes) noexcept {
  const auto* p = static_cast<const unsigned char*>(x);
  const auto* q = static_cast<const unsigned char*>(y);
  return p + x_bytes <= q || q + y_bytes <= p;
}
#endif

// The entry points: how many leading elements each did, 0 where its path does not apply (no F16C,
// another operation, buffers that overlap other than as allowed); the caller does the rest.

// dst = a ∘ b, where dst may also be a or b.
template <reduce_op Op>
std::size_t f16c_combine([[maybe_unused]] half* dst, [[maybe_unused]] const half* a, [[maybe_unused]] const half* b,
                         [[maybe_unused]] std::size_t n, [[maybe_unused]] int avg_ranks) {
#if defined(HERD_F16C)
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg || Op == reduce_op::prod) {
    const std::size_t bytes = n * sizeof(half);
    if (n >= 8 && (dst == a || bytes_apart(dst, bytes, a, bytes)) && (dst == b || bytes_apart(dst, bytes, b, bytes)) &&
        cpu_has_f16c()) {
      return f16c_combine_blocks<Op>(dst, a, b, n, avg_ranks);
    }
  }
#endif
  return 0;
}
[[nodiscard]] inline std::size_t f16c_widen([[maybe_unused]] float* out, [[maybe_unused]] const half* in,
                                            [[maybe_unused]] std::size_t n, [[maybe_unused]] double scale) {
#if defined(HERD_F16C)
  if (n >= 8 && bytes_apart(out, n * sizeof(float), in, n * sizeof(half)) && cpu_has_f16c()) {
    return f16c_widen_blocks(out, in, n, scale);
  }
#endif
  return 0;
}
[[nodiscard]] inline std::size_t f16c_narrow([[maybe_unused]] half* out, [[maybe_unused]] const float* in,
                                             [[maybe_unused]] std::size_t n) {
#if defined(HERD_F16C)
  if (n >= 8 && bytes_apart(out, n * sizeof(half), in, n * sizeof(float)) && cpu_has_f16c()) {
    return f16c_narrow_blocks(out, in, n);
  }
#endif
  return 0;
}
[[nodiscard]] inline std::size_t f16c_unchanged([[maybe_unused]] const float* master, [[maybe_unused]] const half* param,
                                                [[maybe_unused]] std::size_t n) {
#if defined(HERD_F16C)
  if (n >= 8 && cpu_has_f16c()) return f16c_unchanged_blocks(master, param, n);
#endif
  return 0;
}

}  // namespace herd::detail

#endif  // HERD_CORE_DETAIL_F16C_HPP
