#ifndef HERD_TORCH_DETAIL_MISSING_GRADIENT_HPP
#define HERD_TORCH_DETAIL_MISSING_GRADIENT_HPP
// A parameter that got no gradient in a pass (unused by this rank's forward) still takes part in
// the reduction, as zeros, so that every rank reduces the same list of tensors: torch_gradients
// and the DDP wrapper fill it alike.

#include <torch/types.h>
#include <torch/utils.h>

namespace herd::detail {

// Gives `param` a gradient of zeros if it has none, in `place` (zeroed) where one is given (its
// place in a bucket), else in a new tensor. Returns whether it had to.
inline bool fill_missing_gradient(at::Tensor& param, at::Tensor* place = nullptr) {
  if (param.grad().defined()) return false;
  const ::torch::NoGradGuard no_grad;
  param.mutable_grad() = place != nullptr ? place->zero_() : ::torch::zeros_like(param);
  return true;
}

}  // namespace herd::detail

#endif  // HERD_TORCH_DETAIL_MISSING_GRADIENT_HPP
