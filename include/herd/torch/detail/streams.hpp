#ifndef HERD_TORCH_DETAIL_STREAMS_HPP
#define HERD_TORCH_DETAIL_STREAMS_HPP
// libtorch's current CUDA stream and herd's streams, ordered by events. libtorch computes on the
// current stream of the calling thread (a stream of its pool under a c10::StreamGuard, say),
// which herd cannot name as a cudaStream_t without libc10_cuda; c10's device-guard interface,
// in libc10 itself, records and waits for events on it. So a program built against a libtorch
// without CUDA still links, and never comes here (it has no CUDA tensors).
//
// Compiled where herd reaches GPUs from a host-compiled file (HERD_WITH_NCCL) or under nvcc.

#if defined(__CUDACC__) || defined(HERD_WITH_NCCL)
#include <herd/cuda/error.hpp>
#include <herd/cuda/runtime.hpp>

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cuda_runtime_api.h>

#define HERD_HAVE_TORCH_STREAMS 1

namespace herd::detail {

inline const c10::impl::DeviceGuardImplInterface& torch_cuda_guard() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

inline c10::Device torch_cuda_device(int device) { return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)}; }

// Work queued on `waiter` from now on waits for what libtorch queued so far on its current
// stream of `device`.
inline void after_torch_stream(int device, cudaStream_t waiter) {
  const c10::Device where = torch_cuda_device(device);
  const c10::Stream torch_stream = torch_cuda_guard().getStream(where);
  void* done = nullptr;  // a cudaEvent_t, created by c10
  torch_cuda_guard().record(&done, torch_stream, where.index(), c10::EventFlag::PYTORCH_DEFAULT);
  const cudaError_t waited = cudaStreamWaitEvent(waiter, static_cast<cudaEvent_t>(done), 0);
  torch_cuda_guard().destroyEvent(done, where.index());
  HERD_CUDA_CHECK(waited);
}

// What libtorch queues on its current stream of `device` from now on waits for the work queued
// so far on `upstream`.
inline void torch_stream_after(int device, cudaStream_t upstream) {
  const c10::Device where = torch_cuda_device(device);
  const c10::DeviceGuard on(where);
  cuda::event done;
  done.record(upstream);
  torch_cuda_guard().block(done.get(), torch_cuda_guard().getStream(where));
}

// Returns once libtorch's current stream of `device` has done what it was given so far.
inline void settle_torch_stream(int device) {
  const c10::Device where = torch_cuda_device(device);
  const c10::DeviceGuard on(where);
  void* done = nullptr;
  torch_cuda_guard().record(&done, torch_cuda_guard().getStream(where), where.index(), c10::EventFlag::PYTORCH_DEFAULT);
  const cudaError_t waited = cudaEventSynchronize(static_cast<cudaEvent_t>(done));
  torch_cuda_guard().destroyEvent(done, where.index());
  HERD_CUDA_CHECK(waited);
}

}  // namespace herd::detail
#else
#define HERD_HAVE_TORCH_STREAMS 0
#endif

#endif  // HERD_TORCH_DETAIL_STREAMS_HPP
