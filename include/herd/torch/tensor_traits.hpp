#ifndef HERD_TORCH_TENSOR_TRAITS_HPP
#define HERD_TORCH_TENSOR_TRAITS_HPP
// tensor_traits for torch::Tensor (libtorch), which the rest of herd/torch/ builds on. Opt-in:
// the umbrella header does not include it, so programs without libtorch never see it.
//
//   #include <torch/torch.h>
//   #include <herd/herd.hpp>
//   #include <herd/torch/tensor_traits.hpp>
//   herd::allreduce(param.grad(), comm, herd::reduce_op::avg);
//
// Taken: dense (strided) contiguous tensors of float16, bfloat16, float32, float64, int8, uint8,
// int32 and int64 on the CPU or a CUDA device. An undefined tensor, a non-contiguous one, a
// sparse or quantized one, or another dtype raises herd::error saying what to do.

#include <herd/core/error.hpp>
#include <herd/tensor/traits.hpp>

#include <ATen/ATen.h>

#include <sstream>
#include <string>

namespace herd {
namespace detail {

// Defined, strided (dense) and not quantized: a tensor whose elements herd can address, in any
// memory layout.
inline const at::Tensor& require_dense(const at::Tensor& t) {
  if (!t.defined()) {
    throw error("herd: the torch::Tensor is undefined (a default-constructed tensor, or a parameter's grad() before "
                "its first backward pass). Pass a defined tensor, e.g. torch::zeros_like(param) for a missing grad.");
  }
  if (t.layout() != at::kStrided || t.is_quantized()) {
    std::ostringstream layout;  // c10::toString has no overload for a layout in every libtorch
    layout << t.layout();
    throw error("herd: the torch::Tensor is not a dense tensor (layout " + layout.str() +
                (t.is_quantized() ? ", quantized" : "") + "). Convert it with .to_dense() (or .dequantize()) first.");
  }
  return t;
}

// ... and contiguous (row-major): one block of memory in the order of its elements.
inline const at::Tensor& require_usable(const at::Tensor& t) {
  if (!require_dense(t).is_contiguous()) {
    throw error("herd: the torch::Tensor is not contiguous (a transposed, sliced or expanded view). Call .contiguous() "
                "and pass the result, keeping it alive while herd works on it.");
  }
  return t;
}

inline herd::dtype torch_dtype(const at::Tensor& t) {
  switch (require_dense(t).scalar_type()) {
    case at::kHalf: return dtype::f16;
    case at::kBFloat16: return dtype::bf16;
    case at::kFloat: return dtype::f32;
    case at::kDouble: return dtype::f64;
    case at::kChar: return dtype::i8;
    case at::kByte: return dtype::u8;
    case at::kInt: return dtype::i32;
    case at::kLong: return dtype::i64;
    default:
      throw error("herd: torch dtype " + std::string(c10::toString(t.scalar_type())) +
                  " has no herd dtype. herd takes float16, bfloat16, float32, float64, int8, uint8, int32 and int64; "
                  "convert with .to(torch::kFloat32) or similar.");
  }
}

inline herd::device torch_device(const at::Tensor& t) {
  const c10::Device d = require_dense(t).device();
  if (d.is_cpu()) return herd::device::cpu();
  if (d.is_cuda()) return herd::device::cuda(d.index());
  throw error("herd: the torch::Tensor lives on " + d.str() + ", which herd does not reach. Move it to the CPU or a "
              "CUDA device.");
}

}  // namespace detail

template <> struct tensor_traits<at::Tensor> {
  static void* data(at::Tensor& t) { return detail::require_usable(t).data_ptr(); }
  static std::size_t size(const at::Tensor& t) { return static_cast<std::size_t>(detail::require_usable(t).numel()); }
  static herd::dtype dtype(const at::Tensor& t) { return detail::torch_dtype(detail::require_usable(t)); }
  static herd::device device(const at::Tensor& t) { return detail::torch_device(detail::require_usable(t)); }
};

}  // namespace herd

#endif  // HERD_TORCH_TENSOR_TRAITS_HPP
