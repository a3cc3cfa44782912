#pragma once
// Which path a collective takes for a communicator and a device:
// - a communicator with native collectives (nccl_communicator) runs them on its own memory;
// - device tensors over a host-memory communicator go through herd's staged paths, which need
//   herd's kernels and so a translation unit compiled by nvcc;
// - everything else is host memory over herd's own algorithms.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/staged_ring.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/device.hpp>
#include <herd/cuda/staging.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstring>
#include <string>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <class C>
concept native_collectives = requires(C& c, const_buffer_view in, buffer_view out, reduce_op op) {
  c.native_allreduce(in, out, op);
  c.native_broadcast(out, 0);
  c.native_allgather(in, out);
  c.native_reduce_scatter(in, out, op);
  c.synchronize();
};

// Whether a collective on `comm` can take a tensor on `d` in this translation unit.
template <communicator C> bool reaches(const C& comm, device d) {
  if (comm.supports(d)) return true;
  if constexpr (!native_collectives<C>) return d.is_cuda() && HERD_WITH_CUDA_KERNELS;
  return false;
}

// What to do about a tensor `comm` cannot reach.
template <communicator C> const char* unreachable_advice(const C& comm, device d) {
  if constexpr (native_collectives<C>) {
    (void)comm;
    return d.is_cpu() ? "This communicator reduces GPU memory with NCCL; move the tensor to its GPU, or use an "
                        "mpi_communicator for host tensors"
                      : "Move the tensor to this communicator's GPU, or build the communicator on the tensor's device";
  } else {
    (void)comm;
    return "Compile this translation unit with nvcc so that herd can stage device memory through the host with its "
           "kernels, or use herd::nccl_communicator for GPU tensors";
  }
}

#if HERD_WITH_CUDA_KERNELS
// Device tensors over a host-memory communicator: the ring allreduce staged through page-locked
// host buffers (device buffers, when the MPI is CUDA-aware), reductions on the device.
template <communicator C>
void staged_allreduce(C& comm, dtype type, reduce_op op, const void* in, void* out, std::size_t count, int device) {
  const cuda::device_guard on(device);
  cuda::stream_stage& stage = cuda::stage_for(device);
  bool direct = false;
  if constexpr (requires { comm.cuda_aware(); }) direct = comm.cuda_aware();
  stage.begin(direct);
  staged_ring_allreduce(comm, stage, type, op, static_cast<const std::byte*>(in), static_cast<std::byte*>(out), count,
                        comm.options().ring_segment_bytes);
}

// The other collectives on device tensors over a host-memory communicator: the input copied to
// the host, the host algorithm, the output copied back.
template <class Run>
void through_host(const_buffer_view in, buffer_view out, Run run) {
  const int device = (in.device.is_cuda() ? in.device : out.device).index;
  const cuda::device_guard on(device);
  cuda::stream_stage& stage = cuda::stage_for(device);
  stage.begin();
  std::byte* host_in = stage.host_buffer(in.bytes(), 0);
  std::byte* host_out = in.data == out.data ? host_in : stage.host_buffer(out.bytes(), 1);
  if (in.bytes() != 0) stage.to_host(host_in, in.data, in.bytes());
  stage.finish();
  run(const_buffer_view(host_in, in.count, in.type), buffer_view{host_out, out.count, out.type, device::cpu()});
  if (out.bytes() != 0) stage.to_device(out.data, host_out, out.bytes());
  stage.finish();
}
#endif

#if HERD_WITH_CUDA_KERNELS
// The stream a communicator's native collectives run on (the legacy default stream if it names none).
template <class C> cudaStream_t stream_of(C& comm) {
  if constexpr (requires { comm.stream(); }) return comm.stream();
  else return nullptr;
}
#endif

// Reductions a communicator with native collectives (NCCL) cannot do in this translation unit.
inline void require_native_op(call_check& check, dtype type, reduce_op op) {
  if (check.ok() && !HERD_WITH_CUDA_KERNELS && op == reduce_op::avg && is_integral(type)) {
    check.fail(12, "avg on integer tensors over NCCL needs herd's division kernel",
               "Compile this translation unit with nvcc, or reduce with sum and divide yourself");
  }
  if (check.ok() && is_bitwise(op)) {
    check.fail(12, "NCCL has no bitwise reductions", "Use sum, prod, min, max or avg on GPU tensors");
  }
}

// Runs a native reduction, reduce(op) (an allreduce or a reduce-scatter into `out`), and with
// host_sync waits for it; herd's integer avg (the sum divided by the ranks, truncated) is NCCL's
// sum followed by herd's division kernel.
template <communicator C, class Reduce>
void native_reduction(C& comm, buffer_view out, reduce_op op, bool host_sync, Reduce reduce) {
  const bool integer_avg = op == reduce_op::avg && is_integral(out.type);
  reduce(integer_avg ? reduce_op::sum : op);
#if HERD_WITH_CUDA_KERNELS
  if (integer_avg) cuda::finalize_avg(out.type, out.data, out.count, comm.size(), stream_of(comm));
#endif
  if (host_sync) comm.synchronize();
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail
