#pragma once
// A stand-in for the two GPU streams of herd's staged collectives (one per direction over the
// link): each queue's operations run in order on a worker thread of its own, after seeded random
// delays, over ordinary host memory; a queue waits for a marker of the other only where told to.
// Code that forgets to wait for a copy before using its result, or to order one queue after the
// other where the data needs it, reads stale data here too, and the tests see it.

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
  struct marker {
    std::size_t queue = 0;   // outbound 0, inbound 1
    std::size_t before = 0;  // that queue's operations enqueued before it
  };

  // `each`: a time every operation takes at least, for a device slower than the host.
  explicit emulated_device(std::uint64_t seed, std::chrono::microseconds each = {})
      : each_(each), queues_{queue{rng(seed)}, queue{rng(seed ^ 0x9e3779b97f4a7c15ull)}} {
    for (std::size_t q = 0; q < 2; ++q) workers_[q] = std::thread([this, q] { run(queues_[q]); });
  }
  emulated_device(const emulated_device&) = delete;
  emulated_device& operator=(const emulated_device&) = delete;
  ~emulated_device() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void to_host(void* host, const void* device, std::size_t bytes) { enqueue(0, [=] { std::memcpy(host, device, bytes); }); }
  void to_device(void* device, const void* host, std::size_t bytes) { copy(device, host, bytes); }
  void copy(void* to, const void* from, std::size_t bytes) {
    enqueue(1, [=] { std::memcpy(to, from, bytes); });
  }
  void reduce(herd::dtype type, herd::reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg) {
    enqueue(1, [=] { herd::detail::host_reduce(type, op, out, a, b, n, avg); });
  }

  marker mark_outbound() { return mark(0); }
  marker mark_inbound() { return mark(1); }
  void outbound_after(marker m) { after(0, m); }
  void inbound_after(marker m) { after(1, m); }
  bool done(marker m) {
    std::lock_guard lock(mutex_);
    return queues_[m.queue].completed >= m.before;
  }
  void wait(marker m) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return queues_[m.queue].completed >= m.before; });
  }
  void finish() {
    wait(mark_outbound());
    wait(mark_inbound());
  }

  std::byte* host_buffer(std::size_t bytes, int which) { return grow(host_.at(static_cast<std::size_t>(which)), bytes); }
  std::byte* device_buffer(std::size_t bytes) { return grow(device_, bytes); }

  // The staging memory it was asked for, in all (page-locked host, device).
  std::size_t host_bytes() const { return host_[0].size() + host_[1].size(); }
  std::size_t device_bytes() const { return device_.size(); }

 private:
  struct queue {
    rng delays;
    std::deque<std::function<void()>> work{};
    std::size_t enqueued = 0;
    std::size_t completed = 0;
  };

  static std::byte* grow(std::vector<std::byte>& v, std::size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }

  marker mark(std::size_t q) {
    std::lock_guard lock(mutex_);
    return {q, queues_[q].enqueued};
  }
  // Queue q's next operation waits until m's work is done (a stream waiting on an event).
  void after(std::size_t q, marker m) {
    enqueue(q, [this, m] {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return queues_[m.queue].completed >= m.before; });
    });
  }

  void enqueue(std::size_t q, std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queues_[q].work.push_back(std::move(work));
      ++queues_[q].enqueued;
    }
    changed_.notify_all();
  }

  void run(queue& q) {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !q.work.empty(); });
        if (q.work.empty()) return;
        work = std::move(q.work.front());
        q.work.pop_front();
      }
      if (q.delays.below(4) == 0) std::this_thread::sleep_for(std::chrono::microseconds(q.delays.below(200)));
      if (each_.count() > 0) std::this_thread::sleep_for(each_);
      work();
      {
        std::lock_guard lock(mutex_);
        ++q.completed;
      }
      changed_.notify_all();
    }
  }

  std::chrono::microseconds each_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::array<queue, 2> queues_;
  bool stopping_ = false;
  std::array<std::vector<std::byte>, 2> host_;
  std::vector<std::byte> device_;
  std::array<std::thread, 2> workers_;
};

}  // namespace herd_test
