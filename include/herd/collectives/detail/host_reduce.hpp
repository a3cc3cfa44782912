#ifndef HERD_COLLECTIVES_DETAIL_HOST_REDUCE_HPP
#define HERD_COLLECTIVES_DETAIL_HOST_REDUCE_HPP
// Elementwise reductions over host memory: the loops the ring collectives run on each segment.

#include <herd/core/config.hpp>
#include <herd/core/detail/f16c.hpp>
#include <herd/core/detail/function_ref.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>

#include <cstddef>
#include <type_traits>

namespace herd::detail {

// The loops, for buffers that do not overlap (restrict) or for dst == a: then, in fixed blocks of
// one cache line, GCC vectorizes them even at -O2, which vectorizes no loop that needs a run-time
// overlap check or a remainder of unknown length. Vector or not, every element gets the same
// operation: the same bits.
template <class T, class F>
void combine_disjoint(T* __restrict dst, const T* __restrict a, const T* __restrict b, std::size_t n, F f) {
  constexpr std::size_t width = sizeof(T) < 64 ? 64 / sizeof(T) : 1;
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    for (std::size_t k = 0; k < width; ++k) dst[i + k] = f(a[i + k], b[i + k]);
  }
  for (; i < n; ++i) dst[i] = f(a[i], b[i]);
}
template <class T, class F> void combine_into(T* __restrict dst, const T* __restrict b, std::size_t n, F f) {
  constexpr std::size_t width = sizeof(T) < 64 ? 64 / sizeof(T) : 1;
  std::size_t i = 0;
  for (; i + width <= n; i += width) {
    for (std::size_t k = 0; k < width; ++k) dst[i + k] = f(dst[i + k], b[i + k]);
  }
  for (; i < n; ++i) dst[i] = f(dst[i], b[i]);
}

template <class T, class F> void combine_elements(T* dst, const T* a, const T* b, std::size_t n, F f) {
  const auto overlaps = [n](const T* x, const T* y) { return x < y + n && y < x + n; };
  if (dst == a && !overlaps(dst, b)) return combine_into(dst, b, n, f);
  if (!overlaps(dst, a) && !overlaps(dst, b)) return combine_disjoint(dst, a, b, n, f);
  for (std::size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);  // any other aliasing: element by element
}

template <class T, reduce_op Op>
void reduce_loop(T* dst, const T* a, const T* b, std::size_t n, int avg_ranks) {
  if constexpr (std::is_same_v<T, half>) {  // f16 on x86-64 with F16C: 8 at a time (core/detail/f16c.hpp)
    const std::size_t done = f16c_combine<Op>(dst, a, b, n, avg_ranks);
    dst += done, a += done, b += done, n -= done;
  }
  const combine<Op> f;
  if (avg_ranks > 0) {
    combine_elements(dst, a, b, n, [f, avg_ranks](T x, T y) { return finalize_avg(f(x, y), avg_ranks); });
  } else {
    combine_elements(dst, a, b, n, f);
  }
}

// dst[i] = a[i] ∘ b[i] for i < n; dst may be a (any other overlap works too, but slowly). With
// avg_ranks > 0 (the last combination of an avg) the result is also divided by avg_ranks. The
// caller has checked supports(t, op).
HERD_SEPARATE void host_reduce(dtype t, reduce_op op, void* dst, const void* a, const void* b, std::size_t n,
                               int avg_ranks = 0);

// data[i] = finalize_avg(data[i], ranks): the division that ends an avg whose sum was reduced in
// parts (the hierarchical allreduce).
HERD_SEPARATE void host_finalize_avg(dtype t, void* data, std::size_t n, int ranks);

// Where rank q's operand of a reduction over p ranks lies (its first element), for q < p.
using operand_ref = function_ref<const std::byte*(int)>;

// dst = operand(0) ∘ operand(1) ∘ ... ∘ operand(count - 1), count >= 2, dividing by avg_ranks
// (when > 0) in the last combination. dst may be operand(0) but no other operand.
HERD_SEPARATE void reduce_in_rank_order(dtype type, reduce_op op, std::byte* dst, int count, operand_ref operand,
                                        std::size_t n, int avg_ranks);

}  // namespace herd::detail

// The definitions: inline, or with HERD_SEPARATE_COMPILATION only in the program's implementation
// file (core/config.hpp). host_reduce instantiates the loops for every dtype and operation, which
// a file that includes herd would otherwise analyse whether it reduces anything or not.
#if defined(HERD_SEPARATE_DEFINITIONS)
namespace herd::detail {

HERD_SEPARATE void host_reduce(dtype t, reduce_op op, void* dst, const void* a, const void* b, std::size_t n,
                               int avg_ranks) {
  if (n == 0) return;
  visit(t, [&](auto element) {
    using T = decltype(element);
    auto* d = static_cast<T*>(dst);
    const auto* x = static_cast<const T*>(a);
    const auto* y = static_cast<const T*>(b);
    switch (op) {
      case reduce_op::sum: return reduce_loop<T, reduce_op::sum>(d, x, y, n, 0);
      case reduce_op::avg: return reduce_loop<T, reduce_op::avg>(d, x, y, n, avg_ranks);
      case reduce_op::min: return reduce_loop<T, reduce_op::min>(d, x, y, n, 0);
      case reduce_op::max: return reduce_loop<T, reduce_op::max>(d, x, y, n, 0);
      case reduce_op::prod: return reduce_loop<T, reduce_op::prod>(d, x, y, n, 0);
      case reduce_op::band:
      case reduce_op::bor:
      case reduce_op::bxor:
        if constexpr (std::is_integral_v<T>) {
          if (op == reduce_op::band) return reduce_loop<T, reduce_op::band>(d, x, y, n, 0);
          if (op == reduce_op::bor) return reduce_loop<T, reduce_op::bor>(d, x, y, n, 0);
          return reduce_loop<T, reduce_op::bxor>(d, x, y, n, 0);
        }
        return;
    }
  });
}

HERD_SEPARATE void host_finalize_avg(dtype t, void* data, std::size_t n, int ranks) {
  visit(t, [&](auto element) {
    using T = decltype(element);
    auto* d = static_cast<T*>(data);
    for (std::size_t i = 0; i < n; ++i) d[i] = finalize_avg(d[i], ranks);
  });
}

HERD_SEPARATE void reduce_in_rank_order(dtype type, reduce_op op, std::byte* dst, int count, operand_ref operand,
                                        std::size_t n, int avg_ranks) {
  host_reduce(type, op, dst, operand(0), operand(1), n, count == 2 ? avg_ranks : 0);
  for (int q = 2; q < count; ++q) host_reduce(type, op, dst, dst, operand(q), n, q == count - 1 ? avg_ranks : 0);
}

}  // namespace herd::detail
#endif  // HERD_SEPARATE_DEFINITIONS

#endif  // HERD_COLLECTIVES_DETAIL_HOST_REDUCE_HPP
