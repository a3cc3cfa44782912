#ifndef HERD_TENSOR_XTENSOR_HPP
#define HERD_TENSOR_XTENSOR_HPP
// tensor_traits for xtensor: xt::xarray, xt::xtensor<T, N>, xt::xtensor_fixed, the adaptors
// xt::adapt makes over a pointer or a std::vector, and views of them (xt::view, xt::strided_view,
// xt::transpose) whose elements fill one block of memory; of herd's element types (float,
// double, int8_t, uint8_t, int32_t, int64_t). Opt-in: include it beside your xtensor headers.
//
//   xt::xtensor<float, 2> grad({256, 784});
//   herd::allreduce(grad, comm, herd::reduce_op::avg);
//   herd::distributed_optimizer opt(sgd, herd::views(grad_w, grad_b), comm);
//
// herd reduces a tensor's elements in memory order, which is the same on every rank as long as
// every rank passes the same layout; row-major and column-major storage are both one block of
// memory, so both are taken (a checkpoint writes a column-major one in row-major order, as
// PyTorch reads it). A view whose elements leave gaps (a column of a row-major array, a
// range with a step) is refused at run time with herd::error, on every rank of the collective;
// an expression with no storage of its own (a + b, xt::arange(n), a view of an expression) and a
// complex value type are refused at compile time.

#include <herd/core/error.hpp>
#include <herd/tensor/traits.hpp>

#include <xtensor/xexpression.hpp>
#include <xtensor/xutils.hpp>
#include <xtl/xcomplex.hpp>

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {
namespace detail {

// A container, an adaptor or a view of one: its elements sit in memory from data() +
// data_offset(), strides() apart. Lazy expressions have no data() at all.
template <class E>
concept xtensor_strided = xt::has_data_interface<E>::value && xt::has_strides<E>::value &&
                          requires(const E& e) { e.data_offset(); e.shape(); };

// Whether the elements lie back to back in row-major (or column-major) order. Axes of extent 1
// are skipped: xtensor gives them stride 0.
template <class E> bool xtensor_compact(const E& e, bool row_major) {
  const auto& shape = e.shape();
  const auto& strides = e.strides();
  const std::size_t rank = shape.size();
  std::ptrdiff_t expected = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    const std::size_t axis = row_major ? rank - 1 - k : k;
    if (shape[axis] == 1) continue;
    if (static_cast<std::ptrdiff_t>(strides[axis]) != expected) return false;
    expected *= static_cast<std::ptrdiff_t>(shape[axis]);
  }
  return true;
}

template <class E> bool xtensor_contiguous(const E& e) {
  return e.size() == 0 || xtensor_compact(e, true) || xtensor_compact(e, false);
}

template <class Sequence> std::string xtensor_text(const Sequence& s) {
  std::string text = "(";
  for (std::size_t i = 0; i < s.size(); ++i) text += (i ? ", " : "") + std::to_string(s[i]);
  return text + ")";
}

// The first element of a tensor checked to be contiguous.
template <class E> auto* xtensor_first(E& e) {
  if (!xtensor_contiguous(e)) {
    raise({"tensor_traits<xtensor>"},
          "an xtensor view or adaptor of shape " + xtensor_text(e.shape()) + " and strides " + xtensor_text(e.strides()) +
              " does not hold its elements back to back (in row-major or column-major order)",
          "Pass an xarray, an xtensor, an adaptor or a view without gaps (copy a view with gaps first: "
          "xt::xarray<float> copy = view)");
  }
  return e.data() + e.data_offset();
}

template <class E> struct xtensor_traits {
  using value = std::remove_const_t<typename E::value_type>;
  static auto* data(E& e) {
    if constexpr (std::is_const_v<std::remove_pointer_t<decltype(e.data())>>) return static_cast<const void*>(xtensor_first(e));
    else return static_cast<void*>(xtensor_first(e));
  }
  static std::size_t size(const E& e) noexcept { return static_cast<std::size_t>(e.size()); }
  static herd::dtype dtype(const E&) noexcept { return dtype_of_v<value>; }
  static herd::device device(const E&) noexcept { return herd::device::cpu(); }
  // Its shape where its memory is column-major (a column-major container, xt::transpose of a
  // row-major one), so that a checkpoint writes it in row-major order.
  static std::vector<std::size_t> column_major_shape(const E& e) {
    if (e.size() == 0 || xtensor_compact(e, true)) return {};
    return {e.shape().begin(), e.shape().end()};
  }
};

// Says at compile time why an xtensor type is no tensor; the functions only keep the compiler
// from adding errors of its own after the message.
template <class E> struct xtensor_refused {
  using value = std::remove_const_t<typename E::value_type>;
  static_assert(xtensor_strided<E>,
                "herd: this xtensor expression has no storage of its own (a + b, xt::sin(a), xt::arange(n), a view "
                "of an expression, ...), so herd has nothing to read or write in place. Evaluate it into a "
                "container first: xt::xarray<float> copy = expression;");
  static_assert(!xtensor_strided<E> || !xtl::is_complex<value>::value,
                "herd: an xtensor of std::complex is refused, since herd has no complex dtype. Reduce the real and "
                "imaginary parts as two real tensors (xt::xarray<double> re = xt::real(a), im = xt::imag(a);).");
  static_assert(!xtensor_strided<E> || xtl::is_complex<value>::value || element<value>,
                "herd: this xtensor value type is not one of herd's dtypes (half, bfloat16, float, double, int8_t, "
                "uint8_t, int32_t, int64_t). Use a tensor of one of those.");
  static void* data(E&) noexcept { return nullptr; }
  static std::size_t size(const E&) noexcept { return 0; }
  static herd::dtype dtype(const E&) noexcept { return herd::dtype::f32; }
  static herd::device device(const E&) noexcept { return herd::device::cpu(); }
};

template <class E>
using xtensor_traits_for = std::conditional_t<xtensor_strided<E> && element<std::remove_const_t<typename E::value_type>>,
                                              xtensor_traits<E>, xtensor_refused<E>>;

}  // namespace detail

// Every xtensor expression: containers and views with storage are tensors, the rest say why not.
template <class E>
  requires xt::is_xexpression<E>::value
struct tensor_traits<E> : detail::xtensor_traits_for<E> {};

}  // namespace herd

#endif  // HERD_TENSOR_XTENSOR_HPP
