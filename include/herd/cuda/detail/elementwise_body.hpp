#ifndef HERD_CUDA_DETAIL_ELEMENTWISE_BODY_HPP
#define HERD_CUDA_DETAIL_ELEMENTWISE_BODY_HPP
// What each GPU thread does in herd's elementwise kernels, as plain functions of (thread index,
// thread count): the kernels call them with their grid position, and tests call them on the CPU
// for every position of an emulated grid. Each thread walks the range in a grid-stride loop:
// first the few elements before the pointers align, then whole aligned vectors of V elements,
// then the tail, so the wide loads and stores never straddle an alignment boundary.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/half.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/cuda/detail/vector_access.hpp>

#include <cmath>
#include <cstddef>
#include <type_traits>

namespace herd::cuda::detail {

// 16-bit floats in a vector whose elements are all numbers (no NaN, no infinity) skip the NaN
// check of each conversion (core/half.hpp): two such numbers sum, multiply and average in f32 to
// a number or an infinity, never a NaN, so the hardware's conversions give the checked ones'
// bits. A vector holding a NaN or an infinity takes the checked path element by element. Without
// this the checks' software fallbacks, inlined for every lane, make the f16 average
// compute-bound on an H100.
template <class T> HERD_HOST_DEVICE bool is_number(T x) {
  return (x.bits & 0x7fffu) < (std::is_same_v<T, herd::half> ? 0x7c00u : 0x7f80u);  // exponent not all ones
}
template <class T> HERD_HOST_DEVICE float unchecked_widen(T x) {
  if constexpr (std::is_same_v<T, herd::half>) return herd::detail::unchecked_half_to_float(x.bits);
  else return herd::detail::bfloat16_bits_to_float(x.bits);  // a shift: no check to skip
}
template <class T> HERD_HOST_DEVICE T unchecked_narrow(float f) {
  if constexpr (std::is_same_v<T, herd::half>) return T::from_bits(herd::detail::unchecked_half_bits(f));
  else return T::from_bits(herd::detail::unchecked_bfloat16_bits(f));
}
template <class T, reduce_op Op> HERD_HOST_DEVICE T combine_numbers(T a, T b) {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::avg) return unchecked_narrow<T>(unchecked_widen(a) + unchecked_widen(b));
  else if constexpr (Op == reduce_op::prod) return unchecked_narrow<T>(unchecked_widen(a) * unchecked_widen(b));
  else return combine<Op>{}(a, b);  // min, max: a comparison, nothing converted back
}

// avg's division by the rank count, as multiplications by the reciprocal r = 1/n rounded to
// nearest. By a power of two, q = x * r is exact. By any other count q is within an ulp of x / n,
// and one correction gives the division's own rounding: the remainder x - q * n is exact in one
// fused multiply-add, and q + remainder * r, rounded once, is the correctly rounded quotient
// (Markstein's theorem, for results clear of the subnormal range; the kernels divide only 16-bit
// values widened to float, and the tests check every one of them, bf16's subnormals included,
// against the division). Three instructions where a division costs about ten and a slow-path
// branch: the f16 average over 3 ranks ran at 0.75 of a copy on an H200 with the division. An
// exact q is kept as it is (a zero remainder would turn -0 into +0), and so is an infinite one
// (its remainder would be a NaN).
template <class C> struct rank_divisor {
  C ranks;
  C reciprocal;
  bool exact;
  HERD_HOST_DEVICE explicit rank_divisor(int n)
      : ranks(static_cast<C>(n)), reciprocal(n > 0 ? C(1) / static_cast<C>(n) : C(0)), exact(n > 0 && (n & (n - 1)) == 0) {}
  HERD_HOST_DEVICE C operator()(C x) const {
    const C q = x * reciprocal;
    if (exact) return q;
    const C remainder = std::fma(-q, ranks, x);
    const C corrected = std::fma(remainder, reciprocal, q);
    return remainder != C(0) && std::isfinite(q) ? corrected : q;
  }
};

// out[i] = a[i] ∘ b[i] (divided by avg_ranks when non-zero); out may be a or b.
template <class T> struct reduce_args {
  T* out;
  const T* a;
  const T* b;
  std::size_t n;
  int avg_ranks;
};

template <class T, reduce_op Op>
HERD_HOST_DEVICE void reduce_thread(const reduce_args<T>& p, std::size_t thread, std::size_t threads) {
  constexpr std::size_t V = 16 / sizeof(T);
  const combine<Op> f;
  const rank_divisor<float> divide(p.avg_ranks);  // used by the 16-bit vectors only
  auto one = [&](T x, T y) {
    const T r = f(x, y);
    return p.avg_ranks > 0 ? finalize_avg(r, p.avg_ranks) : r;
  };
  std::size_t head = steps_to_alignment(p.out, sizeof(T), 16);
  const bool together = steps_to_alignment(p.a, sizeof(T), 16) == head && steps_to_alignment(p.b, sizeof(T), 16) == head;
  if (!together || head >= p.n) head = p.n;  // no common alignment: every element one by one
  for (std::size_t i = thread; i < head; i += threads) p.out[i] = one(p.a[i], p.b[i]);
  const std::size_t vectors = (p.n - head) / V;
  // One vector of each side in flight per thread: four (as the copy body has) left the 16-bit
  // sums and averages at 0.65-0.71 of a copy on an H200, where these loops reach 0.93-0.96.
  for (std::size_t v = thread; v < vectors; v += threads) {
    const std::size_t at = head + v * V;
    const auto x = load_lanes<T, V>(p.a + at);
    const auto y = load_lanes<T, V>(p.b + at);
    lanes<T, V> r;
    if constexpr (herd::detail::is_16bit_float<T>) {
      bool numbers = true;
      for (std::size_t j = 0; j < V; ++j) numbers = numbers & is_number(x.v[j]) & is_number(y.v[j]);
      if (numbers) {
        for (std::size_t j = 0; j < V; ++j) {
          const T c = combine_numbers<T, Op>(x.v[j], y.v[j]);
          r.v[j] = p.avg_ranks > 0 ? unchecked_narrow<T>(divide(unchecked_widen(c))) : c;
        }
        store_lanes<T, V>(p.out + at, r);
        continue;
      }
    }
    for (std::size_t j = 0; j < V; ++j) r.v[j] = one(x.v[j], y.v[j]);
    store_lanes<T, V>(p.out + at, r);
  }
  for (std::size_t i = head + vectors * V + thread; i < p.n; i += threads) p.out[i] = one(p.a[i], p.b[i]);
}

// data[i] = data[i] / ranks, herd's avg on values summed elsewhere (by NCCL, say).
template <class T>
HERD_HOST_DEVICE void finalize_avg_thread(T* data, std::size_t n, int ranks, std::size_t thread, std::size_t threads) {
  for (std::size_t i = thread; i < n; i += threads) data[i] = finalize_avg(data[i], ranks);
}

// The arithmetic type of a cast: double when either side is f64, float otherwise (f16 and bf16
// included, as their arithmetic always is).
template <class D, class S>
using cast_compute_t = std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;

// out[i] = D(S(in[i]) * scale), with one rounding into D. out and in must not partly overlap.
template <class D, class S> struct cast_args {
  D* out;
  const S* in;
  std::size_t n;
  double scale;
};

template <class D, class S>
HERD_HOST_DEVICE void cast_thread(const cast_args<D, S>& p, std::size_t thread, std::size_t threads) {
  using C = cast_compute_t<D, S>;
  constexpr std::size_t V = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
  const C scale = static_cast<C>(p.scale);
  auto one = [&](S x) {
    if constexpr (std::is_class_v<S>) return D(static_cast<C>(static_cast<float>(x)) * scale);  // half, bfloat16
    else return D(static_cast<C>(x) * scale);
  };
  // Both sides must reach alignment to their vector width at the same element.
  std::size_t head = steps_to_alignment(p.in, sizeof(S), sizeof(S) * V);
  if (head != steps_to_alignment(p.out, sizeof(D), sizeof(D) * V) || head >= p.n) head = p.n;
  for (std::size_t i = thread; i < head; i += threads) p.out[i] = one(p.in[i]);
  const std::size_t vectors = (p.n - head) / V;
  for (std::size_t v = thread; v < vectors; v += threads) {  // one vector in flight: as reduce_thread
    const std::size_t at = head + v * V;
    const auto x = load_lanes<S, V>(p.in + at);
    lanes<D, V> r;
    for (std::size_t j = 0; j < V; ++j) r.v[j] = one(x.v[j]);
    store_lanes<D, V>(p.out + at, r);
  }
  for (std::size_t i = head + vectors * V + thread; i < p.n; i += threads) p.out[i] = one(p.in[i]);
}

// Byte copy in the widest words (16, 8, 4 or 2 bytes) that both sides reach at the same byte: the
// pack/unpack of dtypes that need no conversion (integers, or floats without compression or
// scaling). Two f32 tensors 4 bytes out of step still move 4-byte words, not single bytes.
struct copy_args {
  std::byte* out;
  const std::byte* in;
  std::size_t n;
};

// The copy in W-byte words (W = 16, 8, 4 or 2), for two sides that reach a W-byte boundary together.
template <std::size_t W> HERD_HOST_DEVICE void copy_words(const copy_args& p, std::size_t thread, std::size_t threads) {
  using Word = std::conditional_t<(W >= 8), std::uint64_t, std::conditional_t<W == 4, std::uint32_t, std::uint16_t>>;
  constexpr std::size_t V = W / sizeof(Word);
  std::size_t head = steps_to_alignment(p.in, 1, W);
  if (head > p.n) head = p.n;
  for (std::size_t i = thread; i < head; i += threads) p.out[i] = p.in[i];
  const std::size_t words = (p.n - head) / W;
  auto from = [&](std::size_t w) { return load_lanes<Word, V>(reinterpret_cast<const Word*>(p.in + head + W * w)); };
  auto to = [&](std::size_t w, const lanes<Word, V>& x) { store_lanes<Word, V>(reinterpret_cast<Word*>(p.out + head + W * w), x); };
  // Four loads in flight before the first store: the compiler cannot reorder them past stores
  // that might alias, and one load at a time leaves most of a GPU's memory bandwidth idle.
  std::size_t w = thread;
  for (; w + 3 * threads < words; w += 4 * threads) {
    const auto x0 = from(w), x1 = from(w + threads), x2 = from(w + 2 * threads), x3 = from(w + 3 * threads);
    to(w, x0);
    to(w + threads, x1);
    to(w + 2 * threads, x2);
    to(w + 3 * threads, x3);
  }
  for (; w < words; w += threads) to(w, from(w));
  for (std::size_t i = head + words * W + thread; i < p.n; i += threads) p.out[i] = p.in[i];
}

HERD_HOST_DEVICE inline void copy_thread(const copy_args& p, std::size_t thread, std::size_t threads) {
  // Both sides reach a W-byte boundary at the same byte when W divides the distance between them.
  const std::uintptr_t apart = address(p.in) - address(p.out);
  if (apart % 16 == 0) return copy_words<16>(p, thread, threads);
  if (apart % 8 == 0) return copy_words<8>(p, thread, threads);
  if (apart % 4 == 0) return copy_words<4>(p, thread, threads);
  if (apart % 2 == 0) return copy_words<2>(p, thread, threads);
  for (std::size_t i = thread; i < p.n; i += threads) p.out[i] = p.in[i];
}

}  // namespace herd::cuda::detail

#endif  // HERD_CUDA_DETAIL_ELEMENTWISE_BODY_HPP
