#ifndef HERD_CUDA_STAGING_HPP
#define HERD_CUDA_STAGING_HPP
// The device side of herd's staged collectives (collectives/detail/staged_ring.hpp) on two CUDA
// streams of herd's own, one per direction over the link: copies from the device to page-locked
// host memory on the outbound stream; copies to the device, herd's reduce kernel and device
// copies on the inbound one, so that a segment goes out while another comes in (PCIe moves both
// ways at once). Events are the markers, and each cross-stream ordering the algorithm asks for is
// an event wait. One per device and thread, so that its buffers (the staging slots, of a size
// bounded by the segment) are reused.

#include <herd/core/config.hpp>
#include <herd/cuda/kernels.hpp>
#include <herd/cuda/runtime.hpp>

#if defined(__CUDACC__)
#include <map>
#include <memory>
#include <vector>

namespace herd::cuda {
HERD_CONFIG_NAMESPACE_BEGIN

class stream_stage {
 public:
  using marker = std::size_t;

  explicit stream_stage(int device) : device_(device), outbound_(on_device(device)), inbound_(on_device(device)) {}

  // Orders this stage after the work already queued on the caller's stream (current_stream()).
  // `direct`: the communicator moves device memory itself (a CUDA-aware MPI), so the "host"
  // buffers it sends from and receives into are device memory, filled by device-to-device copies.
  void begin(bool direct = false) {
    direct_ = direct;
    used_ = 0;
    const cudaStream_t caller = current_stream();  // the caller's stream may be another device's
    order_.after(outbound_.get(), caller);
    order_.after(inbound_.get(), caller);
  }

  // Outbound: device to host.
  void to_host(void* host, const void* device, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, direct_ ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost,
                                    outbound_.get()));
  }
  // Inbound: host to device, and the work on the device.
  void to_device(void* device, const void* host, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, direct_ ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                                    inbound_.get()));
  }
  void copy(void* to, const void* from, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, inbound_.get()));
  }
  template <class = void>  // a template, as cuda::reduce: no kernel is compiled unless it is called
  void reduce(dtype type, reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg_ranks) {
    cuda::reduce(type, op, out, a, b, n, avg_ranks, inbound_.get());
  }

  // A marker after the work queued so far in one direction, and a wait of the other direction's
  // later work for it.
  marker mark_outbound() { return mark(outbound_.get()); }
  marker mark_inbound() { return mark(inbound_.get()); }
  void outbound_after(marker m) { HERD_CUDA_CHECK(cudaStreamWaitEvent(outbound_.get(), events_[m].get(), 0)); }
  void inbound_after(marker m) { HERD_CUDA_CHECK(cudaStreamWaitEvent(inbound_.get(), events_[m].get(), 0)); }
  bool done(marker m) const { return events_[m].done(); }
  void wait(marker m) const { events_[m].synchronize(); }
  void finish() {
    outbound_.synchronize();
    inbound_.synchronize();
  }

  std::byte* host_buffer(std::size_t bytes, int which) {
    return static_cast<std::byte*>(direct_ ? on_device_[which].get(bytes) : pinned_[which].get(bytes));
  }
  std::byte* device_buffer(std::size_t bytes) { return static_cast<std::byte*>(scratch_.get(bytes)); }
  int device() const noexcept { return device_; }

 private:
  static cuda::stream on_device(int device) {
    const device_guard on(device);
    return cuda::stream();
  }

  marker mark(cudaStream_t on) {
    const device_guard here(device_);  // an event is made and recorded on its stream's device
    if (used_ == events_.size()) events_.emplace_back();
    events_[used_].record(on);
    return used_++;
  }

  int device_;
  cuda::stream outbound_;
  cuda::stream inbound_;
  cuda::stream_order order_;
  std::vector<cuda::event> events_;
  std::size_t used_ = 0;
  bool direct_ = false;
  cuda::pinned_buffer pinned_[2];
  cuda::device_buffer on_device_[2];
  cuda::device_buffer scratch_;
};

// This thread's stage for `device` (made current by the caller).
inline stream_stage& stage_for(int device) {
  thread_local std::map<int, std::unique_ptr<stream_stage>> stages;
  auto& slot = stages[device];
  if (!slot) slot = std::make_unique<stream_stage>(device);
  return *slot;
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::cuda
#endif

#endif  // HERD_CUDA_STAGING_HPP
