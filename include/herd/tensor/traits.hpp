#ifndef HERD_TENSOR_TRAITS_HPP
#define HERD_TENSOR_TRAITS_HPP
// herd::tensor_traits: the one customization point. Specialize it for your tensor type:
//
//   template <> struct herd::tensor_traits<my::Tensor> {
//     static void*        data(my::Tensor& t)         { return t.raw(); }
//     static std::size_t  size(const my::Tensor& t)   { return t.numel(); }   // elements, not bytes
//     static herd::dtype  dtype(const my::Tensor& t)  { return herd::dtype::f32; }
//     static herd::device device(const my::Tensor& t) { return herd::device::cpu(); }
//   };
//
// The memory must be contiguous: size() elements of dtype() starting at data(). A type whose
// data() returns a const pointer is read-only: herd accepts it as an input, never as an output.
// herd calls data() on tensors it only reads through a const_cast and never writes through them.
//
// Optional, for a type that stores its elements column by column (the first index varies
// fastest, as in Eigen's default and Armadillo):
//     static std::vector<std::size_t> column_major_shape(const my::Tensor& t);   // {rows, cols, ...}
// returning its shape, or {} where this object is row-major. Collectives ignore it (every rank
// holds the same layout); checkpoints use it to write the tensor in the row-major order that
// safetensors and PyTorch read, so that t[i][j] in Python is element (i, j) here.

#include <herd/core/device.hpp>
#include <herd/core/dtype.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>
#include <vector>

namespace herd {

// Left undefined on purpose: the member below lets herd say "not adapted" instead of a wall of
// template errors.
template <class T> struct tensor_traits {
  using herd_not_adapted = void;
};

template <class T>
concept tensor = requires(std::remove_cvref_t<T>& t, const std::remove_cvref_t<T>& ct) {
  { tensor_traits<std::remove_cvref_t<T>>::data(t) } -> std::convertible_to<const void*>;
  { tensor_traits<std::remove_cvref_t<T>>::size(ct) } -> std::convertible_to<std::size_t>;
  { tensor_traits<std::remove_cvref_t<T>>::dtype(ct) } -> std::convertible_to<herd::dtype>;
  { tensor_traits<std::remove_cvref_t<T>>::device(ct) } -> std::convertible_to<herd::device>;
};

// A tensor herd may write into: its data() gives a non-const pointer.
template <class T>
concept writable_tensor = tensor<T> && requires(std::remove_cvref_t<T>& t) {
  { tensor_traits<std::remove_cvref_t<T>>::data(t) } -> std::convertible_to<void*>;
};

namespace detail {

template <class T>
concept not_adapted = requires { typename tensor_traits<std::remove_cvref_t<T>>::herd_not_adapted; };

// Called at the top of every function template that takes a user's tensor, so that a type herd
// cannot use fails with these words (the compiler names the type in the lines that follow).
template <class T> constexpr void require_tensor() {
  static_assert(!not_adapted<T>,
                "herd: this tensor type is not adapted. Specialize herd::tensor_traits<YourType> with four static "
                "functions: data(YourType&) -> void*, size(const YourType&) -> std::size_t (elements), "
                "dtype(const YourType&) -> herd::dtype and device(const YourType&) -> herd::device; or include the "
                "adapter herd ships for it (herd/tensor/std.hpp, dlpack.hpp, eigen.hpp, ...). If it is adapted already (a "
                "std::vector, say), its element type is not one of herd's dtypes (float, double, herd::half, "
                "herd::bfloat16, int8_t, uint8_t, int32_t, int64_t). See docs/adapters.md.");
  static_assert(not_adapted<T> || tensor<T>,
                "herd: herd::tensor_traits<YourType> is specialized but incomplete. It needs data(YourType&) "
                "returning a pointer, size(const YourType&) returning the element count, dtype(const YourType&) "
                "returning herd::dtype and device(const YourType&) returning herd::device, all static.");
}

template <class T> constexpr void require_writable_tensor() {
  require_tensor<T>();
  static_assert(!std::is_const_v<std::remove_reference_t<T>>,
                "herd: this tensor is const but herd must write the result into it. Pass a non-const tensor as "
                "the output (or as the tensor of an in-place collective).");
  static_assert(!tensor<T> || writable_tensor<T>,
                "herd: this tensor is read-only (tensor_traits<YourType>::data returns a const pointer) but herd "
                "must write the result into it. Pass a writable tensor as the output.");
}

// The shape of a tensor stored column by column, from its adapter's optional
// column_major_shape(); {} for row-major storage or an adapter that does not say.
template <class T> std::vector<std::size_t> column_major_shape_of(const T& t) {
  if constexpr (requires { tensor_traits<std::remove_cvref_t<T>>::column_major_shape(t); }) {
    return tensor_traits<std::remove_cvref_t<T>>::column_major_shape(t);
  } else {
    return {};
  }
}

}  // namespace detail
}  // namespace herd

#endif  // HERD_TENSOR_TRAITS_HPP
