#pragma once
// Plain reference implementations and seeded test data for herd's collectives.

#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace herd_test {

// splitmix64: tiny, seedable and the same on every platform.
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
  int between(int lo, int hi) { return lo + static_cast<int>(below(static_cast<std::uint64_t>(hi - lo + 1))); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// How test values are drawn.
enum class values {
  exact,  // small integers (or powers of two for prod): every order of reduction gives the same bits
  rough,  // arbitrary floats: results compared with a rounding tolerance
};

// One random element of T as raw bytes appended to `out`.
template <class T> T draw(rng& g, values mode, herd::reduce_op op) {
  if constexpr (std::is_integral_v<T>) {
    if (op == herd::reduce_op::prod) return static_cast<T>(g.between(-3, 3));
    return static_cast<T>(g.next());  // any bits: integer arithmetic wraps identically in every order
  } else {
    if (op == herd::reduce_op::min || op == herd::reduce_op::max) {
      if (g.below(50) == 0) return T(std::numeric_limits<float>::quiet_NaN());
      return T(static_cast<float>((g.unit() - 0.5) * 1000));
    }
    if (mode == values::exact) {
      if (op == herd::reduce_op::prod) {
        static const float choices[] = {-2.0f, -1.0f, -0.5f, 0.5f, 1.0f, 2.0f};
        return T(choices[g.below(6)]);
      }
      return T(static_cast<float>(g.between(-8, 8)));
    }
    if (op == herd::reduce_op::prod) return T(static_cast<float>(0.75 + g.unit() * 0.5));
    return T(static_cast<float>((g.unit() - 0.5) * 10));
  }
}

template <class T> std::vector<T> draw_vector(rng& g, std::size_t n, values mode, herd::reduce_op op) {
  std::vector<T> v(n);
  for (auto& x : v) x = draw<T>(g, mode, op);
  return v;
}

// The reduction of inputs[0..p) elementwise, combined in rank order.
template <class T> std::vector<T> reference_reduce(const std::vector<std::vector<T>>& inputs, herd::reduce_op op) {
  std::vector<T> out = inputs.at(0);
  const auto p = static_cast<int>(inputs.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    T acc = inputs[0][i];
    for (int r = 1; r < p; ++r) {
      const T x = inputs[static_cast<std::size_t>(r)][i];
      switch (op) {
        case herd::reduce_op::sum: case herd::reduce_op::avg: acc = herd::combine<herd::reduce_op::sum>{}(acc, x); break;
        case herd::reduce_op::prod: acc = herd::combine<herd::reduce_op::prod>{}(acc, x); break;
        case herd::reduce_op::min: acc = herd::combine<herd::reduce_op::min>{}(acc, x); break;
        case herd::reduce_op::max: acc = herd::combine<herd::reduce_op::max>{}(acc, x); break;
        default:
          if constexpr (std::is_integral_v<T>) {
            if (op == herd::reduce_op::band) acc = herd::combine<herd::reduce_op::band>{}(acc, x);
            if (op == herd::reduce_op::bor) acc = herd::combine<herd::reduce_op::bor>{}(acc, x);
            if (op == herd::reduce_op::bxor) acc = herd::combine<herd::reduce_op::bxor>{}(acc, x);
          }
      }
    }
    out[i] = op == herd::reduce_op::avg ? herd::finalize_avg(acc, p) : acc;
  }
  return out;
}

template <class T> double as_double(T x) {
  if constexpr (std::is_integral_v<T>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));
}
template <> inline double as_double<double>(double x) { return x; }

template <class T> double epsilon_of() {
  if constexpr (std::is_same_v<T, herd::half>) return 0x1.0p-10;
  else if constexpr (std::is_same_v<T, herd::bfloat16>) return 0x1.0p-7;
  else if constexpr (std::is_same_v<T, float>) return 0x1.0p-23;
  else return 0x1.0p-52;
}

// Empty when `got` matches `want`; otherwise says where it does not. Exact mode asks for equal
// values (NaN matching NaN, -0 matching +0); rough mode allows the rounding of p combinations.
template <class T>
std::string compare(const std::vector<T>& got, const std::vector<T>& want, const std::vector<std::vector<T>>& inputs,
                    herd::reduce_op op, values mode) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  const double p = static_cast<double>(inputs.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = as_double(got[i]);
    const double w = as_double(want[i]);
    if (std::isnan(g) || std::isnan(w)) {
      if (std::isnan(g) != std::isnan(w)) return "element " + std::to_string(i) + ": NaN mismatch";
      continue;
    }
    double tolerance = 0;
    if (mode == values::rough && !std::is_integral_v<T>) {
      double scale = 0;
      for (const auto& in : inputs) scale += std::abs(as_double(in[i]));
      if (op == herd::reduce_op::prod) scale = std::abs(w);
      if (op == herd::reduce_op::avg) scale /= p;
      tolerance = 2 * (p + 1) * epsilon_of<T>() * scale;
    }
    if (!(std::abs(g - w) <= tolerance)) {
      return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w) +
             " (tolerance " + std::to_string(tolerance) + ")";
    }
  }
  return {};
}

inline bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

}  // namespace herd_test
