#ifndef HERD_COMM_DETAIL_OPERATION_STATE_HPP
#define HERD_COMM_DETAIL_OPERATION_STATE_HPP
// What a communicator knows about its operations: their sequence numbers, the one running now
// (for the watchdog's messages and the data tag), whether the communicator was aborted and why,
// and the queue that runs operations in submission order (on the caller's thread, or on a
// progress thread for asynchronous ones).

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/runtime/env.hpp>
#include <herd/runtime/timeline.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace herd {

// A communicator's settings, fixed when it is created. The wire-protocol ones (ring segment,
// argument checking) must be the same on every rank: creating a communicator checks that they are.
struct comm_options {
  double stall_check_seconds = runtime::defaults().stall_check_seconds;        // warn after waiting this long (0: never)
  double stall_shutdown_seconds = runtime::defaults().stall_shutdown_seconds;  // raise after this long (0: never)
  std::size_t ring_segment_bytes = runtime::defaults().ring_segment_bytes;
  bool check_arguments = runtime::defaults().check_arguments;
  bool progress_thread = runtime::defaults().progress_thread;  // asynchronous operations on a thread of their own
  // mpi_communicator: how host tensors travel (HERD_ALLREDUCE_ALGORITHM), the slice of its
  // shared-memory pipeline (HERD_SHM_SLICE_BYTES), and, for tests and benchmarks only, nodes of
  // this many consecutive ranks instead of the real ones (HERD_SIMULATE_NODE_SIZE; 0: real).
  algorithm allreduce_algorithm = runtime::defaults().allreduce_algorithm;
  std::size_t shm_slice_bytes = runtime::defaults().shm_slice_bytes;
  int simulated_node_size = runtime::defaults().simulated_node_size;
  // Float allreduces with sum or avg give bits that depend on the ranks' values only: not on the
  // path, the node layout, bucket or piece splits, or which rank holds which value
  // (collectives/detail/reproducible.hpp; HERD_REPRODUCIBLE). Host tensors only.
  bool reproducible = runtime::defaults().reproducible;
  // mpi_communicator: when an abort cannot settle its sends within stall_shutdown_seconds (a peer
  // does not take them, and MPI cannot cancel a send), end the job with MPI_Abort (true), or raise
  // herd::error saying that those buffers still belong to MPI (false).
  bool end_job_if_unsettled = true;
};

// Tags at and above this value belong to herd; point-to-point calls of the user take tags in
// [0, reserved_tag_base). MPI guarantees tags up to 32767.
inline constexpr int reserved_tag_base = 1 << 14;

namespace detail {

// Every operation's agreement travels on one shared tag, so that ranks in different operations
// meet and see it; notices (abort, confirmation, departure) on another. The data messages of
// operation k carry a tag derived from k, so that they can never be matched by operation k+1.
inline constexpr int control_tag = reserved_tag_base;
inline constexpr int notice_tag = reserved_tag_base + 1;
inline constexpr int data_tag_base = reserved_tag_base + 2;
inline constexpr int data_tag_span = 32767 - data_tag_base + 1;
inline constexpr int data_tag(std::uint64_t seq) noexcept {
  return data_tag_base + static_cast<int>(seq % static_cast<std::uint64_t>(data_tag_span));
}

enum class op_kind : std::uint8_t {
  create,
  split,
  barrier,
  allreduce,
  broadcast,
  allgather,
  allgatherv,
  reduce_scatter,
  grouped_allreduce,
  alltoall,
  alltoallv,
  gather,
  gatherv,
  scatter,
  scatterv,
  reduce,
  subset,
};

constexpr const char* name(op_kind k) noexcept {
  switch (k) {
    case op_kind::create: return "communicator creation";
    case op_kind::split: return "split";
    case op_kind::barrier: return "barrier";
    case op_kind::allreduce: return "allreduce";
    case op_kind::broadcast: return "broadcast";
    case op_kind::allgather: return "allgather";
    case op_kind::allgatherv: return "allgatherv";
    case op_kind::reduce_scatter: return "reduce_scatter";
    case op_kind::grouped_allreduce: return "grouped allreduce";
    case op_kind::alltoall: return "alltoall";
    case op_kind::alltoallv: return "alltoallv";
    case op_kind::gather: return "gather";
    case op_kind::gatherv: return "gatherv";
    case op_kind::scatter: return "scatter";
    case op_kind::scatterv: return "scatterv";
    case op_kind::reduce: return "reduce";
    case op_kind::subset: return "subset";
  }
  return "operation";
}

// "4 MiB", "1.5 KiB", "12 B"
inline std::string byte_text(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, value == static_cast<double>(static_cast<std::uint64_t>(value)) ? "%.0f %s" : "%.3g %s",
                value, units[unit]);
  return text;
}

// An operation's name, given by its caller (herd::operation_name): at most 23 characters.
struct op_name {
  char text[24] = {};
  bool empty() const noexcept { return text[0] == '\0'; }
  // Names are zero-filled: comparing the bytes is comparing the names.
  bool operator==(const op_name& other) const noexcept { return std::memcmp(text, other.text, sizeof text) == 0; }
};

// The name the operations this thread issues now take (herd::operation_name sets it).
inline op_name& thread_op_name() noexcept {
  thread_local op_name current;
  return current;
}

// One operation, as messages name it: "allreduce #17 (4 MiB f32)", or with a name
// 'allreduce #17 "layer3.weight" (4 MiB f32)'.
struct op_label {
  op_kind kind = op_kind::barrier;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;  // elements, when typed
  dtype type = dtype::u8;
  bool typed = false;
  op_name name_{};  // empty unless the caller named it

  std::string str() const;
};

// Whether a failure that aborted a communicator reached a caller. A handle dropped unwaited
// leaves its failure to the communicator's later calls, which report the abort again; when none
// reported it by the time the communicator is gone, stderr is told instead. Shared by the
// communicator's operation state and its operations, since a handle may outlive both.
class abort_news {
 public:
  // A failure of the aborted communicator reached a caller (a wait rethrew it, a call raised).
  void hear() noexcept {
    std::lock_guard lock(mutex_);
    heard_ = true;
  }
  // A handle whose failure aborted the communicator was dropped unwaited.
  void drop(const char* what) noexcept {
    std::lock_guard lock(mutex_);
    if (heard_) return;
    if (closed_) {
      warn(what);
      return;
    }
    if (dropped_.empty()) {
      try {
        dropped_ = what;
      } catch (...) {
        warn(what);
      }
    }
  }
  // The communicator is gone: no later call can report what was dropped.
  void close() noexcept {
    std::lock_guard lock(mutex_);
    closed_ = true;
    if (!heard_ && !dropped_.empty()) warn(dropped_.c_str());
  }

 private:
  static void warn(const char* what) noexcept {
    std::fprintf(stderr,
                 "herd warning: an operation whose handle was dropped without wait() failed, and no later call of "
                 "its communicator reported it: %s\n",
                 what);
  }
  std::mutex mutex_;
  bool heard_ = false;
  bool closed_ = false;
  std::string dropped_;
};

// A queued operation: the work, and once it ran, whether it failed.
struct queued_operation {
  std::uint64_t seq = 0;
  std::function<void(std::uint64_t)> work;
  std::atomic<bool> done{false};
  std::exception_ptr failure;  // written before done
  // The failure aborted the communicator (or it was aborted before): its later calls report the
  // abort again, so a handle dropped unwaited tells `news` rather than warn. Written before done.
  bool failure_repeats = false;
  std::shared_ptr<abort_news> news;
};

// Until ready(), for at most `budget`: spinning, then yielding the core (with more threads than
// cores, the one being waited for may need it). True if ready. For the hand-over between a caller
// and its communicator's progress thread: the next operation usually comes, or the running one
// ends, microseconds after the other side looks, while waking from a sleep costs tens of them
// (about 25 us each way on the 2-core VM of benchmarks/RESULTS.md).
template <class Ready> bool spin_until(Ready ready, std::chrono::microseconds budget) {
  for (int i = 0; i < 64; ++i) {
    if (ready()) return true;
  }
  const auto until = std::chrono::steady_clock::now() + budget;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
    if (ready()) return true;
  }
  return ready();
}

// How long each side of that hand-over spins before it sleeps.
inline constexpr std::chrono::microseconds handoff_spin{200};

class operation_state {
 public:
  explicit operation_state(const comm_options& options);
  operation_state(const operation_state&) = delete;
  operation_state& operator=(const operation_state&) = delete;
  ~operation_state();

  const comm_options& options() const noexcept { return options_; }
  comm_options& options() noexcept { return options_; }

  // This communicator's track in the timeline (runtime/timeline.hpp), named at its first traced
  // operation.
  std::uint32_t track() const noexcept { return track_; }
  bool track_named() const noexcept { return track_named_; }
  void set_track_named() noexcept { track_named_ = true; }

  // --- The operation running now, as the thread running it sees it: another thread (the caller's,
  // while the progress thread runs an operation) is not inside it.
  bool in_operation() const noexcept { return running_here() == this; }
  const op_label& current() const noexcept { return current_; }
  int data_tag() const noexcept { return detail::data_tag(current_.seq); }
  // An operation may run one of another communicator inside it (the hierarchical allreduce runs
  // one across nodes): end() gives the thread back to the outer one.
  void begin(const op_label& label) noexcept {
    current_ = label;
    outer_ = running_here();
    running_here() = this;
  }
  void end() noexcept { running_here() = outer_; }
  // Whether the running operation runs inside one of another communicator.
  bool nested() const noexcept { return outer_ != nullptr; }
  // Whether this thread runs an operation of any communicator: only then may messages take tags
  // at or above reserved_tag_base (an operation may send on another communicator: NCCL's control).
  static bool any_running() noexcept { return running_here() != nullptr; }

  // The last operation that completed without an error on this rank (the creation, #0, at first).
  // Written by the thread that ran it; read once the queue is drained (renew()).
  const op_label& last_completed() const noexcept { return last_completed_; }
  void completed(const op_label& label) noexcept { last_completed_ = label; }

  // Operations issued so far (the next sequence number).
  std::uint64_t issued() const {
    std::lock_guard lock(mutex_);
    return next_seq_;
  }
  // The first operation issued here that has not finished: the one this thread runs, else the one
  // the progress thread runs, else the first queued, else the next to be issued. What an abort
  // names, so that peers waiting in an operation this rank queued but will never run learn of it.
  std::uint64_t first_unfinished() const {
    if (in_operation()) return current_.seq;
    std::lock_guard lock(mutex_);
    if (running_seq_ != 0) return running_seq_;
    return queue_.empty() ? next_seq_ : queue_.front()->seq;
  }
  // Sequence numbers start after the creation, which is operation #0.
  void set_issued(std::uint64_t n) {
    std::lock_guard lock(mutex_);
    next_seq_ = n;
  }

  // --- Abort: the first reason sticks.
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const {
    std::lock_guard lock(mutex_);
    return abort_reason_;
  }
  // Never fails to mark it; only the reason may be lost (to a failed allocation).
  void mark_aborted(std::string_view reason) noexcept {
    std::lock_guard lock(mutex_);
    if (!aborted_.exchange(true, std::memory_order_acq_rel)) {
      try {
        abort_reason_ = reason;
      } catch (...) {
      }
    }
  }
  // What an abort adds to the error it raises (that buffers still belong to MPI); taken once.
  void set_abort_note(std::string note) noexcept {
    std::lock_guard lock(mutex_);
    try {
      abort_note_ = std::move(note);
    } catch (...) {
    }
  }
  std::string take_abort_note() {
    std::lock_guard lock(mutex_);
    return std::exchange(abort_note_, {});
  }
  [[noreturn]] void raise_aborted(const char* operation, int rank, int size) const {
    raise({operation, rank, size}, "this communicator was aborted by an earlier error: " + abort_reason(),
          "Its operations cannot go on; create a new communicator (comm.renew() on every rank) and continue with that");
  }

  // --- Scheduling. Operations run one at a time, in the order they were issued.

  // --- One issuing thread at a time. A communicator's operations are issued from one thread at
  // a time, so that every rank issues them in one order (MPI asks the same of its collectives on
  // one communicator). A thread holds the communicator while it issues an operation: for the
  // whole of a blocking one, while it queues an async one. Another thread that issues an
  // operation meanwhile is refused, and the operation running then raises too once its steps are
  // done (intruded()), which aborts the communicator and so tells every peer: the overlap may have
  // paired it with the other thread's operation on a peer. (A peer may have returned that pairing's
  // result before the abort reaches it, and threads that take turns without overlapping are not
  // seen at all: this names the misuse, it cannot make it safe.)
  bool intruded() const noexcept { return intruded_.load(std::memory_order_acquire); }
  [[noreturn]] void raise_intruded(const error_site& site) const {
    raise(site, "another thread of this rank issued an operation of this communicator while this one ran",
          concurrent_todo);
  }

  // Runs f(seq) on this thread once every earlier operation has finished; `site` names the
  // operation in the error if another thread holds the communicator.
  template <class F> void run_blocking(F&& f, const error_site& site) {
    const issuing claim(*this, site);
    // Until something was queued, no other thread runs operations of this communicator: no lock needed.
    const bool shared = queued_ever_.load(std::memory_order_relaxed);
    std::unique_lock lock(mutex_, std::defer_lock);
    if (shared) lock.lock();
    refuse_nesting();
    if (shared && (!queue_.empty() || busy_)) {
      auto op = enqueue(lock, std::function<void(std::uint64_t)>(std::forward<F>(f)));
      lock.unlock();
      wait(*op);
      return;
    }
    busy_ = true;
    runner_ = std::this_thread::get_id();
    const std::uint64_t seq = next_seq_++;
    if (shared) lock.unlock();
    struct release {
      operation_state* self;
      bool shared;
      ~release() {
        if (!shared) {
          self->busy_ = false;
          self->runner_ = {};
          return;
        }
        {
          std::lock_guard guard(self->mutex_);
          self->busy_ = false;
          self->runner_ = {};
        }
        self->wake_.notify_all();
      }
    } done{this, shared};
    try {
      f(seq);
    } catch (...) {
      if (aborted()) news_->hear();
      throw;
    }
  }

  // Queues f(seq); it runs on the progress thread, or inside wait()/test() without one.
  std::shared_ptr<queued_operation> submit(std::function<void(std::uint64_t)> f, const error_site& site);

  // Waits for op (running queued operations on this thread when there is no progress thread) and
  // rethrows its failure; `heard`: the caller passes it on (not a handle dropped unwaited).
  void wait(queued_operation& op, bool heard = true);

  // Whether op has finished; without a progress thread, first runs the queue up to op (which may
  // wait for the other ranks, as wait() does).
  bool test(queued_operation& op);

  // Runs or waits out every queued operation; their failures stay with their handles.
  void drain() noexcept;

 private:
  // The operation state whose operation this thread runs now.
  static const operation_state*& running_here() noexcept {
    thread_local const operation_state* state = nullptr;
    return state;
  }

  static constexpr std::string_view concurrent_todo =
      "A communicator's operations are issued from one thread at a time, in the same order on every rank, as MPI's "
      "collectives are: give each thread a communicator of its own (another herd::mpi_communicator, or comm.split), or "
      "serialize the calls. The communicator is aborted; create a new one on every rank (comm.renew()) to go on";

  // This thread's hold on the communicator while it issues an operation (see intruded()). A hold
  // this thread has already (an operation started inside its own operation) is left to
  // refuse_nesting. The hold's release publishes what the issue changed (queued_ever_, say) to the
  // next thread that takes it.
  class issuing {
   public:
    issuing(operation_state& ops, const error_site& site);
    issuing(const issuing&) = delete;
    issuing& operator=(const issuing&) = delete;
    ~issuing() {
      if (claimed_) ops_.issuer_.store(std::thread::id{}, std::memory_order_release);
    }

   private:
    operation_state& ops_;
    bool claimed_ = false;
  };

  void refuse_nesting() const;

  std::shared_ptr<queued_operation> enqueue(std::unique_lock<std::mutex>&, std::function<void(std::uint64_t)> f);

  // Runs the first queued operation on this thread (the lock is released meanwhile).
  void run_next(std::unique_lock<std::mutex>& lock);

  // The progress thread: runs queued operations in order; between them it spins a while before it
  // sleeps (the next bucket of a backward pass is usually on its way).
  void work();

  comm_options options_;
  std::uint32_t track_ = trace::new_track();
  bool track_named_ = false;
  op_label current_;
  op_label last_completed_{op_kind::create, 0};
  const operation_state* outer_ = nullptr;
  std::atomic<bool> aborted_{false};

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::string abort_reason_;
  std::string abort_note_;
  std::uint64_t next_seq_ = 1;
  std::deque<std::shared_ptr<queued_operation>> queue_;
  bool busy_ = false;
  std::thread::id runner_;
  std::uint64_t running_seq_ = 0;  // the queued operation that runs now (0: none)
  std::atomic<bool> queued_ever_{false};  // set by the issuing thread, read by it
  std::atomic<std::thread::id> issuer_{};  // the thread issuing an operation (run_blocking: running it), if any
  std::atomic<bool> intruded_{false};  // another thread issued an operation meanwhile: sticks
  std::atomic<bool> stopping_{false};  // set under mutex_, read by the progress thread's spin too
  std::atomic<std::size_t> queued_{0};       // queue_.size(), for the progress thread's spin
  std::thread worker_;
  std::shared_ptr<abort_news> news_ = std::make_shared<abort_news>();
};

// The members above that queue, run and wait for operations and that end the progress thread:
// inline, or with HERD_SEPARATE_COMPILATION only in the program's implementation file
// (core/config.hpp). Each runs once per operation, not per element; what the call may cost in the
// hand-over is measured in benchmarks/RESULTS.md (a few tenths of a microsecond at most, if any).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE std::string op_label::str() const {
  std::string text = std::string(name(kind)) + " #" + std::to_string(seq);
  if (!name_.empty()) text += " \"" + std::string(name_.text, strnlen(name_.text, sizeof name_.text)) + "\"";
  if (typed) text += " (" + byte_text(count * size_of(type)) + " " + std::string(name(type)) + ")";
  return text;
}

HERD_SEPARATE operation_state::operation_state(const comm_options& options) : options_(options) {}

HERD_SEPARATE operation_state::~operation_state() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
  news_->close();
}

HERD_SEPARATE operation_state::issuing::issuing(operation_state& ops, const error_site& site) : ops_(ops) {
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id holder{};
  claimed_ = ops.issuer_.compare_exchange_strong(holder, me, std::memory_order_acq_rel);
  if (!claimed_ && holder != me) {
    ops.intruded_.store(true, std::memory_order_release);
    raise(site,
          "another thread of this rank is issuing or running an operation of this communicator at the same "
          "time",
          concurrent_todo);
  }
}

HERD_SEPARATE std::shared_ptr<queued_operation> operation_state::submit(std::function<void(std::uint64_t)> f,
                                                                   const error_site& site) {
  const issuing claim(*this, site);
  std::unique_lock lock(mutex_);
  queued_ever_.store(true, std::memory_order_relaxed);
  refuse_nesting();
  if (options_.progress_thread && !worker_.joinable()) worker_ = std::thread([this] { work(); });
  return enqueue(lock, std::move(f));
}

HERD_SEPARATE void operation_state::wait(queued_operation& op, bool heard) {
  if (op.done.load(std::memory_order_acquire)) {
    // Done: nothing else of this state is touched (a handle may outlive its communicator).
  } else if (options_.progress_thread) {
    // An operation the progress thread has not taken yet runs here, after any queued before it:
    // this thread would only wait for it, and running it saves the two hand-overs (the thread
    // taking it, then waking this one), which cost microseconds when the ranks' threads share
    // the cores. One the thread runs now is waited for: operations never run concurrently.
    {
      std::unique_lock lock(mutex_);
      while (!op.done.load(std::memory_order_acquire) && !busy_ && !queue_.empty()) run_next(lock);
    }
    // Woken by this operation's completion only, not by every other one's (after a spin: it is
    // often microseconds away).
    if (!spin_until([&] { return op.done.load(std::memory_order_acquire); }, handoff_spin)) {
      op.done.wait(false, std::memory_order_acquire);
    }
  } else if (!op.done.load(std::memory_order_acquire)) {
    std::unique_lock lock(mutex_);
    while (!op.done.load(std::memory_order_acquire)) {
      if (!options_.progress_thread && !busy_ && !queue_.empty()) {
        run_next(lock);
      } else {
        wake_.wait(lock);
      }
    }
  }
  if (op.failure) {
    if (heard && op.failure_repeats) op.news->hear();
    std::rethrow_exception(op.failure);
  }
}

HERD_SEPARATE bool operation_state::test(queued_operation& op) {
  if (op.done.load(std::memory_order_acquire)) return true;
  if (options_.progress_thread) return false;
  std::unique_lock lock(mutex_);
  while (!op.done.load(std::memory_order_acquire) && !busy_ && !queue_.empty()) run_next(lock);
  return op.done.load(std::memory_order_acquire);
}

HERD_SEPARATE void operation_state::drain() noexcept {
  std::unique_lock lock(mutex_);
  while (busy_ || !queue_.empty()) {
    if (!options_.progress_thread && !busy_) {
      run_next(lock);
    } else {
      wake_.wait(lock);
    }
  }
}

HERD_SEPARATE void operation_state::refuse_nesting() const {
  if (busy_ && runner_ == std::this_thread::get_id()) {
    throw error("herd: an operation was started from inside another operation of the same communicator. "
                "Start it after the first one returns.");
  }
}

HERD_SEPARATE std::shared_ptr<queued_operation> operation_state::enqueue(std::unique_lock<std::mutex>&,
                                                                    std::function<void(std::uint64_t)> f) {
  auto op = std::make_shared<queued_operation>();
  op->seq = next_seq_++;
  op->work = std::move(f);
  op->news = news_;
  queue_.push_back(op);
  queued_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
  return op;
}

HERD_SEPARATE void operation_state::run_next(std::unique_lock<std::mutex>& lock) {
  auto op = std::move(queue_.front());
  queue_.pop_front();
  queued_.fetch_sub(1, std::memory_order_relaxed);
  busy_ = true;
  runner_ = std::this_thread::get_id();
  running_seq_ = op->seq;
  lock.unlock();
  try {
    op->work(op->seq);
  } catch (...) {
    op->failure = std::current_exception();
    op->failure_repeats = aborted();
  }
  op->work = nullptr;  // drops what the work captured
  lock.lock();
  op->done.store(true, std::memory_order_release);
  op->done.notify_all();
  busy_ = false;
  runner_ = {};
  running_seq_ = 0;
  wake_.notify_all();
}

HERD_SEPARATE void operation_state::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (!busy_ && !queue_.empty()) {
      run_next(lock);
      continue;
    }
    if (stopping_ && queue_.empty()) return;
    lock.unlock();
    spin_until(
        [&] { return queued_.load(std::memory_order_acquire) != 0 || stopping_.load(std::memory_order_acquire); },
        handoff_spin);
    lock.lock();
    wake_.wait(lock, [&] { return stopping_ || (!busy_ && !queue_.empty()); });
  }
}
#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail

// Names the operations this thread issues while it lives, as Horovod's name= does: the agreement
// then matches operations by name as well as by kind, number and shape, so that a rank that
// skipped a collective is caught even when the next one has the same shape (without names, the
// ranks' sequence numbers and shapes are all that is compared). Names of up to 23 characters
// count; scopes nest, the inner one naming until it ends.
//   { herd::operation_name n("grad.layer3"); herd::allreduce(g3, comm); }
class operation_name {
 public:
  explicit operation_name(std::string_view name) noexcept : outer_(detail::thread_op_name()) {
    detail::op_name& current = detail::thread_op_name();
    current = {};
    std::memcpy(current.text, name.data(), std::min(name.size(), sizeof current.text - 1));
  }
  operation_name(const operation_name&) = delete;
  operation_name& operator=(const operation_name&) = delete;
  ~operation_name() { detail::thread_op_name() = outer_; }

 private:
  detail::op_name outer_;
};

}  // namespace herd

#endif  // HERD_COMM_DETAIL_OPERATION_STATE_HPP
