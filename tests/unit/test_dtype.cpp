// herd::dtype and herd::reduce_op: the enumerations, their dispatch, and the per-element semantics
// promised at the top of reduce_op.hpp (wrapping integers, NaN-propagating min/max, truncating
// integer avg, bitwise ops on integers).
#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

using herd::bfloat16;
using herd::dtype;
using herd::half;
using herd::reduce_op;

template <reduce_op Op, class T> T apply(T a, T b) { return herd::combine<Op>{}(a, b); }

// Values as long long so that doctest prints int8_t/uint8_t as numbers, not characters.
template <class T> long long as_ll(T x) { return static_cast<long long>(x); }

template <class T> T from_float(float f) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(f);
  else return static_cast<T>(f);
}

template <class T> double to_double(T x) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}

// Two's-complement wrap of a 64-bit result into T, computed independently of the header's
// compute_type (reduction mod 2^bits, then reinterpretation of the top bit as the sign).
template <class T> T wrap(std::uint64_t v) {
  constexpr int bits = 8 * static_cast<int>(sizeof(T));
  if constexpr (bits == 64) {
    return static_cast<T>(v);
  } else {
    const std::uint64_t modulus = std::uint64_t{1} << bits;
    const std::uint64_t low = v & (modulus - 1);
    if constexpr (std::is_signed_v<T>) {
      if (low >= modulus / 2) return static_cast<T>(static_cast<std::int64_t>(low) - static_cast<std::int64_t>(modulus));
    }
    return static_cast<T>(low);
  }
}

template <class T> std::uint64_t u64(T x) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(x)); }

constexpr dtype invalid_dtype = static_cast<dtype>(200);
constexpr reduce_op invalid_op = static_cast<reduce_op>(200);

}  // namespace

#define HERD_ALL_ELEMENT_TYPES half, bfloat16, float, double, std::int8_t, std::uint8_t, std::int32_t, std::int64_t
#define HERD_FLOAT_TYPES half, bfloat16, float, double
#define HERD_INTEGER_TYPES std::int8_t, std::uint8_t, std::int32_t, std::int64_t
#define HERD_SIGNED_INTEGER_TYPES std::int8_t, std::int32_t, std::int64_t

// ---------------------------------------------------------------------------------------------
// dtype

TEST_CASE("dtype: sizes, names and validity") {
  CHECK(herd::size_of(dtype::f16) == 2);
  CHECK(herd::size_of(dtype::bf16) == 2);
  CHECK(herd::size_of(dtype::f32) == 4);
  CHECK(herd::size_of(dtype::f64) == 8);
  CHECK(herd::size_of(dtype::i8) == 1);
  CHECK(herd::size_of(dtype::u8) == 1);
  CHECK(herd::size_of(dtype::i32) == 4);
  CHECK(herd::size_of(dtype::i64) == 8);

  CHECK(herd::name(dtype::f16) == "f16");
  CHECK(herd::name(dtype::bf16) == "bf16");
  CHECK(herd::name(dtype::f32) == "f32");
  CHECK(herd::name(dtype::f64) == "f64");
  CHECK(herd::name(dtype::i8) == "i8");
  CHECK(herd::name(dtype::u8) == "u8");
  CHECK(herd::name(dtype::i32) == "i32");
  CHECK(herd::name(dtype::i64) == "i64");

  std::size_t count = 0;
  for (const dtype t : herd::all_dtypes) {
    CAPTURE(herd::name(t));
    CHECK(herd::is_valid(t));
    CHECK(herd::is_floating_point(t) != herd::is_integral(t));
    ++count;
  }
  CHECK(count == 8);
  CHECK(herd::is_floating_point(dtype::f16));
  CHECK(herd::is_floating_point(dtype::bf16));
  CHECK(herd::is_integral(dtype::u8));
  CHECK(herd::is_integral(dtype::i64));

  // A corrupt value (read off the wire, say) is rejected, named as invalid, and has no size.
  CHECK_FALSE(herd::is_valid(invalid_dtype));
  CHECK_FALSE(herd::is_valid(static_cast<dtype>(8)));  // one past the last enumerator
  CHECK(herd::size_of(invalid_dtype) == 0);
  CHECK(herd::name(invalid_dtype) == "invalid dtype");
  CHECK_FALSE(herd::is_floating_point(invalid_dtype));
  CHECK_FALSE(herd::is_integral(invalid_dtype));

  static_assert(herd::size_of(dtype::bf16) == 2 && herd::name(dtype::i32) == "i32" && !herd::is_valid(invalid_dtype));
}

TEST_CASE_TEMPLATE("dtype: dtype_of_v, element_type_t and visit agree for each element type", T, HERD_ALL_ELEMENT_TYPES) {
  constexpr dtype t = herd::dtype_of_v<T>;
  static_assert(herd::element<T>);
  static_assert(herd::element<const T>);
  static_assert(herd::dtype_of_v<const T> == t);
  static_assert(std::is_same_v<herd::element_type_t<t>, T>);
  static_assert(herd::size_of(t) == sizeof(T));
  static_assert(herd::is_floating_point(t) == !std::is_integral_v<T>);
  static_assert(herd::visit(t, [](auto x) { return herd::dtype_of_v<decltype(x)>; }) == t);

  const dtype seen = herd::visit(t, [](auto x) {
    using U = decltype(x);
    CHECK(std::is_same_v<U, T>);
    CHECK(herd::size_of(herd::dtype_of_v<U>) == sizeof(U));
    return herd::dtype_of_v<U>;
  });
  CHECK(seen == t);
}

TEST_CASE("dtype: visit maps every dtype to the type of that dtype") {
  for (const dtype t : herd::all_dtypes) {
    CAPTURE(herd::name(t));
    CHECK(herd::visit(t, [](auto x) { return herd::dtype_of_v<decltype(x)>; }) == t);
    CHECK(herd::visit(t, [](auto x) { return sizeof(x); }) == herd::size_of(t));
  }
  static_assert(!herd::element<char>);  // distinct from int8_t's signed char
  static_assert(!herd::element<std::uint32_t>);
  static_assert(!herd::element<std::uint16_t>);
  static_assert(!herd::element<bool>);
  static_assert(!herd::element<long double>);
}

// ---------------------------------------------------------------------------------------------
// reduce_op

TEST_CASE("reduce_op: names, validity and supported dtypes") {
  CHECK(herd::name(reduce_op::sum) == "sum");
  CHECK(herd::name(reduce_op::avg) == "avg");
  CHECK(herd::name(reduce_op::min) == "min");
  CHECK(herd::name(reduce_op::max) == "max");
  CHECK(herd::name(reduce_op::prod) == "prod");
  CHECK(herd::name(reduce_op::band) == "band");
  CHECK(herd::name(reduce_op::bor) == "bor");
  CHECK(herd::name(reduce_op::bxor) == "bxor");
  std::size_t count = 0;
  for (const reduce_op op : herd::all_reduce_ops) {
    CHECK(herd::is_valid(op));
    ++count;
  }
  CHECK(count == 8);
  CHECK_FALSE(herd::is_valid(invalid_op));
  CHECK_FALSE(herd::is_valid(static_cast<reduce_op>(8)));
  CHECK(herd::name(invalid_op) == "invalid reduce_op");

  // Spelled out independently of is_bitwise/is_integral: bitwise ops need an integer dtype.
  for (const dtype t : herd::all_dtypes) {
    const bool integer = t == dtype::i8 || t == dtype::u8 || t == dtype::i32 || t == dtype::i64;
    for (const reduce_op op : herd::all_reduce_ops) {
      const bool bitwise = op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
      CAPTURE(herd::name(t));
      CAPTURE(herd::name(op));
      CHECK(herd::supports(t, op) == (integer || !bitwise));
    }
    CHECK_FALSE(herd::supports(t, invalid_op));
  }
  for (const reduce_op op : herd::all_reduce_ops) CHECK_FALSE(herd::supports(invalid_dtype, op));
  static_assert(!herd::supports(dtype::f32, reduce_op::bxor) && herd::supports(dtype::u8, reduce_op::band));
}

// ---------------------------------------------------------------------------------------------
// sum, avg, prod on integers: two's-complement wrap-around

TEST_CASE("combine<sum/prod>: the documented overflow cases wrap") {
  using i8 = std::int8_t;
  using u8 = std::uint8_t;
  using i32 = std::int32_t;
  using i64 = std::int64_t;
  constexpr i32 i32_max = std::numeric_limits<i32>::max(), i32_min = std::numeric_limits<i32>::min();
  constexpr i64 i64_max = std::numeric_limits<i64>::max(), i64_min = std::numeric_limits<i64>::min();

  CHECK(as_ll(apply<reduce_op::sum>(i8{127}, i8{1})) == -128);
  CHECK(as_ll(apply<reduce_op::sum>(i8{-128}, i8{-1})) == 127);
  CHECK(as_ll(apply<reduce_op::sum>(u8{255}, u8{1})) == 0);
  CHECK(as_ll(apply<reduce_op::sum>(u8{200}, u8{100})) == 44);
  CHECK(apply<reduce_op::sum>(i32_max, i32{1}) == i32_min);
  CHECK(apply<reduce_op::sum>(i32_min, i32{-1}) == i32_max);
  CHECK(apply<reduce_op::sum>(i64_max, i64{1}) == i64_min);
  CHECK(apply<reduce_op::sum>(i64_min, i64_min) == 0);
  // avg combines like sum; the division comes later.
  CHECK(as_ll(apply<reduce_op::avg>(i8{127}, i8{1})) == -128);
  CHECK(apply<reduce_op::avg>(i32_max, i32{1}) == i32_min);

  CHECK(as_ll(apply<reduce_op::prod>(i8{16}, i8{16})) == 0);
  CHECK(as_ll(apply<reduce_op::prod>(i8{64}, i8{2})) == -128);
  CHECK(as_ll(apply<reduce_op::prod>(i8{-128}, i8{-1})) == -128);
  CHECK(as_ll(apply<reduce_op::prod>(i8{-3}, i8{5})) == -15);
  CHECK(as_ll(apply<reduce_op::prod>(u8{16}, u8{16})) == 0);
  CHECK(as_ll(apply<reduce_op::prod>(u8{255}, u8{255})) == 1);
  CHECK(apply<reduce_op::prod>(i32{65536}, i32{65536}) == 0);
  CHECK(apply<reduce_op::prod>(i32_min, i32{-1}) == i32_min);
  CHECK(apply<reduce_op::prod>(i32{-7}, i32{6}) == -42);
  CHECK(apply<reduce_op::prod>(i64{1} << 32, i64{1} << 32) == 0);
  CHECK(apply<reduce_op::prod>(i64_min, i64{-1}) == i64_min);
  CHECK(apply<reduce_op::prod>(i64_max, i64_max) == 1);
}

TEST_CASE_TEMPLATE("combine<sum/prod> on 8-bit integers: every pair wraps like modular arithmetic", T, std::int8_t,
                   std::uint8_t) {
  int failures = 0;
  for (int x = std::numeric_limits<T>::min(); x <= std::numeric_limits<T>::max(); ++x) {
    for (int y = std::numeric_limits<T>::min(); y <= std::numeric_limits<T>::max(); ++y) {
      const auto a = static_cast<T>(x), b = static_cast<T>(y);
      const T sum = apply<reduce_op::sum>(a, b);
      const T prod = apply<reduce_op::prod>(a, b);
      const T want_sum = wrap<T>(static_cast<std::uint64_t>(static_cast<std::int64_t>(x + y)));
      const T want_prod = wrap<T>(static_cast<std::uint64_t>(static_cast<std::int64_t>(x * y)));
      if ((sum != want_sum || prod != want_prod) && ++failures <= 8) {
        CAPTURE(x);
        CAPTURE(y);
        CHECK(as_ll(sum) == as_ll(want_sum));
        CHECK(as_ll(prod) == as_ll(want_prod));
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE_TEMPLATE("combine<sum/prod> on wide integers: edge values wrap like modular arithmetic", T, std::int32_t,
                   std::int64_t) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  const T values[] = {lo, static_cast<T>(lo + 1), static_cast<T>(lo / 2), T{-65536}, T{-3}, T{-1}, T{0}, T{1},
                      T{2}, T{3}, T{65536}, static_cast<T>(hi / 2), static_cast<T>(hi / 2 + 1), static_cast<T>(hi - 1), hi};
  for (const T a : values) {
    for (const T b : values) {
      CAPTURE(a);
      CAPTURE(b);
      // u64 arithmetic wraps mod 2^64, and so mod 2^32 in its low half.
      CHECK(apply<reduce_op::sum>(a, b) == wrap<T>(u64(a) + u64(b)));
      CHECK(apply<reduce_op::avg>(a, b) == wrap<T>(u64(a) + u64(b)));
      CHECK(apply<reduce_op::prod>(a, b) == wrap<T>(u64(a) * u64(b)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// min, max

TEST_CASE_TEMPLATE("combine<min/max> on floats: ordinary values, infinities, and NaN from either side", T,
                   HERD_FLOAT_TYPES) {
  const T one = from_float<T>(1.0f), two = from_float<T>(2.0f), neg = from_float<T>(-3.5f);
  const T inf = from_float<T>(std::numeric_limits<float>::infinity());
  const T nan = from_float<T>(std::numeric_limits<float>::quiet_NaN());
  REQUIRE(std::isnan(to_double(nan)));

  CHECK(to_double(apply<reduce_op::min>(one, two)) == 1.0);
  CHECK(to_double(apply<reduce_op::min>(two, one)) == 1.0);
  CHECK(to_double(apply<reduce_op::max>(one, two)) == 2.0);
  CHECK(to_double(apply<reduce_op::max>(two, one)) == 2.0);
  CHECK(to_double(apply<reduce_op::min>(neg, one)) == -3.5);
  CHECK(to_double(apply<reduce_op::max>(neg, one)) == 1.0);
  CHECK(to_double(apply<reduce_op::max>(inf, two)) == std::numeric_limits<double>::infinity());
  CHECK(to_double(apply<reduce_op::min>(inf, two)) == 2.0);

  for (const T other : {one, neg, inf, nan}) {
    CAPTURE(to_double(other));
    CHECK(std::isnan(to_double(apply<reduce_op::min>(nan, other))));
    CHECK(std::isnan(to_double(apply<reduce_op::min>(other, nan))));
    CHECK(std::isnan(to_double(apply<reduce_op::max>(nan, other))));
    CHECK(std::isnan(to_double(apply<reduce_op::max>(other, nan))));
  }
  // Folding over several ranks: one NaN anywhere poisons the result.
  const T ranks[] = {one, two, nan, neg};
  T lowest = ranks[0], highest = ranks[0];
  for (const T x : ranks) {
    lowest = apply<reduce_op::min>(lowest, x);
    highest = apply<reduce_op::max>(highest, x);
  }
  CHECK(std::isnan(to_double(lowest)));
  CHECK(std::isnan(to_double(highest)));
}

TEST_CASE_TEMPLATE("combine<min/max> on signed integers compares as signed", T, HERD_SIGNED_INTEGER_TYPES) {
  constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
  CHECK(as_ll(apply<reduce_op::min>(T{-1}, T{1})) == -1);
  CHECK(as_ll(apply<reduce_op::min>(T{1}, T{-1})) == -1);
  CHECK(as_ll(apply<reduce_op::max>(T{-1}, T{1})) == 1);
  CHECK(as_ll(apply<reduce_op::max>(T{1}, T{-1})) == 1);
  CHECK(apply<reduce_op::min>(lo, hi) == lo);
  CHECK(apply<reduce_op::max>(lo, hi) == hi);
  CHECK(apply<reduce_op::min>(hi, lo) == lo);
  CHECK(apply<reduce_op::max>(hi, lo) == hi);
  CHECK(as_ll(apply<reduce_op::min>(T{-5}, T{-7})) == -7);
  CHECK(as_ll(apply<reduce_op::max>(T{-5}, T{-7})) == -5);
}

TEST_CASE("combine<min/max> on u8 compares as unsigned") {
  CHECK(as_ll(apply<reduce_op::min>(std::uint8_t{0}, std::uint8_t{255})) == 0);
  CHECK(as_ll(apply<reduce_op::max>(std::uint8_t{0}, std::uint8_t{255})) == 255);
  CHECK(as_ll(apply<reduce_op::min>(std::uint8_t{200}, std::uint8_t{100})) == 100);
  CHECK(as_ll(apply<reduce_op::max>(std::uint8_t{100}, std::uint8_t{200})) == 200);
}

TEST_CASE_TEMPLATE("combine<min/max> on 8-bit integers: every pair", T, std::int8_t, std::uint8_t) {
  int failures = 0;
  for (int x = std::numeric_limits<T>::min(); x <= std::numeric_limits<T>::max(); ++x) {
    for (int y = std::numeric_limits<T>::min(); y <= std::numeric_limits<T>::max(); ++y) {
      const T lowest = apply<reduce_op::min>(static_cast<T>(x), static_cast<T>(y));
      const T highest = apply<reduce_op::max>(static_cast<T>(x), static_cast<T>(y));
      if ((lowest != (x < y ? x : y) || highest != (x < y ? y : x)) && ++failures <= 8) {
        CAPTURE(x);
        CAPTURE(y);
        CHECK(as_ll(lowest) == (x < y ? x : y));
        CHECK(as_ll(highest) == (x < y ? y : x));
      }
    }
  }
  CHECK(failures == 0);
}

// ---------------------------------------------------------------------------------------------
// avg

TEST_CASE("finalize_avg on integers truncates toward zero") {
  using i32 = std::int32_t;
  const auto avg_i32 = [](i32 a, i32 b) { return herd::finalize_avg(apply<reduce_op::avg>(a, b), 2); };
  CHECK(avg_i32(1, 2) == 1);
  CHECK(avg_i32(-1, -2) == -1);  // -1.5 -> -1, not floor's -2
  CHECK(avg_i32(-1, 2) == 0);
  CHECK(avg_i32(4, 6) == 5);
  CHECK(herd::finalize_avg(i32{-7}, 3) == -2);
  CHECK(herd::finalize_avg(i32{7}, 3) == 2);
  CHECK(herd::finalize_avg(i32{7}, 1) == 7);
  // The division applies to the wrapped sum.
  CHECK(avg_i32(std::numeric_limits<i32>::max(), 1) == std::numeric_limits<i32>::min() / 2);

  CHECK(as_ll(herd::finalize_avg(std::int8_t{-3}, 2)) == -1);
  CHECK(as_ll(herd::finalize_avg(std::int8_t{-128}, 3)) == -42);
  CHECK(as_ll(herd::finalize_avg(std::int8_t{127}, 4)) == 31);
  CHECK(as_ll(herd::finalize_avg(std::uint8_t{255}, 2)) == 127);
  CHECK(as_ll(herd::finalize_avg(apply<reduce_op::avg>(std::uint8_t{255}, std::uint8_t{1}), 2)) == 0);
  CHECK(herd::finalize_avg(std::int64_t{-9}, 4) == -2);
  CHECK(herd::finalize_avg(std::int64_t{9}, 4) == 2);
  CHECK(herd::finalize_avg(std::numeric_limits<std::int64_t>::min(), 2) == std::numeric_limits<std::int64_t>::min() / 2);
  CHECK(herd::finalize_avg(std::numeric_limits<std::int64_t>::max(), 3) == std::numeric_limits<std::int64_t>::max() / 3);
}

TEST_CASE_TEMPLATE("finalize_avg on integers: sum over ranks, then C++ division", T, HERD_INTEGER_TYPES) {
  // Sums over 1..8 ranks of small mixed-sign values, compared with plain int arithmetic.
  const int values[] = {5, -3, 7, 1, -8, 2, 2, -1};
  const bool is_unsigned = std::is_unsigned_v<T>;
  for (int n = 1; n <= 8; ++n) {
    T sum = T{0};
    int plain = 0;
    for (int r = 0; r < n; ++r) {
      const int v = is_unsigned ? (values[r] < 0 ? -values[r] : values[r]) : values[r];
      sum = apply<reduce_op::avg>(sum, static_cast<T>(v));
      plain += v;
    }
    CAPTURE(n);
    CHECK(as_ll(herd::finalize_avg(sum, n)) == plain / n);
  }
}

TEST_CASE_TEMPLATE("finalize_avg on floats divides exactly (one correctly rounded division)", T, HERD_FLOAT_TYPES) {
  CHECK(to_double(herd::finalize_avg(from_float<T>(3.0f), 2)) == 1.5);
  CHECK(to_double(herd::finalize_avg(from_float<T>(-3.0f), 2)) == -1.5);
  CHECK(to_double(herd::finalize_avg(from_float<T>(-1.0f), 4)) == -0.25);
  CHECK(to_double(herd::finalize_avg(from_float<T>(7.0f), 1)) == 7.0);
  const T sum = apply<reduce_op::avg>(from_float<T>(1.0f), from_float<T>(2.0f));
  CHECK(to_double(herd::finalize_avg(sum, 2)) == 1.5);
  // 1/3: for the 16-bit types, the float quotient rounded once more to the storage type.
  if constexpr (std::is_same_v<T, double>) {
    CHECK(herd::finalize_avg(1.0, 3) == 1.0 / 3.0);
  } else {
    CHECK(to_double(herd::finalize_avg(from_float<T>(1.0f), 3)) == to_double(from_float<T>(1.0f / 3.0f)));
  }
  CHECK(std::isnan(to_double(herd::finalize_avg(from_float<T>(std::numeric_limits<float>::quiet_NaN()), 2))));
}

// ---------------------------------------------------------------------------------------------
// sum on floats

TEST_CASE_TEMPLATE("combine<sum/prod> on 16-bit floats: combined in float, rounded back once", T, half, bfloat16) {
  // a + b with both exact: the float sum is exact too, so the only rounding is back to T.
  const float step = std::is_same_v<T, half> ? std::ldexp(1.0f, -11) : std::ldexp(1.0f, -8);  // half an ulp at 1
  const T one = from_float<T>(1.0f);
  CHECK(to_double(apply<reduce_op::sum>(one, from_float<T>(step))) == 1.0);  // tie, to even
  CHECK(to_double(apply<reduce_op::sum>(one, from_float<T>(3 * step))) == 1.0 + 4 * static_cast<double>(step));
  CHECK(to_double(apply<reduce_op::sum>(one, from_float<T>(-1.0f))) == 0.0);
  CHECK(to_double(apply<reduce_op::prod>(from_float<T>(-1.5f), from_float<T>(2.0f))) == -3.0);
  if constexpr (std::is_same_v<T, half>) {
    const T big = from_float<T>(65504.0f);
    CHECK(std::isinf(to_double(apply<reduce_op::sum>(big, big))));
  }
}

TEST_CASE_TEMPLATE("combine<sum/prod> on float and double: plain IEEE arithmetic", T, float, double) {
  CHECK(apply<reduce_op::sum>(T{0.5}, T{0.25}) == T{0.75});
  const T tenth = static_cast<T>(0.1), fifth = static_cast<T>(0.2);
  CHECK(apply<reduce_op::sum>(tenth, fifth) == tenth + fifth);
  CHECK(apply<reduce_op::prod>(T{-1.5}, T{4}) == T{-6});
  const T big = std::numeric_limits<T>::max();
  CHECK(std::isinf(apply<reduce_op::sum>(big, big)));
  CHECK(std::isnan(apply<reduce_op::sum>(std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity())));
}

// ---------------------------------------------------------------------------------------------
// band, bor, bxor

TEST_CASE_TEMPLATE("combine<band/bor/bxor> on integers", T, HERD_INTEGER_TYPES) {
  const T a = static_cast<T>(0x5c), b = static_cast<T>(0x36);
  CHECK(as_ll(apply<reduce_op::band>(a, b)) == 0x14);
  CHECK(as_ll(apply<reduce_op::bor>(a, b)) == 0x7e);
  CHECK(as_ll(apply<reduce_op::bxor>(a, b)) == 0x6a);
  const T ones = static_cast<T>(~T{0});  // every bit set: -1, or the maximum for u8
  CHECK(apply<reduce_op::band>(ones, a) == a);
  CHECK(apply<reduce_op::bor>(ones, a) == ones);
  CHECK(apply<reduce_op::bxor>(ones, a) == static_cast<T>(~a));
  CHECK(apply<reduce_op::bxor>(a, a) == T{0});
  // The sign bit takes part like any other.
  const T top = std::is_signed_v<T> ? std::numeric_limits<T>::min() : static_cast<T>(T{1} << (8 * sizeof(T) - 1));
  CHECK(apply<reduce_op::bor>(top, T{1}) == static_cast<T>(top | T{1}));
  CHECK(apply<reduce_op::band>(top, ones) == top);
  CHECK(apply<reduce_op::bxor>(top, top) == T{0});
}

TEST_CASE_TEMPLATE("combine<band/bor/bxor> on 8-bit integers: every pair", T, std::int8_t, std::uint8_t) {
  int failures = 0;
  for (unsigned x = 0; x < 256; ++x) {
    for (unsigned y = 0; y < 256; ++y) {
      const auto a = static_cast<T>(x), b = static_cast<T>(y);
      const bool ok = static_cast<unsigned>(static_cast<std::uint8_t>(apply<reduce_op::band>(a, b))) == (x & y) &&
                      static_cast<unsigned>(static_cast<std::uint8_t>(apply<reduce_op::bor>(a, b))) == (x | y) &&
                      static_cast<unsigned>(static_cast<std::uint8_t>(apply<reduce_op::bxor>(a, b))) == (x ^ y);
      if (!ok && ++failures <= 8) {
        CAPTURE(x);
        CAPTURE(y);
        CHECK(ok);
      }
    }
  }
  CHECK(failures == 0);
}

// The host loops run in vector blocks with a scalar remainder, and pick a path by how dst aliases
// a and b: every path and every remainder must give combine's bits, element by element.
TEST_CASE_TEMPLATE("host_reduce: every length, in place or not, gives combine's bits element by element", T,
                   HERD_ALL_ELEMENT_TYPES) {
  constexpr dtype type = herd::dtype_of_v<T>;
  for (reduce_op op : herd::all_reduce_ops) {
    if (!herd::supports(type, op)) continue;
    for (int avg : {0, 3}) {
      if (avg != 0 && op != reduce_op::avg) continue;
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{63}, std::size_t{64},
                            std::size_t{65}, std::size_t{200}}) {
        std::vector<T> a(n), b(n);
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = from_float<T>(static_cast<float>((static_cast<int>(i) * 7) % 23) - 11.0f);
          b[i] = from_float<T>(static_cast<float>((static_cast<int>(i) * 5) % 19) - 6.0f);
        }
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          T x{};
          switch (op) {
            case reduce_op::sum: x = apply<reduce_op::sum>(a[i], b[i]); break;
            case reduce_op::avg: x = apply<reduce_op::avg>(a[i], b[i]); break;
            case reduce_op::prod: x = apply<reduce_op::prod>(a[i], b[i]); break;
            case reduce_op::min: x = apply<reduce_op::min>(a[i], b[i]); break;
            case reduce_op::max: x = apply<reduce_op::max>(a[i], b[i]); break;
            default:
              if constexpr (std::is_integral_v<T>) {
                if (op == reduce_op::band) x = apply<reduce_op::band>(a[i], b[i]);
                if (op == reduce_op::bor) x = apply<reduce_op::bor>(a[i], b[i]);
                if (op == reduce_op::bxor) x = apply<reduce_op::bxor>(a[i], b[i]);
              }
          }
          want[i] = avg != 0 ? herd::finalize_avg(x, avg) : x;
        }
        auto same = [&](const std::vector<T>& got) {
          return n == 0 || std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0;
        };
        INFO("op ", herd::name(op), ", n ", n, ", avg ", avg);
        std::vector<T> out(n);
        herd::detail::host_reduce(type, op, out.data(), a.data(), b.data(), n, avg);
        CHECK(same(out));  // three separate buffers
        std::vector<T> into_a = a;
        herd::detail::host_reduce(type, op, into_a.data(), into_a.data(), b.data(), n, avg);
        CHECK(same(into_a));  // dst == a
        std::vector<T> into_b = b;
        herd::detail::host_reduce(type, op, into_b.data(), a.data(), into_b.data(), n, avg);
        CHECK(same(into_b));  // dst == b: the element-by-element path
      }
    }
  }
}

// f16 sums, averages and products on x86-64 CPUs with F16C take core/detail/f16c.hpp,
// 8 elements at a time: every f16 bit pattern against 24 others (zeros, subnormals, the largest
// finite, infinities, NaNs, values whose sums tie or overflow) must give combine's bits, in place
// or not. Where both operands are NaN, which NaN comes out is the compiler's choice in the
// portable loop too, so there only NaN-ness is compared.
TEST_CASE("host_reduce on f16: every bit pattern against special partners gives combine's bits") {
  const std::uint16_t partners[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00,
                                    0x3c01, 0x4000, 0x1400, 0x7bff, 0xfbff, 0x7bfe, 0x7c00, 0xfc00,
                                    0x7e00, 0x7c01, 0xfe01, 0x5640, 0x0200, 0x3555, 0xc3ff, 0x2e66};
  const std::size_t n = 0x10000 + 5;  // every pattern, then a remainder past the blocks of 8
  std::vector<half> a(n), b(n);
  const auto is_nan = [](half h) { return (h.bits & 0x7fffu) > 0x7c00u; };
#if defined(HERD_F16C)
  MESSAGE("F16C ", herd::detail::cpu_has_f16c() ? "present: this test checks its path" : "absent: the portable loop");
#endif
  for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::prod}) {
    for (int avg : {0, 3}) {
      if (avg != 0 && op != reduce_op::avg) continue;
      for (std::uint16_t partner : partners) {
        for (std::size_t i = 0; i < n; ++i) {
          a[i] = half::from_bits(static_cast<std::uint16_t>(i));
          b[i] = half::from_bits(partner);
        }
        std::vector<half> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          half x = op == reduce_op::prod ? apply<reduce_op::prod>(a[i], b[i]) : apply<reduce_op::sum>(a[i], b[i]);
          want[i] = avg != 0 ? herd::finalize_avg(x, avg) : x;
        }
        std::vector<half> out(n), into_a = a, into_b = b;
        herd::detail::host_reduce(dtype::f16, op, out.data(), a.data(), b.data(), n, avg);
        herd::detail::host_reduce(dtype::f16, op, into_a.data(), into_a.data(), b.data(), n, avg);
        herd::detail::host_reduce(dtype::f16, op, into_b.data(), a.data(), into_b.data(), n, avg);
        std::size_t wrong = 0, first = n;
        for (std::size_t i = 0; i < n; ++i) {
          const bool both_nan = is_nan(a[i]) && is_nan(b[i]);
          for (const half got : {out[i], into_a[i], into_b[i]}) {
            const bool same = both_nan ? is_nan(got) && is_nan(want[i]) : got.bits == want[i].bits;
            if (!same && wrong++ == 0) first = i;
          }
        }
        char where[64];
        std::snprintf(where, sizeof where, "partner 0x%04x, first wrong a 0x%04zx", static_cast<unsigned>(partner), first);
        INFO("op ", herd::name(op), ", avg ", avg, ", ", where);
        CHECK(wrong == 0);
      }
    }
  }
}
