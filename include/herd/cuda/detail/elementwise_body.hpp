#ifndef HERD_CUDA_DETAIL_ELEMENTWISE_BODY_HPP
#define HERD_CUDA_DETAIL_ELEMENTWISE_BODY_HPP
// What each GPU thread does in herd's elementwise kernels, as plain functions of (thread index,
// thread count): the kernels call them with their grid position, and tests call them on the CPU
// for every position of an emulated grid. Each thread walks the range in a grid-stride loop:
// first the few elements before the pointers align, then whole aligned vectors of V elements,
// then the tail, so the wide loads and stores never straddle an alignment boundary.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/cuda/detail/vector_access.hpp>

#include <cstddef>
#include <type_traits>

namespace herd::cuda::detail {

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
  auto one = [&](T x, T y) {
    const T r = f(x, y);
    return p.avg_ranks > 0 ? finalize_avg(r, p.avg_ranks) : r;
  };
  std::size_t head = steps_to_alignment(p.out, sizeof(T), 16);
  const bool together = steps_to_alignment(p.a, sizeof(T), 16) == head && steps_to_alignment(p.b, sizeof(T), 16) == head;
  if (!together || head >= p.n) head = p.n;  // no common alignment: every element one by one
  for (std::size_t i = thread; i < head; i += threads) p.out[i] = one(p.a[i], p.b[i]);
  const std::size_t vectors = (p.n - head) / V;
  for (std::size_t v = thread; v < vectors; v += threads) {
    const std::size_t at = head + v * V;
    const auto x = load_lanes<T, V>(p.a + at);
    const auto y = load_lanes<T, V>(p.b + at);
    lanes<T, V> r;
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
  for (std::size_t v = thread; v < vectors; v += threads) {
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
  for (std::size_t w = thread; w < words; w += threads) {
    store_lanes<Word, V>(reinterpret_cast<Word*>(p.out + head + W * w),
                         load_lanes<Word, V>(reinterpret_cast<const Word*>(p.in + head + W * w)));
  }
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
