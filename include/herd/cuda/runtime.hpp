#ifndef HERD_CUDA_RUNTIME_HPP
#define HERD_CUDA_RUNTIME_HPP
// Owning handles for the CUDA objects herd uses: the current device, streams, events, and
// grow-only device and pinned host buffers; and the caller's stream, which herd's GPU work follows.

#include <herd/cuda/error.hpp>

#if defined(__CUDACC__) || defined(HERD_WITH_NCCL)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace herd::cuda {

namespace detail {
inline cudaStream_t& caller_stream_slot() noexcept {
  thread_local cudaStream_t stream = nullptr;
  return stream;
}
}  // namespace detail

// The stream whose work herd's GPU work on this thread waits for (the tensors' producers) and
// that waits for herd's asynchronous work (handle::wait): the one a use_stream scope names, else
// the default stream (0: the legacy one, or the per-thread one when compiled with
// --default-stream per-thread). herd orders itself after it with an event, never by
// synchronizing the device, so producers on non-blocking streams are waited for too.
inline cudaStream_t current_stream() noexcept { return detail::caller_stream_slot(); }

// For its lifetime, herd's GPU work on this thread follows `stream`: the stream your framework
// computes on, as a CUDAStreamGuard sets libtorch's. Collectives started _async inside the scope
// keep following it when they run later on another thread.
//
//   herd::cuda::use_stream on(my_stream);
//   herd::allreduce(grad, comm);   // reads grad after the work queued on my_stream
class use_stream {
 public:
  explicit use_stream(cudaStream_t stream) noexcept : previous_(std::exchange(detail::caller_stream_slot(), stream)) {}
  use_stream(const use_stream&) = delete;
  use_stream& operator=(const use_stream&) = delete;
  ~use_stream() { detail::caller_stream_slot() = previous_; }

 private:
  cudaStream_t previous_;
};

// Makes `device` current for its lifetime and restores the previous one after.
class device_guard {
 public:
  explicit device_guard(int device) {
    HERD_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) {
      HERD_CUDA_CHECK(cudaSetDevice(device));
      changed_ = true;
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (changed_) cudaSetDevice(previous_);  // every launch takes a guard: no call when nothing changed
  }

 private:
  int previous_ = 0;
  bool changed_ = false;
};

class stream {
 public:
  stream() { HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream(stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  ~stream() {
    if (handle_) cudaStreamDestroy(handle_);
  }
  cudaStream_t get() const noexcept { return handle_; }
  void synchronize() const { HERD_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

 private:
  cudaStream_t handle_ = nullptr;
};

class event {
 public:
  event() { HERD_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, cudaEventDisableTiming)); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  ~event() {
    if (handle_) cudaEventDestroy(handle_);
  }
  cudaEvent_t get() const noexcept { return handle_; }
  void record(cudaStream_t s) { HERD_CUDA_CHECK(cudaEventRecord(handle_, s)); }
  bool done() const {
    const cudaError_t state = cudaEventQuery(handle_);
    if (state == cudaErrorNotReady) return false;
    HERD_CUDA_CHECK(state);
    return true;
  }
  void synchronize() const { HERD_CUDA_CHECK(cudaEventSynchronize(handle_)); }

 private:
  cudaEvent_t handle_ = nullptr;
};

// Device memory that only grows; what it held is lost when it grows.
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (data_) cudaFree(data_);
  }
  void* get(std::size_t bytes) {
    if (bytes > capacity_) {
      if (data_) HERD_CUDA_CHECK(cudaFree(data_));
      data_ = nullptr;
      capacity_ = 0;
      HERD_CUDA_CHECK(cudaMalloc(&data_, bytes));
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// Page-locked host memory that only grows: the staging area of copies that overlap with compute.
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (data_) cudaFreeHost(data_);
  }
  void* get(std::size_t bytes) {
    if (bytes > capacity_) {
      if (data_) HERD_CUDA_CHECK(cudaFreeHost(data_));
      data_ = nullptr;
      capacity_ = 0;
      HERD_CUDA_CHECK(cudaMallocHost(&data_, bytes));
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// The device `s` belongs to (for the default stream, the current device): work launched on a
// stream, and events recorded on it, must be made while its device is current.
inline int device_of(cudaStream_t s) {
  int device = 0;
  HERD_CUDA_CHECK(cudaStreamGetDevice(s, &device));
  return device;
}

// Makes streams wait for the work queued so far on other streams, which may belong to other
// devices: the event is recorded on the upstream stream's device (an event recorded on a stream
// of another device fails), and a stream of any device may wait for it.
class stream_order {
 public:
  void after(cudaStream_t waiter, cudaStream_t upstream) {
    const int device = device_of(upstream);
    const device_guard on(device);
    event* marker = nullptr;
    for (auto& [d, e] : events_) {
      if (d == device) marker = &e;
    }
    if (marker == nullptr) marker = &events_.emplace_back(device, event()).second;
    marker->record(upstream);  // the wait takes the event as recorded now, so it may be reused
    HERD_CUDA_CHECK(cudaStreamWaitEvent(waiter, marker->get(), 0));
  }

 private:
  std::vector<std::pair<int, event>> events_;
};

// The number of streaming multiprocessors of `device`, which sizes kernel grids.
inline int multiprocessors(int device) {
  int count = 0;
  HERD_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace herd::cuda
#endif

#endif  // HERD_CUDA_RUNTIME_HPP
