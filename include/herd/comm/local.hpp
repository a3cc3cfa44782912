#pragma once
// herd::local_communicator: N ranks as threads of one process, passing messages through shared
// memory. For tests, and for single-node programs that want data parallelism without MPI.
//
//   herd::local::run(4, [](herd::local_communicator& comm) { ... });
//
// Waiting ranks block on a condition variable rather than spinning. If fn throws on any rank,
// every other rank's pending or later wait fails with herd::error, and run() rethrows the first
// exception once all threads have finished.

#include <herd/comm/communicator.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace herd {
namespace detail::local {

// One isend or irecv.
struct operation {
  const void* send_data = nullptr;
  void* receive_data = nullptr;
  std::size_t bytes = 0;
  int owner = 0;  // the rank that posted it
  int peer = 0;
  int tag = 0;
  bool receiving = false;
  bool done = false;   // guarded by the owner's waiter mutex
  std::string failure;  // written before done
};
using operation_ptr = std::shared_ptr<operation>;

// Unmatched messages addressed to one rank, and that rank's unmatched receives.
struct mailbox {
  std::mutex mutex;
  std::deque<operation_ptr> sends;
  std::deque<operation_ptr> receives;
};

struct waiter {
  std::mutex mutex;
  std::condition_variable wake;
};

class world {
 public:
  explicit world(int size) : size_(size), boxes_(static_cast<std::size_t>(size)), waiters_(static_cast<std::size_t>(size)),
                             splits_(static_cast<std::size_t>(size), 0) {}

  int size() const noexcept { return size_; }
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  std::string abort_reason() {
    std::lock_guard lock(registry_mutex_);
    return abort_reason_;
  }

  // Wakes every waiting rank of this world and of the worlds split from it.
  void abort(const std::string& reason) {
    std::vector<std::shared_ptr<world>> children;
    {
      // Under the registry lock, so that a world split from this one right now sees the flag.
      std::lock_guard lock(registry_mutex_);
      if (abort_reason_.empty()) abort_reason_ = reason;
      aborted_.store(true, std::memory_order_release);
      for (auto& weak : children_)
        if (auto child = weak.lock()) children.push_back(std::move(child));
    }
    for (auto& w : waiters_) {
      { std::lock_guard lock(w.mutex); }
      w.wake.notify_all();
    }
    for (auto& child : children) child->abort(reason);
  }

  // Posts an operation, completing it (and its partner) at once if its partner is already waiting.
  void post(const operation_ptr& op) {
    mailbox& box = boxes_[static_cast<std::size_t>(op->receiving ? op->owner : op->peer)];
    operation_ptr partner;
    {
      std::lock_guard lock(box.mutex);
      auto& partners = op->receiving ? box.sends : box.receives;
      auto& mine = op->receiving ? box.receives : box.sends;
      // A receive matches the oldest send from its peer; a send, the oldest receive expecting it.
      auto match = std::find_if(partners.begin(), partners.end(), [&](const operation_ptr& other) {
        return other->tag == op->tag && (op->receiving ? other->owner == op->peer : other->peer == op->owner);
      });
      if (match == partners.end()) {
        mine.push_back(op);
        return;
      }
      partner = *match;
      partners.erase(match);
      transfer(op->receiving ? *partner : *op, op->receiving ? *op : *partner);
    }
    complete(*partner);
    complete(*op);
  }

  // Takes back an operation nobody matched yet; true if it was still unmatched.
  bool withdraw(const operation_ptr& op) {
    mailbox& box = boxes_[static_cast<std::size_t>(op->receiving ? op->owner : op->peer)];
    std::lock_guard lock(box.mutex);
    auto& mine = op->receiving ? box.receives : box.sends;
    auto it = std::find(mine.begin(), mine.end(), op);
    if (it == mine.end()) return false;
    mine.erase(it);
    return true;
  }

  waiter& waiter_of(int rank) noexcept { return waiters_[static_cast<std::size_t>(rank)]; }

  // The world that ranks of this one calling their n-th split with `color` share. Every member
  // calls it once; the first creates it.
  std::shared_ptr<world> split_world(int rank, int color, int members) {
    std::lock_guard lock(registry_mutex_);
    const auto key = std::make_pair(splits_[static_cast<std::size_t>(rank)]++, color);
    auto& entry = pending_splits_[key];
    if (!entry.first) {
      entry.first = std::make_shared<world>(members);
      entry.second = members;
      children_.push_back(entry.first);
      if (aborted()) entry.first->abort(abort_reason_);
    }
    auto result = entry.first;
    if (--entry.second == 0) pending_splits_.erase(key);
    return result;
  }

 private:
  static void transfer(operation& send, operation& receive) {
    if (send.bytes > receive.bytes) {
      const std::string what = "a message of " + std::to_string(send.bytes) + " bytes from rank " +
                               std::to_string(send.owner) + " does not fit the " + std::to_string(receive.bytes) +
                               "-byte receive buffer of rank " + std::to_string(receive.owner);
      send.failure = what;
      receive.failure = what;
      return;
    }
    if (send.bytes != 0) std::memcpy(receive.receive_data, send.send_data, send.bytes);
  }

  void complete(operation& op) {
    waiter& w = waiter_of(op.owner);
    {
      std::lock_guard lock(w.mutex);
      op.done = true;
    }
    w.wake.notify_all();
  }

  int size_;
  std::deque<mailbox> boxes_;  // deque: mutexes neither copy nor move
  std::deque<waiter> waiters_;
  std::atomic<bool> aborted_{false};
  std::mutex registry_mutex_;
  std::string abort_reason_;
  std::vector<int> splits_;
  std::map<std::pair<int, int>, std::pair<std::shared_ptr<world>, int>> pending_splits_;
  std::vector<std::weak_ptr<world>> children_;
};

}  // namespace detail::local

class local_communicator {
 public:
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        world_ = std::move(other.world_);
        op_ = std::move(other.op_);
      }
      return *this;
    }
    ~request() { release(); }

    bool pending() const noexcept { return op_ != nullptr; }

   private:
    friend class local_communicator;
    // A receive abandoned before it matched must never be written into later.
    void release() noexcept {
      if (op_) world_->withdraw(op_);
      op_.reset();
    }
    std::shared_ptr<detail::local::world> world_;
    detail::local::operation_ptr op_;
  };

  local_communicator(std::shared_ptr<detail::local::world> w, int rank, comm_options options = {})
      : world_(std::move(w)), rank_(rank), options_(options) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_->size(); }
  const comm_options& options() const noexcept { return options_; }
  bool supports(device d) const noexcept { return d.is_cpu(); }

  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    detail::check_buffer("isend", rank_, size(), data, bytes);
    auto op = make_operation(bytes, peer, tag, false);
    op->send_data = data;
    return start(std::move(op));
  }

  request irecv(void* data, std::size_t bytes, int peer, int tag) {
    detail::check_buffer("irecv", rank_, size(), data, bytes);
    auto op = make_operation(bytes, peer, tag, true);
    op->receive_data = data;
    return start(std::move(op));
  }

  bool test(request& r) {
    if (!r.pending()) return true;
    {
      std::lock_guard lock(world_->waiter_of(rank_).mutex);
      if (!r.op_->done) {
        if (world_->aborted()) fail_aborted();
        return false;
      }
    }
    finish(r);
    return true;
  }

  void wait(request& r) {
    if (!r.pending()) return;
    {
      detail::local::waiter& w = world_->waiter_of(rank_);
      detail::stall_watch watch(options_);
      std::unique_lock lock(w.mutex);
      while (!r.op_->done) {
        if (world_->aborted()) {
          lock.unlock();
          fail_aborted();
        }
        if (w.wake.wait_for(lock, std::chrono::milliseconds(250)) == std::cv_status::timeout) {
          lock.unlock();
          watch.check(rank_, size(), r.op_->peer, r.op_->receiving, r.op_->tag);
          lock.lock();
        }
      }
    }
    finish(r);
  }

  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    request rr = irecv(receive, receive_bytes, source, tag);
    request sr = isend(send, send_bytes, destination, tag);
    wait(rr);
    wait(sr);
  }

  // Dissemination barrier: ceil(log2 size) rounds of empty messages.
  void barrier() {
    const int n = size();
    for (int distance = 1; distance < n; distance *= 2) {
      sendrecv(nullptr, 0, (rank_ + distance) % n, nullptr, 0, (rank_ - distance + n) % n,
               detail::tag_value(detail::tag::barrier));
    }
  }

  local_communicator split(int color, int key) const {
    if (color < 0) {
      detail::raise({"split", rank_, size()}, "color " + std::to_string(color) + " is negative",
                    "Pass a color >= 0; ranks with equal colors end up in the same communicator");
    }
    // Every rank learns every (color, key), then the members of each color agree on one world.
    auto& self = const_cast<local_communicator&>(*this);
    const int n = size();
    std::vector<int> pairs(2 * static_cast<std::size_t>(n));
    const int mine[2] = {color, key};
    std::vector<request> pending;
    for (int peer = 0; peer < n; ++peer) {
      pending.push_back(self.irecv(&pairs[2 * static_cast<std::size_t>(peer)], sizeof mine, peer,
                                   detail::tag_value(detail::tag::split)));
      pending.push_back(self.isend(mine, sizeof mine, peer, detail::tag_value(detail::tag::split)));
    }
    for (auto& r : pending) self.wait(r);
    std::vector<int> members;
    for (int peer = 0; peer < n; ++peer)
      if (pairs[2 * static_cast<std::size_t>(peer)] == color) members.push_back(peer);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return pairs[2 * static_cast<std::size_t>(a) + 1] < pairs[2 * static_cast<std::size_t>(b) + 1];
    });
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    return local_communicator(world_->split_world(rank_, color, static_cast<int>(members.size())), new_rank,
                              options_);
  }

 private:
  detail::local::operation_ptr make_operation(std::size_t bytes, int peer, int tag, bool receiving) const {
    detail::check_peer(receiving ? "irecv" : "isend", rank_, size(), peer);
    if (world_->aborted()) fail_aborted();
    auto op = std::make_shared<detail::local::operation>();
    op->bytes = bytes;
    op->owner = rank_;
    op->peer = peer;
    op->tag = tag;
    op->receiving = receiving;
    return op;
  }

  request start(detail::local::operation_ptr op) {
    world_->post(op);
    request r;
    r.world_ = world_;
    r.op_ = std::move(op);
    return r;
  }

  void finish(request& r) {
    auto op = std::move(r.op_);
    if (!op->failure.empty()) {
      detail::raise({op->receiving ? "irecv" : "isend", rank_, size()}, op->failure,
                    "Post receive buffers at least as large as the messages sent to them");
    }
  }

  [[noreturn]] void fail_aborted() const {
    detail::raise({"local_communicator", rank_, size()}, "stopped because " + world_->abort_reason(),
                  "See the first exception, which local::run rethrows");
  }

  std::shared_ptr<detail::local::world> world_;
  int rank_ = 0;
  comm_options options_;
};

namespace local {

// Runs fn(local_communicator&) on n threads, one per rank, and returns when all have finished.
// The first exception thrown on any rank is rethrown here; the others ranks are released from
// their waits with herd::error so that none is left blocked.
template <class Fn> void run(int n, Fn&& fn, comm_options options = {}) {
  if (n < 1) {
    throw error("herd::local::run: the number of ranks is " + std::to_string(n) + ". Ask for at least 1.");
  }
  auto w = std::make_shared<detail::local::world>(n);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(n));
  std::atomic<int> first_failure{-1};
  auto body = [&](int rank) {
    try {
      local_communicator comm(w, rank, options);
      fn(comm);
    } catch (...) {
      failures[static_cast<std::size_t>(rank)] = std::current_exception();
      int none = -1;
      if (first_failure.compare_exchange_strong(none, rank)) {
        std::string what = "rank " + std::to_string(rank) + " failed";
        try {
          throw;
        } catch (const std::exception& e) {
          what += ": ";
          what += e.what();
        } catch (...) {
        }
        w->abort(what);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  try {
    for (int rank = 1; rank < n; ++rank) threads.emplace_back(body, rank);
  } catch (...) {
    w->abort("local::run could not start a thread");
    for (auto& t : threads) t.join();
    throw;
  }
  body(0);  // rank 0 runs on the calling thread
  for (auto& t : threads) t.join();
  if (first_failure >= 0) std::rethrow_exception(failures[static_cast<std::size_t>(first_failure.load())]);
}

}  // namespace local
}  // namespace herd
