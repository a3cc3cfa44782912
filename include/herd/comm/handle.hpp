#ifndef HERD_COMM_HANDLE_HPP
#define HERD_COMM_HANDLE_HPP
// herd::handle: an operation started by an _async collective.
//
//   herd::handle h = herd::allreduce_async(grad, comm, herd::reduce_op::avg);
//   ... compute ...
//   h.wait();   // the result is in grad; rethrows the operation's error
//
// Operations of one communicator run one at a time, in the order they were started, which must be
// the same on every rank. On host memory they make progress on the communicator's progress
// thread (comm_options::progress_thread, HERD_PROGRESS_THREAD), or, without one, inside wait()
// and test(). The tensors must stay alive and untouched until the operation completes. A handle
// destroyed before then waits for it, so memory in flight is never freed under MPI, and warns of
// its failure on stderr, unless it is dropped by an exception or the failure aborted the
// communicator and a later call of that communicator reports the abort.
//
// On an nccl_communicator an operation is stream-ordered: it is enqueued after the work already on
// the caller's stream, and wait() makes that stream wait for it (no host synchronization);
// synchronize() waits on the host.

#include <herd/comm/detail/operation_state.hpp>

#include <cstdio>
#include <exception>
#include <memory>
#include <utility>

namespace herd {

namespace detail {
// An operation whose completion a device (a CUDA stream) reports.
class device_completion {
 public:
  virtual ~device_completion() = default;
  virtual bool test() = 0;         // finished on the device
  virtual void wait() = 0;         // the caller's stream waits for it
  virtual void synchronize() = 0;  // the host waits for it
};
}  // namespace detail

class handle {
 public:
  handle() = default;
  handle(detail::operation_state* owner, std::shared_ptr<detail::queued_operation> op)
      : owner_(owner), op_(std::move(op)) {}
  explicit handle(std::shared_ptr<detail::device_completion> device) : device_(std::move(device)) {}

  handle(handle&& other) noexcept = default;
  handle& operator=(handle&& other) noexcept {
    if (this != &other) {
      settle();
      owner_ = other.owner_;
      op_ = std::move(other.op_);
      device_ = std::move(other.device_);
      waited_ = other.waited_;
    }
    return *this;
  }
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle() { settle(); }

  // Whether this handle refers to an operation.
  bool valid() const noexcept { return op_ != nullptr || device_ != nullptr; }

  // Waits for the operation and rethrows its error (every time it is called).
  void wait() {
    waited_ = true;
    if (op_) finish();
    if (device_) device_->wait();
  }

  // The host waits for the operation (for host operations the same as wait()).
  void synchronize() {
    waited_ = true;
    if (op_) finish();
    if (device_) device_->synchronize();
  }

  // Whether the operation has completed (then wait() returns at once). Without a progress thread
  // it first runs the queued operations up to this one, which waits for the other ranks.
  bool test() {
    if (op_) return op_->done.load(std::memory_order_acquire) || owner_->test(*op_);
    if (device_) return device_->test();
    return true;
  }

 private:
  // A finished operation never touches its communicator, which may be gone by now (its
  // destruction waited for this operation). `heard`: the failure goes on to a caller.
  void finish(bool heard = true) {
    if (!op_->done.load(std::memory_order_acquire)) owner_->wait(*op_, heard);
    if (op_->failure) {
      if (heard && op_->failure_repeats) op_->news->hear();
      std::rethrow_exception(op_->failure);
    }
  }

  // Nobody is left to catch the operation's failure, so it is told on stderr, unless someone hears
  // of it anyway: a handle dropped while an exception unwinds the stack (a failed step, which
  // run_elastic rolls back: the exception on its way is the failure, or its cause), or a failure
  // that aborted the communicator, whose later calls report the abort again (abort_news: if none
  // does before the communicator is gone, stderr is told then).
  void settle() noexcept {
    if (waited_ || !valid()) return;
    const bool unwinding = std::uncaught_exceptions() > 0;
    waited_ = true;
    try {
      if (op_) finish(unwinding);
      if (device_) device_->synchronize();
    } catch (const std::exception& e) {
      dropped(unwinding, e.what());
    } catch (...) {
      dropped(unwinding, "an exception that is not a std::exception");
    }
  }

  void dropped(bool unwinding, const char* what) noexcept {
    if (unwinding) return;
    if (op_ && op_->failure_repeats) {
      op_->news->drop(what);
    } else {
      std::fprintf(stderr, "herd warning: an operation whose handle was dropped without wait() failed: %s\n", what);
    }
  }

  detail::operation_state* owner_ = nullptr;
  std::shared_ptr<detail::queued_operation> op_;
  std::shared_ptr<detail::device_completion> device_;
  bool waited_ = false;
};

}  // namespace herd

#endif  // HERD_COMM_HANDLE_HPP
