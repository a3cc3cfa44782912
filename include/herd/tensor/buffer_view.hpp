#ifndef HERD_TENSOR_BUFFER_VIEW_HPP
#define HERD_TENSOR_BUFFER_VIEW_HPP
// A plain view of memory (pointer, element count, dtype, device): the adapter for raw buffers,
// and the form every tensor takes inside herd once its traits have been read.

#include <herd/tensor/traits.hpp>

#include <cstddef>
#include <vector>

namespace herd {

struct buffer_view {
  void* data = nullptr;
  std::size_t count = 0;  // elements
  herd::dtype type = herd::dtype::f32;
  herd::device device = herd::device::cpu();

  std::size_t bytes() const noexcept { return count * size_of(type); }
};

// The read-only twin, for inputs.
struct const_buffer_view {
  const void* data = nullptr;
  std::size_t count = 0;
  herd::dtype type = herd::dtype::f32;
  herd::device device = herd::device::cpu();

  const_buffer_view() = default;
  const_buffer_view(const void* d, std::size_t n, herd::dtype t, herd::device where = herd::device::cpu()) noexcept
      : data(d), count(n), type(t), device(where) {}
  const_buffer_view(const buffer_view& v) noexcept : data(v.data), count(v.count), type(v.type), device(v.device) {}

  std::size_t bytes() const noexcept { return count * size_of(type); }
};

template <> struct tensor_traits<buffer_view> {
  static void* data(buffer_view& v) noexcept { return v.data; }
  static std::size_t size(const buffer_view& v) noexcept { return v.count; }
  static herd::dtype dtype(const buffer_view& v) noexcept { return v.type; }
  static herd::device device(const buffer_view& v) noexcept { return v.device; }
};

template <> struct tensor_traits<const_buffer_view> {
  static const void* data(const const_buffer_view& v) noexcept { return v.data; }
  static std::size_t size(const const_buffer_view& v) noexcept { return v.count; }
  static herd::dtype dtype(const const_buffer_view& v) noexcept { return v.type; }
  static herd::device device(const const_buffer_view& v) noexcept { return v.device; }
};

// A view of any tensor herd may write into.
template <class T> buffer_view view_of(T& t) {
  detail::require_writable_tensor<T>();
  using traits = tensor_traits<std::remove_cvref_t<T>>;
  // device() first: an adapter that validates its tensor (DLPack strides, say) does so in data().
  const herd::device where = traits::device(t);
  void* p = traits::data(t);
  return {p, static_cast<std::size_t>(traits::size(t)), traits::dtype(t), where};
}

// A read-only view of any tensor.
template <class T> const_buffer_view const_view_of(const T& t) {
  detail::require_tensor<T>();
  using U = std::remove_cvref_t<T>;
  using traits = tensor_traits<U>;
  const herd::device where = traits::device(t);
  const void* p = traits::data(const_cast<U&>(t));
  return {p, static_cast<std::size_t>(traits::size(t)), traits::dtype(t), where};
}

// Views of several tensors, of any adapted types: herd::views(weights, bias, embedding).
template <class... T> std::vector<buffer_view> views(T&... tensors) { return {view_of(tensors)...}; }

}  // namespace herd

#endif  // HERD_TENSOR_BUFFER_VIEW_HPP
