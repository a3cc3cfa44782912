// Reproducible sums (comm_options::reproducible) on real MPI ranks: every path, split and order of
// the inputs gives the same bits; the results are the correctly rounded sums, against an exact
// reference (a wide integer) on adversarial inputs; training is bit-identical whatever the
// algorithm and the fusion.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"
#include "../support/mpi_world.hpp"
#include "../support/reference.hpp"
#include "../support/tiny_mlp_training.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

using herd_test::rng;
using bytes = std::vector<std::byte>;

using herd_test::world_rank;
using herd_test::world_size;

herd::comm_options reproducible(herd::algorithm a = herd::algorithm::automatic, int node_size = 0, bool on = true) {
  herd::comm_options o;
  o.reproducible = on;
  o.allreduce_algorithm = a;
  o.simulated_node_size = node_size;
  return o;
}

// Element type properties for the exact reference: precision (bits, with the hidden one), the
// exponent of the smallest subnormal's last bit, the largest finite exponent.
struct format {
  int precision;
  int quantum;
  int max_exponent;  // the largest finite value is below 2^max_exponent
};
template <class T> constexpr format format_of() {
  if constexpr (std::is_same_v<T, double>) return {53, -1074, 1024};
  else if constexpr (std::is_same_v<T, float>) return {24, -149, 128};
  else if constexpr (std::is_same_v<T, herd::half>) return {11, -24, 16};
  else return {8, -133, 128};
}

// A signed integer of many 32-bit words (two's complement, little end first): the exact sum of
// floats, in units of their type's smallest quantum.
struct big {
  std::vector<std::uint32_t> w;
  explicit big(std::size_t words) : w(words, 0) {}
  void add_shifted(std::uint64_t m, int shift, bool negative) {  // += or -= m << shift
    std::vector<std::uint32_t> t(w.size(), 0);
    const auto word = static_cast<std::size_t>(shift / 32);
    const int bit = shift % 32;
    const unsigned __int128 v = static_cast<unsigned __int128>(m) << bit;
    for (std::size_t k = 0; k < 4 && word + k < t.size(); ++k) t[word + k] = static_cast<std::uint32_t>(v >> (32 * k));
    if (negative) {  // two's complement of t
      std::uint64_t carry = 1;
      for (auto& x : t) {
        const std::uint64_t s = static_cast<std::uint64_t>(~x) + carry;
        x = static_cast<std::uint32_t>(s);
        carry = s >> 32;
      }
    }
    std::uint64_t carry = 0;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const std::uint64_t s = static_cast<std::uint64_t>(w[k]) + t[k] + carry;
      w[k] = static_cast<std::uint32_t>(s);
      carry = s >> 32;
    }
  }
  bool negative() const { return (w.back() >> 31) != 0; }
  big magnitude() const {
    big m = *this;
    if (!negative()) return m;
    std::uint64_t carry = 1;
    for (auto& x : m.w) {
      const std::uint64_t s = static_cast<std::uint64_t>(~x) + carry;
      x = static_cast<std::uint32_t>(s);
      carry = s >> 32;
    }
    return m;
  }
  int top_bit() const {  // of a non-negative value; -1 for zero
    for (std::size_t k = w.size(); k-- > 0;) {
      if (w[k] != 0) return static_cast<int>(32 * k) + 31 - std::countl_zero(w[k]);
    }
    return -1;
  }
  bool bit(int i) const { return i >= 0 && ((w[static_cast<std::size_t>(i / 32)] >> (i % 32)) & 1u) != 0; }
  bool any_below(int i) const {
    for (int b = 0; b < i; ++b) {
      if (bit(b)) return true;
    }
    return false;
  }
};

// The correctly rounded sum (to nearest, ties to even) of finite values of T.
template <class T> T exact_sum(const std::vector<T>& v) {
  constexpr format f = format_of<T>();
  big sum(static_cast<std::size_t>((f.max_exponent - f.quantum + 64) / 32 + 2));
  bool all_negative_zero = true;
  for (const T x : v) {
    const double d = herd::detail::to_double(x);
    all_negative_zero = all_negative_zero && d == 0 && std::signbit(d);
    if (d == 0) continue;
    int e = 0;
    const double frac = std::frexp(std::fabs(d), &e);  // |d| = frac * 2^e, frac in [0.5, 1)
    auto m = static_cast<std::uint64_t>(std::ldexp(frac, 53));
    int shift = e - 53 - f.quantum;
    if (shift < 0) {  // a value near the quantum: its low bits are zeros
      m >>= -shift;
      shift = 0;
    }
    sum.add_shifted(m, shift, d < 0);  // exact: d's last bit is at or above the quantum
  }
  if (sum.top_bit() < 0 && !sum.negative()) return herd::detail::from_double<T>(all_negative_zero ? -0.0 : 0.0);
  const bool negative = sum.negative();
  const big m = sum.magnitude();
  const int top = m.top_bit();
  // Keep `precision` bits from the top, or down to the quantum (subnormal results need no rounding).
  const int drop = std::max(0, top + 1 - f.precision);
  std::uint64_t kept = 0;
  for (int b = top; b >= drop; --b) kept = kept << 1 | (m.bit(b) ? 1u : 0u);
  const bool half_bit = m.bit(drop - 1);
  const bool sticky = m.any_below(drop - 1);
  if (half_bit && (sticky || (kept & 1u) != 0)) ++kept;
  const double value = std::ldexp(static_cast<double>(kept), drop + f.quantum);
  if (value >= std::ldexp(1.0, f.max_exponent)) {
    return herd::detail::from_double<T>(negative ? -std::numeric_limits<double>::infinity()
                                                 : std::numeric_limits<double>::infinity());
  }
  return herd::detail::from_double<T>(negative ? -value : value);
}

// Distance in ulps between two finite values of T (their bits as ordered integers).
template <class T> long long ulps_apart(T a, T b) {
  // Sign and magnitude to a line: -0 and +0 at 0, the negatives below.
  auto ordered = [](T x) {
    if constexpr (sizeof(T) == 8) {
      const auto bits = std::bit_cast<std::int64_t>(x);
      return bits < 0 ? static_cast<long long>(std::numeric_limits<std::int64_t>::min() - bits) : static_cast<long long>(bits);
    } else if constexpr (sizeof(T) == 4) {
      const long long bits = std::bit_cast<std::int32_t>(x);
      return bits < 0 ? std::numeric_limits<std::int32_t>::min() - bits : bits;
    } else {
      const long long bits = static_cast<std::int16_t>(x.bits);
      return bits < 0 ? std::numeric_limits<std::int16_t>::min() - bits : bits;
    }
  };
  const long long d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Adversarial values for element i of rank r: wide exponents, cancellation across ranks (rank 0's
// big value taken back by the last rank's, with small ones between), subnormals, and exact ties.
template <class T> std::vector<T> adversarial(int r, int p, std::size_t n, std::uint64_t seed) {
  constexpr format f = format_of<T>();
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    rng g(seed * 7919 + i);  // the same big value on every rank for element i
    const double big_value = std::ldexp(1.0 + g.unit(), g.between(f.quantum + f.precision, f.max_exponent - 4));
    rng mine(seed * 104729 + i * 131 + static_cast<std::uint64_t>(r));
    const int kind = static_cast<int>(i % 5);
    double x = 0;
    const double sign = mine.below(2) == 0 ? 1.0 : -1.0;
    switch (kind) {
      case 0:  // any exponent
        x = sign * std::ldexp(1.0 + mine.unit(), mine.between(f.quantum + f.precision, f.max_exponent - 4));
        break;
      case 1:  // cancellation: +big on rank 0, -big on the last rank, small values between
        x = r == 0 ? big_value : r == p - 1 ? -big_value : sign * std::ldexp(1.0 + mine.unit(), mine.between(f.quantum + f.precision, 0));
        break;
      case 2:  // subnormals and the smallest normals
        x = sign * std::ldexp(static_cast<double>(mine.between(1, 1 << std::min(f.precision, 20))), f.quantum);
        break;
      case 3:  // ties: a value and half an ulp of it, spread over ranks
        x = r == 0 ? 1.0 : std::ldexp(1.0, -f.precision) / (p - 1) * (mine.below(2) == 0 ? 1 : 3);
        break;
      default:  // near one another: the usual gradients
        x = sign * (1.0 + mine.unit());
        break;
    }
    v[i] = herd::detail::from_double<T>(x);  // exact or rounded once: the test sums what T holds
  }
  return v;
}

template <class T> herd::dtype dtype_of() {
  if constexpr (std::is_same_v<T, double>) return herd::dtype::f64;
  else if constexpr (std::is_same_v<T, float>) return herd::dtype::f32;
  else if constexpr (std::is_same_v<T, herd::half>) return herd::dtype::f16;
  else return herd::dtype::bf16;
}

template <class T> bytes as_bytes(const std::vector<T>& v) {
  bytes b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Rank r's input for the "every path" test: rough floats of mixed magnitudes.
template <class T> std::vector<T> rough_input(int r, std::size_t n, std::uint64_t seed) {
  rng g(seed * 1000003 + static_cast<std::uint64_t>(r));
  std::vector<T> v(n);
  for (auto& x : v) {
    const double sign = g.below(2) == 0 ? 1.0 : -1.0;
    x = herd::detail::from_double<T>(sign * std::ldexp(1.0 + g.unit(), g.between(-12, 12)));
  }
  return v;
}

template <class T> std::size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t k = 0;
  for (std::size_t i = 0; i < a.size(); ++i) k += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return k;
}

// Every way of running the allreduce that must give the reference's bits, for one dtype and op.
template <class T> void every_path(herd::reduce_op op) {
  const int r = world_rank();
  const int p = world_size();
  herd::mpi_communicator ring(MPI_COMM_WORLD, reproducible(herd::algorithm::ring));
  herd::mpi_communicator automatic(MPI_COMM_WORLD, reproducible());
  herd::mpi_communicator shm(MPI_COMM_WORLD, reproducible(herd::algorithm::shared_memory));
  herd::comm_options no_thread = reproducible();
  no_thread.progress_thread = false;
  herd::mpi_communicator in_wait(MPI_COMM_WORLD, no_thread);
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{70001}}) {
    INFO("dtype ", herd::name(dtype_of<T>()), " op ", herd::name(op), " count ", n, " ranks ", p);
    const std::uint64_t seed = n * 31 + static_cast<std::uint64_t>(op);
    const std::vector<T> mine = rough_input<T>(r, n, seed);
    std::vector<T> reference = mine;
    herd::allreduce(reference, ring, op);
    auto check_same = [&](const char* path, const std::vector<T>& got) {
      INFO("path: ", std::string(path));
      CHECK(differing(got, reference) == 0);
    };
    for (herd::mpi_communicator* c : {&automatic, &shm}) {
      std::vector<T> whole = mine;
      herd::allreduce(whole, *c, op);
      check_same(c == &shm ? "shared memory" : "automatic", whole);
      // Out of place.
      std::vector<T> out(n);
      herd::allreduce(mine, out, *c, op);
      check_same("out of place", out);
      // In 4 pieces, one allreduce each (some small enough to travel with the agreement).
      std::vector<T> pieces = mine;
      for (int k = 0; k < 4; ++k) {
        const std::size_t lo = n * static_cast<std::size_t>(k) / 4;
        const std::size_t hi = n * static_cast<std::size_t>(k + 1) / 4;
        std::vector<T> part(pieces.begin() + static_cast<std::ptrdiff_t>(lo), pieces.begin() + static_cast<std::ptrdiff_t>(hi));
        herd::allreduce(part, *c, op);
        std::copy(part.begin(), part.end(), pieces.begin() + static_cast<std::ptrdiff_t>(lo));
      }
      check_same("4 pieces", pieces);
      // The same pieces as one grouped allreduce, and asynchronously.
      std::vector<T> a(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(n / 3));
      std::vector<T> b(mine.begin() + static_cast<std::ptrdiff_t>(n / 3), mine.end());
      herd::allreduce(herd::views(a, b), *c, op);
      a.insert(a.end(), b.begin(), b.end());
      check_same("grouped", a);
      std::vector<T> later = mine;
      herd::allreduce_async(later, *c, op).wait();
      check_same("async", later);
    }
    std::vector<T> queued = mine;
    herd::allreduce_async(queued, in_wait, op).wait();
    check_same("no progress thread", queued);
    // The ranks' inputs rotated and reversed: the same multiset of values per element.
    std::vector<T> rotated = rough_input<T>((r + 1) % p, n, seed);
    herd::allreduce(rotated, automatic, op);
    check_same("inputs rotated over the ranks", rotated);
    std::vector<T> reversed = rough_input<T>(p - 1 - r, n, seed);
    herd::allreduce(reversed, ring, op);
    check_same("inputs reversed over the ranks", reversed);
    if (p % 2 == 0 && p >= 4) {
      herd::mpi_communicator nodes(MPI_COMM_WORLD, reproducible(herd::algorithm::hierarchical, 2));
      std::vector<T> across = mine;
      herd::allreduce(across, nodes, op);
      check_same("hierarchical, 2 simulated nodes", across);
    }
  }
}

// reduce_scatter and reduce (what zero_optimizer and rooted reductions use) give, on every path,
// the bits of the reproducible allreduce: each rank its block of it, the root all of it.
template <class T> void scatter_and_reduce(herd::reduce_op op) {
  const int r = world_rank();
  const int p = world_size();
  herd::mpi_communicator ring(MPI_COMM_WORLD, reproducible(herd::algorithm::ring));
  herd::mpi_communicator automatic(MPI_COMM_WORLD, reproducible());
  herd::mpi_communicator shm(MPI_COMM_WORLD, reproducible(herd::algorithm::shared_memory));
  std::vector<herd::mpi_communicator*> paths = {&ring, &automatic, &shm};
  std::optional<herd::mpi_communicator> nodes;
  if (p % 2 == 0 && p >= 4) paths.push_back(&nodes.emplace(MPI_COMM_WORLD, reproducible(herd::algorithm::hierarchical, 2)));
  for (const std::size_t block : {std::size_t{1}, std::size_t{300}, std::size_t{20000}}) {
    const std::size_t n = block * static_cast<std::size_t>(p);
    const std::vector<T> mine = rough_input<T>(r, n, block * 7 + static_cast<std::uint64_t>(op));
    std::vector<T> reference = mine;
    herd::allreduce(reference, ring, op);
    const std::vector<T> my_block(reference.begin() + static_cast<std::ptrdiff_t>(block * static_cast<std::size_t>(r)),
                                  reference.begin() + static_cast<std::ptrdiff_t>(block * static_cast<std::size_t>(r + 1)));
    for (std::size_t k = 0; k < paths.size(); ++k) {
      INFO("dtype ", herd::name(dtype_of<T>()), " op ", herd::name(op), " block ", block, " path ", k, " ranks ", p);
      std::vector<T> scattered(block);
      herd::reduce_scatter(mine, scattered, *paths[k], op);
      CHECK(differing(scattered, my_block) == 0);
      std::vector<T> reduced(n);
      herd::reduce(mine, reduced, *paths[k], op, p - 1);
      if (r == p - 1) CHECK(differing(reduced, reference) == 0);
    }
  }
}

}  // namespace

HERD_MPI_TEST_CASE("reproducible sums: every path, split and order of the inputs gives the same bits", 2) {
  for (herd::reduce_op op : {herd::reduce_op::sum, herd::reduce_op::avg}) {
    every_path<float>(op);
    every_path<double>(op);
    every_path<herd::half>(op);
    every_path<herd::bfloat16>(op);
  }
}

// The inputs above do tell paths apart without the mode: at 3 ranks or more, the ring's order of
// additions and shared memory's (rank order) differ in some elements.
HERD_MPI_TEST_CASE("reproducible sums: reduce_scatter and reduce give the allreduce's bits on every path", 2) {
  for (herd::reduce_op op : {herd::reduce_op::sum, herd::reduce_op::avg}) {
    scatter_and_reduce<float>(op);
    scatter_and_reduce<double>(op);
    scatter_and_reduce<herd::half>(op);
    scatter_and_reduce<herd::bfloat16>(op);
  }
}

HERD_MPI_TEST_CASE("reproducible sums: without the mode, the ring and shared memory differ on the same inputs", 3) {
  const std::size_t n = 70001;
  const std::vector<float> mine = rough_input<float>(world_rank(), n, 7);
  herd::mpi_communicator ring(MPI_COMM_WORLD, reproducible(herd::algorithm::ring, 0, false));
  herd::mpi_communicator shm(MPI_COMM_WORLD, reproducible(herd::algorithm::shared_memory, 0, false));
  std::vector<float> a = mine;
  std::vector<float> b = mine;
  herd::allreduce(a, ring);
  herd::allreduce(b, shm);
  CHECK(differing(a, b) > 0);
}

namespace {

template <class T> void against_exact() {
  const int r = world_rank();
  const int p = world_size();
  herd::mpi_communicator comm(MPI_COMM_WORLD, reproducible());
  for (const std::size_t n : {std::size_t{500}, std::size_t{20000}}) {
    INFO("dtype ", herd::name(dtype_of<T>()), " count ", n, " ranks ", p);
    std::vector<std::vector<T>> all;
    for (int q = 0; q < p; ++q) all.push_back(adversarial<T>(q, p, n, n + 3));
    std::vector<T> got = all[static_cast<std::size_t>(r)];
    herd::allreduce(got, comm);
    std::size_t exact = 0;
    std::size_t off_by_one = 0;
    std::size_t worse = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<T> column;
      for (int q = 0; q < p; ++q) column.push_back(all[static_cast<std::size_t>(q)][i]);
      const T want = exact_sum(column);
      const long long apart = ulps_apart(got[i], want);
      exact += apart == 0;
      off_by_one += apart == 1;
      if (apart > 1) {
        ++worse;
        if (worse <= 3) {
          MESSAGE("element ", i, ": ", herd::detail::to_double(got[i]), " where the exact sum rounds to ",
                  herd::detail::to_double(want));
        }
      }
    }
    CHECK(worse == 0);
    if (r == 0) MESSAGE(herd::name(dtype_of<T>()), " at ", p, " ranks: ", exact, " of ", n, " correctly rounded, ", off_by_one,
            " one ulp away");
    CHECK(exact == n);
  }
}

}  // namespace

HERD_MPI_TEST_CASE("reproducible sums: the correctly rounded sum of adversarial inputs, against an exact one", 2) {
  against_exact<float>();
  against_exact<double>();
  against_exact<herd::half>();
  against_exact<herd::bfloat16>();
}

// The wide-integer sum that f64 takes where its two-sums overflow, on its own (each rank the same
// 20000 sets of 2-6 doubles: any exponent, subnormals, cancellation), against the exact reference.
HERD_MPI_TEST_CASE("reproducible sums: the wide-integer f64 sum against an exact one", 2) {
  rng g(99);
  std::size_t wrong = 0;
  for (int k = 0; k < 20000; ++k) {
    std::vector<double> v(static_cast<std::size_t>(2 + g.below(5)));
    for (double& x : v) {
      const double sign = g.below(2) == 0 ? 1.0 : -1.0;
      const int e = g.below(4) == 0 ? g.between(1018, 1023) : g.between(-1074, 1023);
      x = sign * std::ldexp(1.0 + g.unit(), e - 1);  // subnormal below 2^-1022, rounded to one there
      if (g.below(8) == 0) x = -v[0];                 // cancellation
    }
    const double got = herd::detail::wide_sum_rounded(v.data(), static_cast<int>(v.size()));
    const double want = exact_sum(v);
    wrong += std::memcmp(&got, &want, sizeof(double)) != 0;
  }
  CHECK(wrong == 0);
}

namespace {

template <class T> T largest_finite() {
  if constexpr (std::is_same_v<T, herd::half>) return herd::half::from_bits(0x7bff);
  else if constexpr (std::is_same_v<T, herd::bfloat16>) return herd::bfloat16::from_bits(0x7f7f);
  else return std::numeric_limits<T>::max();
}

// NaN, infinities and sums beyond the range, in a whole block and in the last part of a tensor:
// element 0: +inf on one rank; 1: +inf and -inf; 2: NaNs of different bits on every rank; 3: the
// largest finite value on every rank (an overflow without an infinity among the values); 4 and 5
// (3 ranks or more): the largest value twice and its negation once, in two orders (the exact sum
// is the largest value, though a sum in some orders overflows); 6 and up: ones. Every NaN of a
// result is the quiet NaN (its bits would otherwise depend on which rank's NaN came first).
template <class T> void special_values() {
  const int r = world_rank();
  const int p = world_size();
  INFO("dtype ", herd::name(dtype_of<T>()), " ranks ", p);
  herd::mpi_communicator comm(MPI_COMM_WORLD, reproducible());
  const T inf = herd::detail::from_double<T>(std::numeric_limits<double>::infinity());
  const T quiet = herd::detail::from_double<T>(std::numeric_limits<double>::quiet_NaN());
  const T big = largest_finite<T>();
  const T minus_big = herd::detail::from_double<T>(-herd::detail::to_double(big));
  const T one = herd::detail::from_double<T>(1.0);
  const T zero = herd::detail::from_double<T>(0.0);
  auto nan_of_rank = [&] {  // a quiet NaN whose sign and payload name the rank
    T x = quiet;
    unsigned char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    b[0] = static_cast<unsigned char>(b[0] ^ static_cast<unsigned char>(r + 1));
    if (r % 2 == 0) b[sizeof(T) - 1] = static_cast<unsigned char>(b[sizeof(T) - 1] | 0x80u);
    std::memcpy(&x, b, sizeof(T));
    return x;
  };
  auto same_bits = [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; };
  for (std::size_t at : {std::size_t{0}, std::size_t{19990}}) {
    std::vector<T> v(20000, one);
    v[at] = r == 0 ? inf : one;
    v[at + 1] = r == 0 ? inf : r == p - 1 ? herd::detail::from_double<T>(-std::numeric_limits<double>::infinity()) : one;
    v[at + 2] = nan_of_rank();
    v[at + 3] = big;
    v[at + 4] = r < 2 ? big : r == 2 ? minus_big : zero;
    v[at + 5] = r == 0 ? minus_big : r < 3 ? big : zero;
    herd::allreduce(v, comm);
    CHECK(same_bits(v[at], inf));
    CHECK(same_bits(v[at + 1], quiet));
    CHECK(same_bits(v[at + 2], quiet));
    CHECK(same_bits(v[at + 3], inf));
    if (p >= 3) {
      CHECK(same_bits(v[at + 4], big));
      CHECK(same_bits(v[at + 5], big));
    }
    CHECK(same_bits(v[at + 6], herd::detail::from_double<T>(static_cast<double>(p))));
  }
}

}  // namespace

HERD_MPI_TEST_CASE("reproducible sums: NaN, infinities and overflow as in a plain sum, NaNs all alike", 2) {
  special_values<float>();
  special_values<double>();
  special_values<herd::half>();
  special_values<herd::bfloat16>();
}

HERD_MPI_TEST_CASE("reproducible sums: ranks that differ about the mode get an error at creation", 2) {
  const std::string text = herd_test::error_of(
      [&] { herd::mpi_communicator c(MPI_COMM_WORLD, reproducible(herd::algorithm::automatic, 0, world_rank() == 0)); });
  INFO(text);
  CHECK(herd_test::has(text, "HERD_REPRODUCIBLE differs across ranks"));
}

HERD_MPI_TEST_CASE("reproducible sums: training gives the same weights whatever the algorithm and the fusion", 2) {
  const int p = world_size();
  herd::mpi_communicator ring(MPI_COMM_WORLD, reproducible(herd::algorithm::ring));
  const std::vector<float> reference = herd_test::train_tiny_mlp(ring, std::size_t{128} << 20);
  std::vector<herd::mpi_communicator> others;
  others.emplace_back(MPI_COMM_WORLD, reproducible(herd::algorithm::shared_memory));
  others.emplace_back(MPI_COMM_WORLD, reproducible());
  if (p % 2 == 0 && p >= 4) others.emplace_back(MPI_COMM_WORLD, reproducible(herd::algorithm::hierarchical, 2));
  for (herd::mpi_communicator& c : others) {
    for (std::size_t threshold : {std::size_t{128} << 20, std::size_t{4096}, std::size_t{0}}) {
      INFO("algorithm ", herd::name(c.options().allreduce_algorithm), " fusion threshold ", threshold);
      CHECK(differing(herd_test::train_tiny_mlp(c, threshold), reference) == 0);
    }
  }
}
