#ifndef HERD_TENSOR_ARMADILLO_HPP
#define HERD_TENSOR_ARMADILLO_HPP
// tensor_traits for Armadillo's dense objects: Mat, Col, Row and Cube (fixed sizes too), and
// subviews that are one block of memory, of herd's element types (fmat, mat, Mat<char> (arma::s8),
// Mat<uint8_t>, Mat<int32_t>, and imat, whose long long elements herd takes as int64).
// Opt-in: include it after <armadillo>.
//
//   arma::fmat grad(784, 256);
//   herd::allreduce(grad, comm, herd::reduce_op::avg);
//   herd::distributed_optimizer opt(sgd, herd::views(grad_w, grad_b), comm);
//
// Armadillo stores column by column, so a subview of whole columns (m.cols(a, b), m.col(i), part
// of one column, whole slices of a cube) is one block of memory: herd reduces it in place, as
// it does an Eigen Ref of a column, and spares the caller a copy out and back. A subview with
// gaps (a row of a matrix, a submatrix of partial columns) is refused at run time with
// herd::error, on every rank of the collective; an expression (a + b, m.t(), m.elem(i),
// m.diag()), a sparse matrix and a complex element type are refused at compile time.

#include <herd/core/error.hpp>
#include <herd/tensor/traits.hpp>

#include <armadillo>

#include <concepts>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {
namespace detail {

template <class A>
concept armadillo_dense =
    std::derived_from<A, arma::Mat<typename A::elem_type>> || std::derived_from<A, arma::Cube<typename A::elem_type>>;

template <class A>
concept armadillo_subview = std::derived_from<A, arma::subview<typename A::elem_type>> ||
                            std::derived_from<A, arma::subview_cube<typename A::elem_type>>;

template <class A>
concept armadillo_sparse = std::is_base_of_v<arma::SpBase<typename A::elem_type, A>, A>;

// Armadillo's expressions derive from Base (matrices) or BaseCube (cubes) of themselves.
template <class A>
concept armadillo_object = armadillo_dense<A> || armadillo_subview<A> || armadillo_sparse<A> ||
                           std::is_base_of_v<arma::Base<typename A::elem_type, A>, A> ||
                           std::is_base_of_v<arma::BaseCube<typename A::elem_type, A>, A>;

// imat's elements (arma::sword) are long long, a 64-bit signed type that is not int64_t (long)
// on Linux; herd takes them as int64. Armadillo's signed 8-bit type (arma::s8) is plain char, which
// is neither int8_t nor uint8_t (Mat<int8_t> does not compile): herd takes it as i8 or u8, as
// char is signed or not on the platform.
template <class T>
concept armadillo_element = element<T> || std::is_same_v<T, char> ||
                            (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8);

template <class T> constexpr herd::dtype armadillo_dtype() noexcept {
  if constexpr (element<T>) return dtype_of_v<T>;
  else if constexpr (std::is_same_v<T, char>) return std::is_signed_v<char> ? dtype::i8 : dtype::u8;
  else return dtype::i64;
}

[[noreturn]] inline void armadillo_refuse(const std::string& what) {
  raise({"tensor_traits<Armadillo>"}, what + " does not hold its elements back to back (Armadillo stores column by column)",
        "Pass a Mat, Col, Row or Cube, or a subview of whole columns (m.cols(a, b), m.col(i)) or whole slices "
        "(c.slices(a, b)); copy other subviews first (arma::mat copy = m.row(i))");
}

inline std::string armadillo_span(const char* name, arma::uword first, arma::uword count) {
  return std::string(name) + " " + std::to_string(first) + " to " + std::to_string(first + count - 1);
}

// The first element of a subview, checked to be one block: whole columns, or part of one column.
template <class T> T* armadillo_first(arma::subview<T>& s) {
  if (s.n_elem == 0) return nullptr;
  if (s.n_cols != 1 && s.n_rows != s.m.n_rows) {
    armadillo_refuse("an Armadillo subview of " + armadillo_span("rows", s.aux_row1, s.n_rows) + " and " +
                     armadillo_span("columns", s.aux_col1, s.n_cols) + " of a " + std::to_string(s.m.n_rows) + "x" +
                     std::to_string(s.m.n_cols) + " matrix");
  }
  return s.colptr(0);
}

// The same for a cube: whole slices, or whole columns or part of one column within one slice.
template <class T> T* armadillo_first(arma::subview_cube<T>& s) {
  if (s.n_elem == 0) return nullptr;
  const bool whole_slices = s.n_rows == s.m.n_rows && s.n_cols == s.m.n_cols;
  const bool within_slice = s.n_slices == 1 && (s.n_cols == 1 || s.n_rows == s.m.n_rows);
  if (!whole_slices && !within_slice) {
    armadillo_refuse("an Armadillo subview of " + armadillo_span("rows", s.aux_row1, s.n_rows) + ", " +
                     armadillo_span("columns", s.aux_col1, s.n_cols) + " and " +
                     armadillo_span("slices", s.aux_slice1, s.n_slices) + " of a " + std::to_string(s.m.n_rows) +
                     "x" + std::to_string(s.m.n_cols) + "x" + std::to_string(s.m.n_slices) + " cube");
  }
  return s.slice_colptr(0, 0);
}

template <class A> struct armadillo_traits {
  using value = typename A::elem_type;
  static void* data(A& a) {
    if constexpr (armadillo_dense<A>) return a.memptr();
    else return armadillo_first(a);
  }
  static std::size_t size(const A& a) noexcept { return static_cast<std::size_t>(a.n_elem); }
  static herd::dtype dtype(const A&) noexcept { return armadillo_dtype<value>(); }
  static herd::device device(const A&) noexcept { return herd::device::cpu(); }
  // Every object accepted above is column-major over its own rows, columns (and slices).
  static std::vector<std::size_t> column_major_shape(const A& a) {
    std::vector<std::size_t> shape{static_cast<std::size_t>(a.n_rows), static_cast<std::size_t>(a.n_cols)};
    if constexpr (requires { a.n_slices; }) shape.push_back(static_cast<std::size_t>(a.n_slices));
    return shape;
  }
};

// Says at compile time why an Armadillo type is no tensor; the functions only keep the compiler
// from adding errors of its own after the message.
template <class A> struct armadillo_refused {
  using value = typename A::elem_type;
  static_assert(!armadillo_sparse<A>,
                "herd: a sparse Armadillo matrix is refused: herd reduces dense storage. Convert it to a dense Mat "
                "first: arma::mat dense(sparse);");
  static_assert(armadillo_sparse<A> || armadillo_dense<A> || armadillo_subview<A>,
                "herd: this Armadillo expression (a + b, m.t(), m.elem(indices), m.diag(), ...) holds no block of "
                "memory herd can read or write in place. Evaluate it into a Mat, Col, Row or Cube first: "
                "arma::mat copy = expression;");
  static_assert(armadillo_sparse<A> || !(armadillo_dense<A> || armadillo_subview<A>) || !arma::is_cx<value>::value,
                "herd: Armadillo's complex types (cx_mat, cx_fmat, cx_vec, cx_cube, ...) are refused, since herd has "
                "no complex dtype. Reduce the real and imaginary parts as two real matrices "
                "(arma::mat re = arma::real(z), im = arma::imag(z);).");
  static_assert(armadillo_sparse<A> || !(armadillo_dense<A> || armadillo_subview<A>) || arma::is_cx<value>::value ||
                    armadillo_element<value>,
                "herd: this Armadillo element type is not one of herd's dtypes: use float (fmat), double (mat), "
                "char (arma::s8), uint8_t, int32_t or a 64-bit signed integer (imat); umat's unsigned elements are refused.");
  static void* data(A&) noexcept { return nullptr; }
  static std::size_t size(const A&) noexcept { return 0; }
  static herd::dtype dtype(const A&) noexcept { return herd::dtype::f32; }
  static herd::device device(const A&) noexcept { return herd::device::cpu(); }
};

template <class A>
using armadillo_traits_for =
    std::conditional_t<(armadillo_dense<A> || armadillo_subview<A>) && armadillo_element<typename A::elem_type>,
                       armadillo_traits<A>, armadillo_refused<A>>;

}  // namespace detail

// Every Armadillo object: dense storage and its subviews are tensors, the rest say why not.
template <class A>
  requires detail::armadillo_object<A>
struct tensor_traits<A> : detail::armadillo_traits_for<A> {};

}  // namespace herd

#endif  // HERD_TENSOR_ARMADILLO_HPP
