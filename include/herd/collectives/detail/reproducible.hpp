#ifndef HERD_COLLECTIVES_DETAIL_REPRODUCIBLE_HPP
#define HERD_COLLECTIVES_DETAIL_REPRODUCIBLE_HPP
// Reproducible sums (comm_options::reproducible, HERD_REPRODUCIBLE=1): a float allreduce with sum
// or avg whose bits depend on the multiset of the ranks' values only: not on the algorithm, the
// node layout, how a tensor is cut into buckets or pieces, or which rank holds which value.
//
// How. An element's result is a function of its p values that ignores their order: their exact
// sum, correctly rounded to the element type (to nearest, ties to even), which is also as accurate
// as a sum can be. For two f32 or f64 values that is their IEEE sum (add_pair_block). Where the
// values' exponents lie close enough together (spread + the type's precision + log2 p + 1 bits fit
// in a double's 53: for f32 at 4 ranks a spread of 2^26, for f16 2^39), the sum of their doubles is
// exact in any order and is rounded once. Otherwise (and for f64 at 3 ranks or more) they are
// summed exactly as a floating-point expansion (two-sum chains, Shewchuk 1997), and its value is
// rounded by comparing it, exactly, with the midpoints around an approximation
// (exact_sum_rounded). A NaN anywhere, or infinities of both signs, give the quiet NaN; otherwise an
// infinity gives itself.
//
// Where. The rank that computes an element must see all p values of it. On one node they are in
// the node's shared memory at once (shm_allreduce, collectives/detail/shm.hpp, calls
// reproducible_reduce). Otherwise reproducible_allreduce below: a pairwise exchange brings rank r
// piece r of every rank's tensor (the bytes of a reduce-scatter), the function runs on each
// element, and the ring's allgather returns the results: the ring allreduce's bandwidth, on MPI
// messages (never the hierarchical path, whose partial sums per node depend on the layout). Small
// tensors reduce, with every rank's tensor at hand, the same function after the agreement.
// Integer sums are the same in any order already; min, max and prod, and every reduction of device
// tensors (an error in this mode), are not covered.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/collectives/detail/pairwise.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/half.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/runtime/timeline.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace herd::detail {

// Whether the reproducible sum takes this reduction.
inline bool reproducible_applies(bool reproducible, dtype type, reduce_op op) {
  return reproducible && is_floating_point(type) && (op == reduce_op::sum || op == reduce_op::avg);
}

// A reproducible sum is computed on the host: a device tensor that asks for one is an error, not
// a silent sum in some order.
template <communicator C> void require_reproducible_on_host(call_check& check, C& comm, const_buffer_view t, reduce_op op) {
  if (check.ok() && reproducible_applies(comm.options().reproducible, t.type, op) && !t.device.is_cpu()) {
    check.fail(12, "reproducible sums (HERD_REPRODUCIBLE=1) are computed on host tensors only, and this one is on " +
                       t.device.str(),
               "Reduce a host copy of it, or create the communicator of GPU tensors with reproducible off");
  }
}

// s + e == a + b exactly, s the rounded sum (Knuth's two-sum; any order of a and b).
inline void two_sum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

// Adds x to the expansion e[0..m) in place (Shewchuk's grow-expansion, zero components dropped):
// afterwards e[0..returned) holds the exact sum, nonoverlapping components in increasing magnitude,
// the last one the largest (a sum of zeros keeps one zero, of the sign a plain sum would give).
inline int grow_expansion(double* e, int m, double x) {
  int k = 0;
  double q = x;
  for (int j = 0; j < m; ++j) {
    double s = 0;
    double err = 0;
    two_sum(q, e[j], s, err);
    if (err != 0) e[k++] = err;
    q = s;
  }
  if (q != 0 || k == 0) e[k++] = q;
  return k;
}

// The sign of e's exact value minus (a + b): -1, 0 or 1. `scratch` has room for m + 2.
inline int compare_expansion(const double* e, int m, double a, double b, double* scratch) {
  std::copy(e, e + m, scratch);
  int k = grow_expansion(scratch, m, -a);
  k = grow_expansion(scratch, k, -b);
  const double top = scratch[k - 1];
  return top > 0 ? 1 : top < 0 ? -1 : 0;
}

// The neighbours of a finite T, and whether its last bit is 0 (ties go there).
template <class T> T step_from(T x, bool up) {
  if constexpr (is_16bit_float<T>) {
    // Sign and magnitude: up from a positive (or +0) adds one to the bits, from a negative takes one.
    const bool negative = (x.bits & 0x8000u) != 0;
    const auto magnitude = static_cast<std::uint16_t>(x.bits & 0x7fffu);
    std::uint16_t bits = 0;
    if (magnitude == 0) bits = up ? 0x0001u : 0x8001u;
    else if (negative == up) bits = static_cast<std::uint16_t>(x.bits - 1u);
    else bits = static_cast<std::uint16_t>(x.bits + 1u);
    return T::from_bits(bits);
  } else {
    return std::nextafter(x, up ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
  }
}
template <class T> bool is_even(T x) {
  if constexpr (is_16bit_float<T>) return (x.bits & 1u) == 0;
  else if constexpr (sizeof(T) == 4) return (std::bit_cast<std::uint32_t>(x) & 1u) == 0;
  else return (std::bit_cast<std::uint64_t>(x) & 1u) == 0;
}

inline int ceil_log2(int n) {
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  return bits;
}

// The exact sum of finite doubles v[0..n) rounded once to a double, to nearest, ties to even, by
// way of a wide integer: each value is an integer multiple of 2^-1074, so their sum is one too,
// held in two's complement in 64-bit words. For f64 sums whose two-sums overflow (values within a
// factor p of the largest double, where an expansion's components become infinite or NaN while
// the exact sum may still be finite): rare, so slow and simple.
inline double wide_sum_rounded(const double* v, int n) {
  const auto words = static_cast<std::size_t>((2098 + ceil_log2(n) + 1) / 64 + 2);
  std::vector<std::uint64_t> sum(words, 0);
  auto negate = [](std::vector<std::uint64_t>& x) {  // two's complement, in place
    std::uint64_t carry = 1;
    for (std::uint64_t& t : x) {
      t = ~t + carry;
      carry = carry != 0 && t == 0 ? 1u : 0u;
    }
  };
  for (int i = 0; i < n; ++i) {
    if (v[i] == 0) continue;
    int exponent = 0;
    const double fraction = std::frexp(std::fabs(v[i]), &exponent);  // |v| = fraction * 2^exponent
    auto mantissa = static_cast<std::uint64_t>(std::ldexp(fraction, 53));
    int shift = exponent - 53 + 1074;  // |v| = mantissa * 2^(shift - 1074)
    if (shift < 0) {                   // a subnormal: its low bits are zeros
      mantissa >>= -shift;
      shift = 0;
    }
    // The value's words, negated for a negative value, added with carries.
    std::vector<std::uint64_t> term(words, 0);
    const auto word = static_cast<std::size_t>(shift / 64);
    const int bit = shift % 64;
    term[word] = mantissa << bit;
    if (bit != 0) term[word + 1] = mantissa >> (64 - bit);
    if (v[i] < 0) negate(term);
    std::uint64_t carry = 0;
    for (std::size_t k = 0; k < words; ++k) {
      const std::uint64_t a = sum[k] + carry;
      const std::uint64_t b = a + term[k];
      carry = (a < carry ? 1u : 0u) + (b < a ? 1u : 0u);
      sum[k] = b;
    }
  }
  const bool negative = (sum.back() >> 63) != 0;
  if (negative) negate(sum);
  auto bit_at = [&](int i) { return i >= 0 && ((sum[static_cast<std::size_t>(i / 64)] >> (i % 64)) & 1u) != 0; };
  int top = -1;
  for (std::size_t k = words; k-- > 0;) {
    if (sum[k] != 0) {
      top = static_cast<int>(64 * k) + 63 - std::countl_zero(sum[k]);
      break;
    }
  }
  if (top < 0) return 0.0;  // an exact zero of values not all zeros: +0, as a plain sum gives
  // The top 53 bits, then to nearest, ties to even, on the bit below and any bit under it.
  const int low = std::max(top - 52, 0);
  std::uint64_t mantissa = 0;
  for (int i = top; i >= low; --i) mantissa = (mantissa << 1) | (bit_at(i) ? 1u : 0u);
  bool sticky = false;
  for (int i = low - 2; i >= 0 && !sticky; --i) sticky = bit_at(i);
  if (bit_at(low - 1) && (sticky || (mantissa & 1u) != 0)) ++mantissa;  // 2^53 after a carry: still exact
  const double magnitude = std::ldexp(static_cast<double>(mantissa), low - 1074);  // beyond the range: inf
  return negative ? -magnitude : magnitude;
}

// The exact sum of v[0..n) (finite doubles converted from T) rounded once to T, to nearest, ties
// to even: an expansion holds the sum exactly; its components added from the smallest give a
// double within an ulp of it, which rounds to T as c; the exact value is then compared with the
// midpoints between c and its neighbours, which decides between them. Order-free: nothing here
// depends on the order of v but that double, and the comparison corrects it. `work` has room for
// 2n + 4 doubles.
template <class T> T exact_sum_rounded(const double* v, int n, double* work) {
  double* e = work;
  int m = 0;
  for (int i = 0; i < n; ++i) m = grow_expansion(e, m, v[i]);
  double approximation = e[0];
  for (int j = 1; j < m; ++j) approximation += e[j];
  if constexpr (std::is_same_v<T, double>) {
    if (!std::isfinite(approximation)) return wide_sum_rounded(v, n);  // the two-sums overflowed
  }
  const T c = from_double<T>(approximation);
  const double at = to_double(c);
  if (!std::isfinite(at)) return c;  // beyond T's range: the infinity a plain sum gives
  double* scratch = work + n + 2;
  const T candidates[2] = {step_from(c, true), step_from(c, false)};
  for (const T next : candidates) {
    const double to = to_double(next);
    if (!std::isfinite(to)) continue;
    const double half_step = (to - at) / 2;  // exact: neighbours are one power of two apart
    if (half_step == 0) continue;            // the smallest subnormal step of a double: sums there are exact
    const int side = compare_expansion(e, m, at, half_step, scratch);
    const int beyond = to > at ? side : -side;  // 1: past the midpoint toward `next`
    if (beyond > 0) return next;
    if (beyond == 0) return is_even(c) ? c : next;
  }
  return c;
}

// One element that the fast test (below) did not settle: a NaN or an infinity among its p values
// (doubles converted exactly from T), or exponents too far apart for a double sum; f64 always.
// `work` has room for 2p + 4 doubles.
template <class T> T reproducible_element(const double* values, int p, double* work) {
  bool nan = false;
  bool plus_inf = false;
  bool minus_inf = false;
  for (int q = 0; q < p; ++q) {
    const double x = values[q];
    if (std::isnan(x)) nan = true;
    else if (std::isinf(x)) (x > 0 ? plus_inf : minus_inf) = true;
  }
  if (nan || (plus_inf && minus_inf)) return from_double<T>(std::numeric_limits<double>::quiet_NaN());
  if (plus_inf || minus_inf) return from_double<T>(plus_inf ? std::numeric_limits<double>::infinity()
                                                            : -std::numeric_limits<double>::infinity());
  return exact_sum_rounded<T>(values, p, work);
}

// The fast test's loops, over blocks of a constant size (so that GCC vectorizes them at -O2,
// which takes no loop that needs a remainder or an overlap check, and no branch: choices are
// selects). Per element, over the operands: the double sum, and the largest magnitude and the
// smallest nonzero one (+inf while there is none). NaN and infinities need no test of their own:
// they make the double sum NaN or infinite, which the check below sends to the exact path.
inline constexpr std::size_t reproducible_block = 256;
inline void accumulate_block(const float* __restrict x, double* __restrict sum, float* __restrict least,
                             float* __restrict most) {
  for (std::size_t i = 0; i < reproducible_block; ++i) {
    const float a = std::fabs(x[i]);
    const float nonzero = a == 0.0f ? std::numeric_limits<float>::infinity() : a;
    sum[i] += static_cast<double>(x[i]);
    least[i] = least[i] < nonzero ? least[i] : nonzero;
    most[i] = most[i] > a ? most[i] : a;
  }
}

// Whether an element's double sum may be inexact or is not finite: its nonzero values' exponent
// fields further apart than `spread_limit` (subnormals count as 1, the smallest normal's; all
// zeros: least is +inf, never), or the sum, as a float, an infinity or a NaN (a NaN or an
// infinity among the values; or a finite sum beyond float's range, which the exact path rounds
// to the same infinity).
inline bool needs_exact(float least, float most, double sum, std::int32_t spread_limit) {
  const std::int32_t low_field = std::bit_cast<std::int32_t>(least) >> 23;
  const std::int32_t low = low_field | static_cast<std::int32_t>(low_field == 0);
  const std::int32_t high = std::bit_cast<std::int32_t>(most) >> 23;
  const std::int32_t total = std::bit_cast<std::int32_t>(static_cast<float>(sum)) & 0x7f800000;
  return (static_cast<std::int32_t>(high - low > spread_limit) | static_cast<std::int32_t>(total == 0x7f800000)) != 0;
}

// Whether no element of the block needs_exact (a loop without branches: it vectorizes).
inline bool all_close(const float* __restrict least, const float* __restrict most, const double* __restrict sum,
                      std::int32_t spread_limit) {
  std::int32_t far = 0;
  for (std::size_t i = 0; i < reproducible_block; ++i) {
    far |= static_cast<std::int32_t>(needs_exact(least[i], most[i], sum[i], spread_limit));
  }
  return far == 0;
}

// Two f32 or f64 values: IEEE addition rounds their exact sum once, to nearest, ties to even, and
// is commutative, so a + b is already the reproducible sum; only a NaN's bits depend on the order
// of a and b (and inf - inf gives the processor's own NaN), so every NaN becomes the quiet NaN the
// exact path gives.
template <class T> void add_pair_block(const T* __restrict a, const T* __restrict b, T* __restrict out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const T s = a[i] + b[i];
    out[i] = s == s ? s : std::numeric_limits<T>::quiet_NaN();
  }
}

// dst[i] = the reproducible sum (divided by p for avg, as herd's avg divides a sum) of
// operand(0)[i] ... operand(p - 1)[i], for i < n. dst may be any operand. Blocks of elements go
// through the fast test first, one operand at a time (loops the compiler vectorizes): the double
// sum, and the spread of the exponents of the nonzero values; an element that needs_exact is then
// computed on its own (reproducible_element), as every f64 element is.
HERD_SEPARATE void reproducible_reduce(dtype type, reduce_op op, std::byte* dst, int p, operand_ref operand,
                                       std::size_t n);

// Combines the p ranks' values of n elements (operand(q): rank q's) into dst as every host path
// does: with reproducible sums (comm_options::reproducible) the order-free function above, else
// in rank order (avg divides the sum by p).
HERD_SEPARATE void combine_ranks(bool reproducible, dtype type, reduce_op op, std::byte* dst, int p,
                                 operand_ref operand, std::size_t n);

// The reproducible reduce-scatter of host memory, over MPI messages: rank r ends with chunk r of
// the reduction at `mine` (which may be in_chunk(r) itself). Piece r of every rank's tensor comes
// to rank r (pairwise exchange), and the function above runs on it.
template <communicator C, class InChunk>
void reproducible_reduce_scatter(C& comm, dtype type, reduce_op op, const chunk_layout& chunks, InChunk in_chunk,
                                 std::byte* mine) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t es = size_of(type);
  const std::size_t n = chunks.length[r];
  std::byte* gathered = scratch(static_cast<std::size_t>(p) * n * es, scratch_slot::staging);
  auto piece = [&](int q) { return gathered + static_cast<std::size_t>(q) * n * es; };
  {
    const trace::span phase(comm.operations().track(), "gather pieces");
    pairwise_exchange(
        comm,
        [&](int to) {
          return std::pair<void*, std::size_t>(const_cast<std::byte*>(in_chunk(to)),
                                               chunks.length[static_cast<std::size_t>(to)] * es);
        },
        [&](int from) { return std::pair<void*, std::size_t>(piece(from), n * es); });
  }
  if (n != 0) std::memcpy(piece(static_cast<int>(r)), in_chunk(static_cast<int>(r)), n * es);
  const trace::span phase(comm.operations().track(), "reproducible sum", trace::fields::elements(n, type));
  reproducible_reduce(type, op, mine, p, piece, n);
}

// The reproducible allreduce of a host tensor over MPI messages: the reduce-scatter above, then
// the results to every rank (the ring's allgather).
template <communicator C>
void reproducible_allreduce(C& comm, dtype type, reduce_op op, const std::byte* in, std::byte* out, std::size_t count) {
  const std::size_t es = size_of(type);
  const chunk_layout chunks = chunk_layout::even(count, comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  reproducible_reduce_scatter(
      comm, type, op, chunks, [&](int c) { return in + chunks.offset[static_cast<std::size_t>(c)] * es; },
      out + chunks.offset[r] * es);
  ring_allgather(comm, out, es, chunks, comm.options().ring_segment_bytes);
}

}  // namespace herd::detail

// The definitions of the two functions above: inline, or with HERD_SEPARATE_COMPILATION only in
// the program's implementation file (core/config.hpp), as they instantiate the sums for every
// floating-point dtype.
#if defined(HERD_SEPARATE_DEFINITIONS)
namespace herd::detail {

HERD_SEPARATE void reproducible_reduce(dtype type, reduce_op op, std::byte* dst, int p, operand_ref operand,
                                       std::size_t n) {
  visit(type, [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_floating_point_v<T> || is_16bit_float<T>) {
      constexpr int precision = std::is_same_v<T, double> ? 53 : std::is_same_v<T, float> ? 24
                                : std::is_same_v<T, half>                                ? 11
                                                                                         : 8;
      // The double sum of p values is exact when spread + precision + log2 p + 1 bits fit in 53.
      const int spread_limit = std::is_same_v<T, double> ? -1 : 53 - precision - ceil_log2(p) - 1;
      // Room for p operands and 3p + 4 doubles: on the stack up to 32 ranks (no allocation for a
      // small tensor's sum), else on the heap.
      constexpr int on_stack = 32;
      const T* from_here[on_stack];
      double values_here[3 * on_stack + 4];
      std::vector<const T*> from_heap(p > on_stack ? static_cast<std::size_t>(p) : 0);
      std::vector<double> values_heap(p > on_stack ? static_cast<std::size_t>(3 * p + 4) : 0);
      const T** from = p > on_stack ? from_heap.data() : from_here;
      double* values = p > on_stack ? values_heap.data() : values_here;
      for (int q = 0; q < p; ++q) from[q] = reinterpret_cast<const T*>(operand(q));
      auto* out = reinterpret_cast<T*>(dst);
      auto exact = [&](std::size_t i) {
        for (int q = 0; q < p; ++q) values[q] = to_double(from[q][i]);
        return reproducible_element<T>(values, p, values + p);
      };
      double sum[reproducible_block];
      float least[reproducible_block];
      float most[reproducible_block];
      float staged[reproducible_block];
      T results[reproducible_block];  // a block's results, where they cannot be written in place
      constexpr bool pair_adds = std::is_same_v<T, double> || std::is_same_v<T, float>;
      for (std::size_t begin = 0; begin < n; begin += reproducible_block) {
        const std::size_t m = std::min(reproducible_block, n - begin);
        if (pair_adds && p == 2) {
          if constexpr (pair_adds) {
            // Into a block of its own first: dst may be an operand, and __restrict must hold.
            if (m == reproducible_block) add_pair_block(from[0] + begin, from[1] + begin, results, reproducible_block);
            else add_pair_block(from[0] + begin, from[1] + begin, results, m);
            std::memcpy(out + begin, results, m * sizeof(T));
          }
        } else if constexpr (std::is_same_v<T, double>) {
          for (std::size_t i = 0; i < m; ++i) out[begin + i] = exact(begin + i);
        } else if (m < reproducible_block) {
          // A short tensor or the last block: the same test, one element at a time.
          for (std::size_t i = begin; i < begin + m; ++i) {
            double total = -0.0;
            float smallest = std::numeric_limits<float>::infinity();
            float largest = 0.0f;
            for (int q = 0; q < p; ++q) {
              const float f = static_cast<float>(from[q][i]);
              const float a = std::fabs(f);
              total += static_cast<double>(f);
              if (a != 0.0f) smallest = std::min(smallest, a);
              largest = std::max(largest, a);
            }
            out[i] = needs_exact(smallest, largest, total, spread_limit) ? exact(i) : from_double<T>(total);
          }
        } else {
          std::fill(sum, sum + reproducible_block, -0.0);  // -0 + x is x, -0 included
          std::fill(least, least + reproducible_block, std::numeric_limits<float>::infinity());
          std::fill(most, most + reproducible_block, 0.0f);
          for (int q = 0; q < p; ++q) {
            const T* x = from[q] + begin;
            const float* block = staged;
            if constexpr (std::is_same_v<T, float>) {
              block = x;
            } else {
              for (std::size_t i = 0; i < reproducible_block; ++i) staged[i] = static_cast<float>(x[i]);
            }
            accumulate_block(block, sum, least, most);
          }
          // Where no element needs_exact, the double sums were exact in any order; the rest (rare)
          // one by one, before any result is written (dst may be an operand that exact() reads).
          if (all_close(least, most, sum, spread_limit)) {
            for (std::size_t i = 0; i < reproducible_block; ++i) out[begin + i] = from_double<T>(sum[i]);
          } else {
            for (std::size_t i = 0; i < reproducible_block; ++i) {
              results[i] = needs_exact(least[i], most[i], sum[i], spread_limit) ? exact(begin + i) : from_double<T>(sum[i]);
            }
            std::memcpy(out + begin, results, reproducible_block * sizeof(T));
          }
        }
        if (op == reduce_op::avg) {
          for (std::size_t i = 0; i < m; ++i) out[begin + i] = finalize_avg(out[begin + i], p);
        }
      }
    }
  });
}

HERD_SEPARATE void combine_ranks(bool reproducible, dtype type, reduce_op op, std::byte* dst, int p,
                                 operand_ref operand, std::size_t n) {
  if (reproducible_applies(reproducible, type, op)) return reproducible_reduce(type, op, dst, p, operand, n);
  reduce_in_rank_order(type, op, dst, p, operand, n, op == reduce_op::avg ? p : 0);
}

}  // namespace herd::detail
#endif  // HERD_SEPARATE_DEFINITIONS

#endif  // HERD_COLLECTIVES_DETAIL_REPRODUCIBLE_HPP
