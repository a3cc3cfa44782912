#ifndef HERD_TORCH_DETAIL_DEVICE_ARITHMETIC_HPP
#define HERD_TORCH_DETAIL_DEVICE_ARITHMETIC_HPP
// libtorch's GPU kernels lent to herd's distributed optimizer and DDP wrapper in files that a host
// compiler builds (g++, the usual way to build a libtorch program), where herd's own kernels do
// not exist: casting and scaling gradients into and out of fusion buffers (compression,
// gradient_predivide_factor, 16-bit averages) and summing accumulated passes. Under nvcc herd's
// own kernels run instead, and nothing here is compiled.
//
// Streams: ATen computes on the current stream of libtorch's calling thread (where autograd
// produced the gradients); herd's packing stream and that stream are ordered both ways by events
// (torch/detail/streams.hpp).

#include <herd/core/config.hpp>
// Outside the #if: SyncBatchNorm includes it unconditionally, and the single header inlines it once.
#include <herd/torch/detail/streams.hpp>

#if !HERD_WITH_CUDA_KERNELS && defined(HERD_WITH_NCCL)
#include <herd/cuda/runtime.hpp>
#include <herd/optim/detail/gradient_movers.hpp>

#include <ATen/ATen.h>

#include <span>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

inline at::ScalarType aten_type(dtype t) {
  switch (t) {
    case dtype::f16: return at::kHalf;
    case dtype::bf16: return at::kBFloat16;
    case dtype::f32: return at::kFloat;
    case dtype::f64: return at::kDouble;
    case dtype::i8: return at::kChar;
    case dtype::u8: return at::kByte;
    case dtype::i32: return at::kInt;
    case dtype::i64: return at::kLong;
  }
  return at::kByte;
}

// `count` elements of `type` at `data` on `device`, as a tensor that does not own them.
inline at::Tensor aten_view(const void* data, dtype type, std::size_t count, int device) {
  return at::from_blob(const_cast<void*>(data), {static_cast<std::int64_t>(count)},
                       at::TensorOptions().dtype(aten_type(type)).device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
}

// Runs `work` with libtorch's ops on its current stream of `device`, after what herd queued on
// `stream`, and makes `stream` wait for it.
template <class Work> void on_torch_stream(int device, cudaStream_t stream, Work&& work) {
  const c10::DeviceGuard on(torch_cuda_device(device));
  torch_stream_after(device, stream);
  work();
  after_torch_stream(device, stream);
}

// The arithmetic of herd's kernels (cuda::cast, cuda::reduce): products in f32, or in f64 where
// either side is f64, rounded once into the destination's type.
inline at::ScalarType compute_type(dtype a, dtype b) {
  return a == dtype::f64 || b == dtype::f64 ? at::kDouble : at::kFloat;
}

inline const lent_device_arithmetic& torch_device_arithmetic() {
  static const lent_device_arithmetic arithmetic{
      [](int device, cudaStream_t stream, std::span<const move_item> items, dtype out_type, dtype in_type, double scale) {
        on_torch_stream(device, stream, [&] {
          for (const move_item& it : items) {
            if (it.count == 0) continue;
            at::Tensor out = aten_view(it.out, out_type, it.count, device);
            const at::Tensor in = aten_view(it.in, in_type, it.count, device);
            if (scale == 1.0) out.copy_(in);
            else out.copy_(in.to(compute_type(out_type, in_type)).mul_(scale));
          }
        });
      },
      [](int device, cudaStream_t stream, const buffer_view& acc, const buffer_view& grad, bool first) {
        if (grad.count == 0) return;
        on_torch_stream(device, stream, [&] {
          at::Tensor sum = aten_view(acc.data, acc.type, grad.count, device);
          const at::Tensor g = aten_view(grad.data, grad.type, grad.count, device);
          if (first) sum.copy_(g);
          else sum.add_(g.to(sum.scalar_type()));
        });
      },
      [](int device, cudaStream_t stream, const buffer_view& grad, const buffer_view& acc) {
        if (grad.count == 0) return;
        on_torch_stream(device, stream, [&] {
          at::Tensor g = aten_view(grad.data, grad.type, grad.count, device);
          const at::Tensor sum = aten_view(acc.data, acc.type, grad.count, device);
          g.copy_(g.to(sum.scalar_type()).add_(sum));
        });
      }};
  return arithmetic;
}

// Lends libtorch's kernels to every device_mover of this configuration; called by the libtorch
// entry points (torch_gradients, the DDP wrapper) before their first step.
inline void lend_torch_device_arithmetic() noexcept { device_arithmetic_lender() = &torch_device_arithmetic(); }

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#else

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN
inline void lend_torch_device_arithmetic() noexcept {}  // herd's own kernels (nvcc), or no GPU path
HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif

#endif  // HERD_TORCH_DETAIL_DEVICE_ARITHMETIC_HPP
