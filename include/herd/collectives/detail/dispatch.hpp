#ifndef HERD_COLLECTIVES_DETAIL_DISPATCH_HPP
#define HERD_COLLECTIVES_DETAIL_DISPATCH_HPP
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
#include <span>
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
// Device tensors over a host-memory communicator: herd's staged collectives
// (detail/staged_ring.hpp), through bounded page-locked host slots (device slots, when the MPI
// is CUDA-aware), reductions on the device; ordered after the caller's stream. Each runs with its
// device current and returns once the device is done.
template <communicator C, class Run> void run_staged(C& comm, int device, Run run) {
  const cuda::device_guard on(device);
  cuda::stream_stage& stage = cuda::stage_for(device);
  bool direct = false;
  if constexpr (requires { comm.cuda_aware(); }) direct = comm.cuda_aware();
  stage.begin(direct);
  run(stage);
}

template <communicator C>
void staged_allreduce(C& comm, dtype type, reduce_op op, const void* in, void* out, std::size_t count, int device) {
  run_staged(comm, device, [&](cuda::stream_stage& stage) {
    staged_ring_allreduce(comm, stage, type, op, static_cast<const std::byte*>(in), static_cast<std::byte*>(out), count,
                          comm.options().ring_segment_bytes);
  });
}

template <communicator C> void staged_reduce_scatter(C& comm, const_buffer_view in, buffer_view out, reduce_op op) {
  run_staged(comm, out.device.index, [&](cuda::stream_stage& stage) {
    staged_ring_reduce_scatter(comm, stage, in.type, op, static_cast<const std::byte*>(in.data),
                               static_cast<std::byte*>(out.data), out.count, comm.options().ring_segment_bytes);
  });
}

// Allgather(v): this rank's input copied to its place in the output, then the ring.
template <communicator C>
void staged_allgather(C& comm, const_buffer_view in, buffer_view out, std::span<const std::size_t> counts,
                      std::size_t before) {
  run_staged(comm, out.device.index, [&](cuda::stream_stage& stage) {
    const std::size_t es = size_of(in.type);
    auto* base = static_cast<std::byte*>(out.data);
    if (in.data != base + before * es && in.count != 0) stage.copy(base + before * es, in.data, in.bytes());
    staged_ring_allgather(comm, stage, base, es, chunk_layout::of_counts(counts), comm.options().ring_segment_bytes);
  });
}

template <communicator C> void staged_broadcast(C& comm, buffer_view v, int root) {
  run_staged(comm, v.device.index, [&](cuda::stream_stage& stage) {
    staged_chain_broadcast(comm, stage, static_cast<std::byte*>(v.data), v.bytes(), root,
                           comm.options().ring_segment_bytes);
  });
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
HERD_SEPARATE void require_native_op(call_check& check, dtype type, reduce_op op);

// Runs a native reduction, reduce(op) (an allreduce or a reduce-scatter into `out`), and with
// host_sync waits for it. herd's avg is the sum divided by the ranks, on every path: NCCL's sum
// followed by herd's division kernel. NCCL's own ncclAvg scales each rank's values by 1/n before
// the sum, in the element type, which rounds differently in f16 and bf16 (and at 3 ranks even in
// f32); it is used only where herd's kernel is not compiled in (a host-compiled file linking
// herd::nccl), for floats, as docs/gpus.md says. Integer avg needs the kernel (require_native_op).
template <communicator C, class Reduce>
void native_reduction(C& comm, buffer_view out, reduce_op op, bool host_sync, Reduce reduce) {
  const bool divide_after = op == reduce_op::avg && (HERD_WITH_CUDA_KERNELS || is_integral(out.type));
  reduce(divide_after ? reduce_op::sum : op);
#if HERD_WITH_CUDA_KERNELS
  if (divide_after) cuda::finalize_avg(out.type, out.data, out.count, comm.size(), stream_of(comm));
#endif
  if (host_sync) comm.synchronize();
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void require_native_op(call_check& check, dtype type, reduce_op op) {
  if (check.ok() && !HERD_WITH_CUDA_KERNELS && op == reduce_op::avg && is_integral(type)) {
    check.fail(12, "avg on integer tensors over NCCL needs herd's division kernel",
               "Compile this translation unit with nvcc, or reduce with sum and divide yourself");
  }
  if (check.ok() && is_bitwise(op)) {
    check.fail(12, "NCCL has no bitwise reductions", "Use sum, prod, min, max or avg on GPU tensors");
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_DISPATCH_HPP
