#ifndef HERD_CHECKPOINT_DETAIL_LAYOUT_HPP
#define HERD_CHECKPOINT_DETAIL_LAYOUT_HPP
// safetensors files hold a tensor's elements in row-major order (the last index varies fastest),
// which is how PyTorch and numpy read them. A column-major tensor (Eigen's default, Armadillo;
// the adapter's column_major_shape, tensor/traits.hpp) written as its memory lies would reach
// Python transposed, so a checkpoint copies such a tensor through this reordering on the way out
// and back: element (i, j) here is t[i][j] in Python. The file has no field for a layout, so the
// order of the data is the only way to keep the logical tensor.

#include <herd/core/config.hpp>

#include <cstddef>
#include <cstring>
#include <vector>

namespace herd::detail::ckpt {

// Whether memory of `shape` in column-major order differs from row-major order: it does unless
// at most one dimension exceeds 1.
HERD_SEPARATE bool reorders(const std::vector<std::size_t>& shape);

// Copies the elements of a tensor of `shape`, `element` bytes each, from column-major memory to
// row-major order (`to_row_major`), or back.
HERD_SEPARATE void reorder(void* out, const void* in, const std::vector<std::size_t>& shape, std::size_t element,
                           bool to_row_major);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE bool reorders(const std::vector<std::size_t>& shape) {
  std::size_t longer = 0;
  for (std::size_t d : shape) longer += d > 1 ? 1 : 0;
  return longer > 1;
}

HERD_SEPARATE void reorder(void* out, const void* in, const std::vector<std::size_t>& shape, std::size_t element,
                           bool to_row_major) {
  std::size_t count = 1;
  for (std::size_t d : shape) count *= d;
  if (count == 0) return;
  std::vector<std::size_t> index(shape.size(), 0), stride(shape.size(), 1);  // column-major strides
  for (std::size_t d = 1; d < shape.size(); ++d) stride[d] = stride[d - 1] * shape[d - 1];
  auto* to = static_cast<std::byte*>(out);
  const auto* from = static_cast<const std::byte*>(in);
  std::size_t column_major = 0;
  for (std::size_t row_major = 0; row_major < count; ++row_major) {
    if (to_row_major) std::memcpy(to + row_major * element, from + column_major * element, element);
    else std::memcpy(to + column_major * element, from + row_major * element, element);
    // The next index in row-major order: the last dimension first, carrying to the left.
    for (std::size_t d = shape.size(); d-- > 0;) {
      column_major += stride[d];
      if (++index[d] < shape[d]) break;
      column_major -= stride[d] * shape[d];
      index[d] = 0;
    }
  }
}

#endif

}  // namespace herd::detail::ckpt

#endif  // HERD_CHECKPOINT_DETAIL_LAYOUT_HPP
