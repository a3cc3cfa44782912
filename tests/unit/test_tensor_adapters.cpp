// herd::tensor_traits adapters: the std containers, buffer views, view_of / const_view_of, and a
// user-defined tensor type adapted from outside herd.

#include <herd/herd.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

struct Unadapted {
  float values[4];
};

// A tensor type herd knows nothing about, adapted the way the README tells users to.
class Grid {
 public:
  Grid(std::size_t rows, std::size_t cols) : rows_(rows), cols_(cols), cells_(new double[rows * cols]()) {}
  double& at(std::size_t r, std::size_t c) { return cells_[r * cols_ + c]; }
  double* raw() noexcept { return cells_.get(); }
  std::size_t numel() const noexcept { return rows_ * cols_; }

 private:
  std::size_t rows_;
  std::size_t cols_;
  std::unique_ptr<double[]> cells_;
};

// A read-only user type: its data() hands out a const pointer.
struct Frozen {
  const std::int32_t* values;
  std::size_t count;
};

// Only device() differs from a CPU tensor: checks that view_of carries the adapter's device through.
struct OnGpu {
  float* p;
  std::size_t n;
  int ordinal;
};

}  // namespace

template <> struct herd::tensor_traits<Grid> {
  static void* data(Grid& g) noexcept { return g.raw(); }
  static std::size_t size(const Grid& g) noexcept { return g.numel(); }
  static herd::dtype dtype(const Grid&) noexcept { return herd::dtype::f64; }
  static herd::device device(const Grid&) noexcept { return herd::device::cpu(); }
};

template <> struct herd::tensor_traits<Frozen> {
  static const void* data(const Frozen& f) noexcept { return f.values; }
  static std::size_t size(const Frozen& f) noexcept { return f.count; }
  static herd::dtype dtype(const Frozen&) noexcept { return herd::dtype::i32; }
  static herd::device device(const Frozen&) noexcept { return herd::device::cpu(); }
};

template <> struct herd::tensor_traits<OnGpu> {
  static void* data(OnGpu& t) noexcept { return t.p; }
  static std::size_t size(const OnGpu& t) noexcept { return t.n; }
  static herd::dtype dtype(const OnGpu&) noexcept { return herd::dtype::f32; }
  static herd::device device(const OnGpu& t) noexcept { return herd::device::cuda(t.ordinal); }
};

// Concepts: what is a tensor, and what herd may write into.
static_assert(herd::tensor<std::vector<float>>);
static_assert(herd::writable_tensor<std::vector<float>>);
static_assert(herd::tensor<const std::vector<float>&>);
static_assert(herd::writable_tensor<std::array<herd::half, 3>>);
static_assert(herd::writable_tensor<std::span<std::int64_t>>);
static_assert(herd::writable_tensor<std::span<double, 5>>);
static_assert(herd::tensor<std::span<const float>>);
static_assert(!herd::writable_tensor<std::span<const float>>);
static_assert(herd::tensor<std::span<const herd::bfloat16, 2>>);
static_assert(!herd::writable_tensor<std::span<const herd::bfloat16, 2>>);
static_assert(herd::tensor<std::array<const float, 3>>);
static_assert(!herd::writable_tensor<std::array<const float, 3>>);
static_assert(herd::writable_tensor<herd::buffer_view>);
static_assert(herd::tensor<herd::const_buffer_view>);
static_assert(!herd::writable_tensor<herd::const_buffer_view>);
static_assert(herd::writable_tensor<DLTensor>);
static_assert(herd::writable_tensor<Grid>);
static_assert(herd::tensor<Frozen>);
static_assert(!herd::writable_tensor<Frozen>);
static_assert(!herd::tensor<Unadapted>);
static_assert(!herd::writable_tensor<Unadapted>);
static_assert(herd::detail::not_adapted<Unadapted>);
static_assert(!herd::detail::not_adapted<Grid>);
// Element types herd has no dtype for are not adapted either.
static_assert(!herd::tensor<std::vector<std::int16_t>>);
static_assert(!herd::tensor<std::vector<bool>>);
static_assert(!herd::tensor<std::array<long double, 2>>);
static_assert(!herd::tensor<std::span<char16_t>>);
static_assert(!herd::tensor<int>);

namespace {

template <class T> T make(int v) {
  if constexpr (std::is_same_v<T, herd::half> || std::is_same_v<T, herd::bfloat16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class T> double as_double(T v) {
  if constexpr (std::is_same_v<T, herd::half> || std::is_same_v<T, herd::bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

}  // namespace

#define HERD_ELEMENT_TYPES \
  float, double, herd::half, herd::bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::int64_t

TEST_CASE_TEMPLATE("std containers of every element type report pointer, count, dtype and cpu", T,
                   HERD_ELEMENT_TYPES) {
  const herd::dtype expected = herd::dtype_of_v<T>;

  std::vector<T> v(7);
  const herd::buffer_view vv = herd::view_of(v);
  CHECK(vv.data == static_cast<void*>(v.data()));
  CHECK(vv.count == 7);
  CHECK(vv.type == expected);
  CHECK(vv.device == herd::device::cpu());
  CHECK(vv.bytes() == 7 * sizeof(T));

  const std::vector<T>& cv = v;
  const herd::const_buffer_view cvv = herd::const_view_of(cv);
  CHECK(cvv.data == static_cast<const void*>(v.data()));
  CHECK(cvv.count == 7);
  CHECK(cvv.type == expected);

  std::array<T, 5> a{};
  const herd::buffer_view av = herd::view_of(a);
  CHECK(av.data == static_cast<void*>(a.data()));
  CHECK(av.count == 5);
  CHECK(av.type == expected);
  CHECK(av.device == herd::device::cpu());
  CHECK(herd::const_view_of(a).data == static_cast<const void*>(a.data()));

  // A span of part of the vector: the view starts where the span does.
  std::span<T> s(v.data() + 2, 3);
  const herd::buffer_view sv = herd::view_of(s);
  CHECK(sv.data == static_cast<void*>(v.data() + 2));
  CHECK(sv.count == 3);
  CHECK(sv.type == expected);

  std::span<T, 4> fixed(v.data() + 1, 4);
  CHECK(herd::view_of(fixed).count == 4);
  CHECK(herd::view_of(fixed).data == static_cast<void*>(v.data() + 1));

  std::span<const T> ro(v.data() + 4, 2);
  const herd::const_buffer_view rov = herd::const_view_of(ro);
  CHECK(rov.data == static_cast<const void*>(v.data() + 4));
  CHECK(rov.count == 2);
  CHECK(rov.type == expected);
  CHECK(rov.device == herd::device::cpu());

  CHECK(herd::tensor_traits<std::vector<T>>::dtype(v) == expected);
  CHECK(herd::tensor_traits<std::array<T, 5>>::size(a) == 5);
  CHECK(herd::size_of(expected) == sizeof(T));
}

TEST_CASE("empty containers give views of 0 elements") {
  std::vector<float> v;
  CHECK(herd::view_of(v).count == 0);
  CHECK(herd::view_of(v).bytes() == 0);
  std::array<std::int32_t, 0> a{};
  CHECK(herd::view_of(a).count == 0);
  CHECK(herd::view_of(a).type == herd::dtype::i32);
  std::span<const double> s;
  CHECK(herd::const_view_of(s).count == 0);
  CHECK(herd::const_view_of(s).data == nullptr);
}

namespace {

// A minimal allocator of its own: the adapter must take any Allocator, not only std::allocator.
template <class T> struct plain_allocator {
  using value_type = T;
  plain_allocator() = default;
  template <class U> plain_allocator(const plain_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return std::allocator<T>{}.allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>{}.deallocate(p, n); }
  friend bool operator==(const plain_allocator&, const plain_allocator&) = default;
};

}  // namespace

TEST_CASE("a vector with its own allocator is adapted") {
  std::vector<std::int64_t, plain_allocator<std::int64_t>> v(3);
  static_assert(herd::writable_tensor<decltype(v)>);
  CHECK(herd::view_of(v).data == static_cast<void*>(v.data()));
  CHECK(herd::view_of(v).count == 3);
  CHECK(herd::view_of(v).type == herd::dtype::i64);
}

TEST_CASE("buffer_view and const_buffer_view adapt themselves") {
  float storage[6] = {};
  herd::buffer_view b{storage, 6, herd::dtype::f32, herd::device::cuda(2)};
  CHECK(b.bytes() == 24);

  const herd::buffer_view again = herd::view_of(b);
  CHECK(again.data == static_cast<void*>(storage));
  CHECK(again.count == 6);
  CHECK(again.type == herd::dtype::f32);
  CHECK(again.device == herd::device::cuda(2));

  // The dtype is the view's own: the same bytes read as 12 halves.
  herd::buffer_view halves{storage, 12, herd::dtype::f16};
  CHECK(herd::view_of(halves).type == herd::dtype::f16);
  CHECK(herd::view_of(halves).bytes() == 24);
  CHECK(herd::view_of(halves).device == herd::device::cpu());

  const herd::const_buffer_view c(storage, 3, herd::dtype::i64, herd::device::cuda(1));
  CHECK(c.bytes() == 24);
  const herd::const_buffer_view cc = herd::const_view_of(c);
  CHECK(cc.data == static_cast<const void*>(storage));
  CHECK(cc.count == 3);
  CHECK(cc.type == herd::dtype::i64);
  CHECK(cc.device == herd::device::cuda(1));

  const herd::const_buffer_view from_mutable = b;
  CHECK(from_mutable.data == static_cast<const void*>(storage));
  CHECK(from_mutable.count == 6);
  CHECK(from_mutable.type == herd::dtype::f32);
  CHECK(from_mutable.device == herd::device::cuda(2));

  const herd::const_buffer_view defaulted;
  CHECK(defaulted.data == nullptr);
  CHECK(defaulted.count == 0);
  CHECK(defaulted.device == herd::device::cpu());
}

TEST_CASE("view_of carries a user adapter's values through") {
  Grid g(2, 3);
  const herd::buffer_view gv = herd::view_of(g);
  CHECK(gv.data == static_cast<void*>(g.raw()));
  CHECK(gv.count == 6);
  CHECK(gv.type == herd::dtype::f64);
  CHECK(gv.device == herd::device::cpu());

  const std::int32_t values[] = {4, 5};
  const Frozen f{values, 2};
  const herd::const_buffer_view fv = herd::const_view_of(f);
  CHECK(fv.data == static_cast<const void*>(values));
  CHECK(fv.count == 2);
  CHECK(fv.type == herd::dtype::i32);

  float x[3] = {};
  OnGpu t{x, 3, 5};
  CHECK(herd::view_of(t).device == herd::device::cuda(5));
  CHECK(herd::const_view_of(t).device == herd::device::cuda(5));
  CHECK(herd::const_view_of(t).data == static_cast<const void*>(x));
}

TEST_CASE("a user-adapted tensor type goes through allreduce") {
  std::array<bool, 3> in_place_ok{};
  std::array<bool, 3> out_of_place_ok{};
  herd::local::run(3, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Grid g(4, 5);
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 5; ++j) g.at(i, j) = static_cast<double>((r + 1) * (10 * i + j));
    herd::allreduce(g, comm);
    bool ok = true;
    // (1 + 2 + 3) times each rank-1 value.
    for (std::size_t i = 0; i < 4; ++i)
      for (std::size_t j = 0; j < 5; ++j) ok = ok && g.at(i, j) == static_cast<double>(6 * (10 * i + j));
    in_place_ok[r] = ok;

    // Out of place, from a read-only user type into a writable one.
    std::vector<std::int32_t> source(7);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::int32_t>(r * 100 + i);
    const Frozen input{source.data(), source.size()};
    std::vector<std::int32_t> output(7, -1);
    herd::allreduce(input, output, comm, herd::reduce_op::max);
    bool ok2 = true;
    for (std::size_t i = 0; i < output.size(); ++i) ok2 = ok2 && output[i] == static_cast<std::int32_t>(200 + i);
    for (std::size_t i = 0; i < source.size(); ++i) ok2 = ok2 && source[i] == static_cast<std::int32_t>(r * 100 + i);
    out_of_place_ok[r] = ok2;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(in_place_ok[r]);
    CHECK(out_of_place_ok[r]);
  }
}

TEST_CASE_TEMPLATE("allreduce sums std containers of every element type", T, HERD_ELEMENT_TYPES) {
  constexpr std::size_t n = 9;
  std::array<std::vector<double>, 3> got_vector;
  std::array<std::vector<double>, 3> got_array;
  std::array<std::vector<double>, 3> got_span;
  herd::local::run(3, [&](herd::local_communicator& comm) {
    const int r = comm.rank();
    const auto slot = static_cast<std::size_t>(r);
    std::vector<T> v(n);
    std::array<T, n> a{};
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = make<T>(r + static_cast<int>(i));
      a[i] = make<T>(2 * r);
    }
    herd::allreduce(v, comm);
    herd::allreduce(a, comm);

    // A read-only span in, a writable span over part of a buffer out.
    const std::vector<T> source(n, make<T>(r + 1));
    std::vector<T> target(n + 2, make<T>(0));
    const std::span<const T> in(source);
    std::span<T> out = std::span<T>(target).subspan(1, n);
    herd::allreduce(in, out, comm);

    for (std::size_t i = 0; i < n; ++i) {
      got_vector[slot].push_back(as_double(v[i]));
      got_array[slot].push_back(as_double(a[i]));
    }
    for (const T& x : target) got_span[slot].push_back(as_double(x));
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(got_vector[r].size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(got_vector[r][i] == static_cast<double>(3 + 3 * i));  // (0+i) + (1+i) + (2+i)
      CHECK(got_array[r][i] == 6.0);                              // 0 + 2 + 4
    }
    REQUIRE(got_span[r].size() == n + 2);
    CHECK(got_span[r].front() == 0.0);
    CHECK(got_span[r].back() == 0.0);
    for (std::size_t i = 1; i <= n; ++i) CHECK(got_span[r][i] == 6.0);  // 1 + 2 + 3
  }
}
