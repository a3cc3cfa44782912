#pragma once
// A stand-in for a GPU stream, for testing code that drives one: operations run in order on a
// worker thread, after seeded random delays, over ordinary host memory. Code that forgets to wait
// for a copy before using its result reads stale data here too, and the tests see it.

#include <herd/collectives/detail/host_reduce.hpp>

#include "reference.hpp"

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace herd_test {

class emulated_device {
 public:
  using marker = std::size_t;  // operations enqueued before it

  // `each`: a time every operation takes at least, for a device slower than the host.
  explicit emulated_device(std::uint64_t seed, std::chrono::microseconds each = {})
      : delays_(seed), each_(each), worker_([this] { run(); }) {}
  emulated_device(const emulated_device&) = delete;
  emulated_device& operator=(const emulated_device&) = delete;
  ~emulated_device() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  void to_host(void* host, const void* device, std::size_t bytes) { copy(host, device, bytes); }
  void to_device(void* device, const void* host, std::size_t bytes) { copy(device, host, bytes); }
  void copy(void* to, const void* from, std::size_t bytes) {
    enqueue([=] { std::memcpy(to, from, bytes); });
  }
  void reduce(herd::dtype type, herd::reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg) {
    enqueue([=] { herd::detail::host_reduce(type, op, out, a, b, n, avg); });
  }

  marker mark() {
    std::lock_guard lock(mutex_);
    return enqueued_;
  }
  bool done(marker m) {
    std::lock_guard lock(mutex_);
    return completed_ >= m;
  }
  void wait(marker m) {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [&] { return completed_ >= m; });
  }
  void finish() { wait(mark()); }

  std::byte* host_buffer(std::size_t bytes, int which) { return grow(host_.at(static_cast<std::size_t>(which)), bytes); }
  std::byte* device_buffer(std::size_t bytes) { return grow(device_, bytes); }

  // The staging memory it was asked for, in all (page-locked host, device).
  std::size_t host_bytes() const { return host_[0].size() + host_[1].size(); }
  std::size_t device_bytes() const { return device_.size(); }

 private:
  static std::byte* grow(std::vector<std::byte>& v, std::size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

  void enqueue(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    wake_.notify_all();
  }

  void run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      if (delays_.below(4) == 0) std::this_thread::sleep_for(std::chrono::microseconds(delays_.below(200)));
      if (each_.count() > 0) std::this_thread::sleep_for(each_);
      work();
      {
        std::lock_guard lock(mutex_);
        ++completed_;
      }
      idle_.notify_all();
    }
  }

  rng delays_;
  std::chrono::microseconds each_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  std::size_t enqueued_ = 0;
  std::size_t completed_ = 0;
  bool stopping_ = false;
  std::array<std::vector<std::byte>, 2> host_;
  std::vector<std::byte> device_;
  std::thread worker_;
};

}  // namespace herd_test
