#ifndef HERD_TENSOR_EIGEN_HPP
#define HERD_TENSOR_EIGEN_HPP
// tensor_traits for Eigen's dense storage: Matrix and Array (fixed or dynamic sizes, either
// storage order), and Map and Ref over them, of herd's element types (float, double, int8_t,
// uint8_t, int32_t, int64_t). Opt-in: include it after <Eigen/Core>.
//
//   Eigen::MatrixXf grad(256, 784);
//   herd::allreduce(grad, comm, herd::reduce_op::avg);
//   herd::distributed_optimizer opt(sgd, herd::views(grad_w, grad_b), comm);
//
// herd moves a tensor's elements as one contiguous range, in storage order; a checkpoint writes a
// column-major one in row-major order (column_major_shape), as PyTorch reads it. A Map or Ref with
// strides that leave gaps (a Ref to a block of a larger matrix, every other column) is refused
// at run time with herd::error, on every rank of the collective. Anything else Eigen makes is an
// expression or a block (a + b, m.transpose(), m.block(...), m.col(i)): it is refused at compile
// time with a message that says what to pass instead.

#include <herd/core/error.hpp>
#include <herd/tensor/traits.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {
namespace detail {

// The elements of a dense Eigen object, checked to lie back to back.
template <class Dense> auto* eigen_data(Dense& d) {
  // With one element per inner run (a 1xN column-major Map, say) the inner stride never steps.
  const bool contiguous = d.size() <= 1 || (d.innerSize() == 1 ? d.outerStride() == 1
                                                                : d.innerStride() == 1 && (d.outerSize() <= 1 ||
                                                                                           d.outerStride() == d.innerSize()));
  if (!contiguous) {
    raise({"tensor_traits<Eigen>"},
          "an Eigen view of " + std::to_string(d.rows()) + "x" + std::to_string(d.cols()) + " with inner stride " +
              std::to_string(d.innerStride()) + " and outer stride " + std::to_string(d.outerStride()) +
              " does not hold its elements back to back",
          "Pass a Matrix, an Array, or a Map/Ref without gaps (copy a block into a Matrix first)");
  }
  return d.data();
}

template <class Dense> struct eigen_traits {
  using scalar = typename Dense::Scalar;
  static_assert(element<scalar>, "herd: this Eigen scalar type is not one of herd's dtypes");
  static auto* data(Dense& d) {
    if constexpr (std::is_const_v<std::remove_pointer_t<decltype(d.data())>>) return static_cast<const void*>(eigen_data(d));
    else return static_cast<void*>(eigen_data(d));
  }
  static const void* data(const Dense& d) { return eigen_data(d); }
  static std::size_t size(const Dense& d) noexcept { return static_cast<std::size_t>(d.size()); }
  static herd::dtype dtype(const Dense&) noexcept { return dtype_of_v<std::remove_const_t<scalar>>; }
  static herd::device device(const Dense&) noexcept { return herd::device::cpu(); }
  static std::vector<std::size_t> column_major_shape(const Dense& d) {
    if constexpr (Dense::IsRowMajor) return {};
    else return {static_cast<std::size_t>(d.rows()), static_cast<std::size_t>(d.cols())};
  }
};

template <class T> inline constexpr bool eigen_storage = false;
template <class S, int R, int C, int O, int MR, int MC>
inline constexpr bool eigen_storage<Eigen::Matrix<S, R, C, O, MR, MC>> = true;
template <class S, int R, int C, int O, int MR, int MC>
inline constexpr bool eigen_storage<Eigen::Array<S, R, C, O, MR, MC>> = true;
template <class P, int O, class S> inline constexpr bool eigen_storage<Eigen::Map<P, O, S>> = true;
template <class P, int O, class S> inline constexpr bool eigen_storage<Eigen::Ref<P, O, S>> = true;

template <class T> inline constexpr bool eigen_block = false;
template <class X, int R, int C, bool I> inline constexpr bool eigen_block<Eigen::Block<X, R, C, I>> = true;

// Says at compile time why an Eigen block or expression is no tensor; the functions only keep
// the compiler from adding errors of its own after the message.
template <class E> struct eigen_refused {
  static_assert(!eigen_block<E>,
                "herd: an Eigen block (m.block(...), m.col(i), m.row(i), m.topRows(n), ...) is not a tensor of its own. "
                "Pass Eigen::Ref<Eigen::MatrixXf>(m.col(i)) or an Eigen::Map over the same memory (herd checks at run "
                "time that its elements lie back to back), or a copy: Eigen::MatrixXf copy = m.block(...);");
  static_assert(eigen_block<E>,
                "herd: this Eigen expression (a + b, m.transpose(), m.cwiseAbs(), ...) has no storage of its own, so "
                "herd has nothing to read or write in place. Evaluate it into a Matrix or Array first: "
                "Eigen::MatrixXf copy = expression;");
  static void* data(E&) noexcept { return nullptr; }
  static std::size_t size(const E&) noexcept { return 0; }
  static herd::dtype dtype(const E&) noexcept { return herd::dtype::f32; }
  static herd::device device(const E&) noexcept { return herd::device::cpu(); }
};

}  // namespace detail

template <class S, int R, int C, int O, int MR, int MC>
struct tensor_traits<Eigen::Matrix<S, R, C, O, MR, MC>> : detail::eigen_traits<Eigen::Matrix<S, R, C, O, MR, MC>> {};

template <class S, int R, int C, int O, int MR, int MC>
struct tensor_traits<Eigen::Array<S, R, C, O, MR, MC>> : detail::eigen_traits<Eigen::Array<S, R, C, O, MR, MC>> {};

template <class Plain, int Options, class Stride>
struct tensor_traits<Eigen::Map<Plain, Options, Stride>> : detail::eigen_traits<Eigen::Map<Plain, Options, Stride>> {};

template <class Plain, int Options, class Stride>
struct tensor_traits<Eigen::Ref<Plain, Options, Stride>> : detail::eigen_traits<Eigen::Ref<Plain, Options, Stride>> {};

// Every other Eigen object (blocks and expressions) says why it is not a tensor.
template <class E>
  requires std::is_base_of_v<Eigen::DenseBase<E>, E> && (!detail::eigen_storage<E>)
struct tensor_traits<E> : detail::eigen_refused<E> {};

}  // namespace herd

#endif  // HERD_TENSOR_EIGEN_HPP
