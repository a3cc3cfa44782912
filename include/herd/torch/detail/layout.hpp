#ifndef HERD_TORCH_DETAIL_LAYOUT_HPP
#define HERD_TORCH_DETAIL_LAYOUT_HPP
// Tensors in a memory layout other than row-major (a channels_last convolution weight, a
// transposed matrix), as the DDP wrapper and the libtorch broadcasts take them.
//
// Reductions: a tensor that is non-overlapping and dense fills numel elements of its storage back
// to back, in the order its strides give. Two ranks whose tensors have the same sizes and strides
// hold the same element at each place of that span, so the span reduces as one block, as a
// contiguous tensor does. A gradient's layout is its parameter's where that is dense, row-major
// otherwise: the layout of PyTorch's DDP bucket views, and the one autograd gives a gradient it
// creates (the layout contract of AccumulateGrad). The DDP wrapper checks at construction that the
// ranks' parameters agree on it.
//
// Broadcasts: each element goes to the element of the same index on every rank, whatever each
// rank's layout, as PyTorch's coalesced broadcasts: a tensor that is not row-major travels
// through a row-major copy.

#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <string>
#include <vector>

namespace herd::detail {

// The strides of `param`'s gradient in a bucket: its own where it is dense, row-major otherwise.
inline std::vector<std::int64_t> gradient_strides(const at::Tensor& param) {
  if (param.is_non_overlapping_and_dense()) return param.strides().vec();
  std::vector<std::int64_t> strides(static_cast<std::size_t>(param.dim()));
  std::int64_t step = 1;
  for (std::int64_t k = param.dim() - 1; k >= 0; --k) {
    strides[static_cast<std::size_t>(k)] = step;
    step *= std::max<std::int64_t>(param.size(k), 1);
  }
  return strides;
}

// The strides that decide where each element lies: those of the dimensions longer than 1 (a
// dimension of length 1 is never stepped along, so its stride is left out as 0). Two tensors of
// the same sizes and the same of these place every element alike.
inline std::vector<std::int64_t> placing_strides(at::IntArrayRef sizes, at::IntArrayRef strides) {
  std::vector<std::int64_t> out(sizes.size(), 0);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] > 1) out[k] = strides[k];
  }
  return out;
}

// Whether `grad` lies as `param`'s gradient does in its bucket.
inline bool in_gradient_layout(const at::Tensor& grad, const at::Tensor& param) {
  if (grad.sizes() != param.sizes() || !grad.is_non_overlapping_and_dense()) return false;
  const std::vector<std::int64_t> want = gradient_strides(param);
  return placing_strides(grad.sizes(), grad.strides()) == placing_strides(param.sizes(), want);
}

// An uninitialized tensor in `param`'s gradient layout.
inline at::Tensor empty_gradient(const at::Tensor& param) {
  return at::empty_strided(param.sizes(), gradient_strides(param), param.options());
}

// The numel elements a dense tensor of any layout occupies, as one view in memory order.
inline buffer_view span_view(const at::Tensor& t) {
  const herd::dtype type = torch_dtype(t);
  if (!t.is_non_overlapping_and_dense()) {
    throw error("herd: the torch::Tensor is neither contiguous nor dense in another layout (a sliced or expanded "
                "view). Call .contiguous() and pass the result.");
  }
  return {t.data_ptr(), static_cast<std::size_t>(t.numel()), type, torch_device(t)};
}

// Views for a broadcast of tensors in any layout: a row-major tensor as it is, any other through a
// row-major copy that write_back() copies into it once the broadcast is done.
class row_major_views {
 public:
  void add(at::Tensor& t) {
    torch_dtype(t);  // defined, dense, a dtype herd has: said before libtorch is asked for a copy
    if (t.is_contiguous()) {
      views_.push_back(view_of(t));
      return;
    }
    at::Tensor copy = t.contiguous();
    views_.push_back(view_of(copy));
    staged_.emplace_back(t, std::move(copy));
  }
  // add(t), or, where it refuses t, the reason kept (the first one) for the check of the tensors
  // that every rank makes next, so that every rank raises it.
  void add_or_keep_fault(at::Tensor& t) {
    if (!fault_.empty()) return;
    try {
      add(t);
    } catch (const std::exception& e) {
      fault_ = e.what();
    }
  }
  const std::string& fault() const noexcept { return fault_; }
  std::vector<buffer_view>& views() noexcept { return views_; }
  void write_back() {
    const ::torch::NoGradGuard no_grad;  // parameters are leaves that require a gradient
    for (auto& [tensor, copy] : staged_) tensor.copy_(copy);
  }

 private:
  std::vector<buffer_view> views_;
  std::vector<std::pair<at::Tensor, at::Tensor>> staged_;
  std::string fault_;
};

}  // namespace herd::detail

#endif  // HERD_TORCH_DETAIL_LAYOUT_HPP
