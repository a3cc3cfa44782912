#ifndef HERD_CUDA_STAGING_HPP
#define HERD_CUDA_STAGING_HPP
// The device side of herd's staged collectives (collectives/detail/staged_ring.hpp) on a CUDA
// stream of herd's own: copies between device and page-locked host memory, herd's reduce kernel,
// and events as markers. One per device and thread, so that its buffers (the staging slots, of a
// size bounded by the segment) are reused.

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

  explicit stream_stage(int device) : device_(device), stream_(on_device(device)) {}

  // Orders this stage after the work already queued on the caller's stream (current_stream()).
  // `direct`: the communicator moves device memory itself (a CUDA-aware MPI), so the "host"
  // buffers it sends from and receives into are device memory, filled by device-to-device copies.
  void begin(bool direct = false) {
    direct_ = direct;
    used_ = 0;
    order_.after(stream_.get(), current_stream());  // the caller's stream may be another device's
  }

  void to_host(void* host, const void* device, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, direct_ ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost,
                                    stream_.get()));
  }
  void to_device(void* device, const void* host, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, direct_ ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                                    stream_.get()));
  }
  void copy(void* to, const void* from, std::size_t bytes) {
    HERD_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_.get()));
  }
  template <class = void>  // a template, as cuda::reduce: no kernel is compiled unless it is called
  void reduce(dtype type, reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg_ranks) {
    cuda::reduce(type, op, out, a, b, n, avg_ranks, stream_.get());
  }

  marker mark() {
    const device_guard on(device_);  // an event is made and recorded on its stream's device
    if (used_ == events_.size()) events_.emplace_back();
    events_[used_].record(stream_.get());
    return used_++;
  }
  bool done(marker m) const { return events_[m].done(); }
  void wait(marker m) const { events_[m].synchronize(); }
  void finish() { stream_.synchronize(); }

  std::byte* host_buffer(std::size_t bytes, int which) {
    return static_cast<std::byte*>(direct_ ? on_device_[which].get(bytes) : pinned_[which].get(bytes));
  }
  std::byte* device_buffer(std::size_t bytes) { return static_cast<std::byte*>(scratch_.get(bytes)); }
  cudaStream_t stream() const noexcept { return stream_.get(); }
  int device() const noexcept { return device_; }

 private:
  static cuda::stream on_device(int device) {
    const device_guard on(device);
    return cuda::stream();
  }

  int device_;
  cuda::stream stream_;
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
