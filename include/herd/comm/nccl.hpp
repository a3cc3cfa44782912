#ifndef HERD_COMM_NCCL_HPP
#define HERD_COMM_NCCL_HPP
// herd::nccl_communicator: one rank per GPU, with NCCL moving and reducing device memory. Made
// from an MPI communicator (rank 0 creates NCCL's unique id, MPI broadcasts it) and a device:
//
//   herd::mpi_communicator world;
//   herd::nccl_communicator gpus(world, herd::mpi::local_rank());   // the GPU of this process
//   herd::allreduce(grad, gpus, herd::reduce_op::avg);              // grad: a CUDA tensor on that GPU
//
// herd's collectives on it are operations of its MPI communicator (control()): they agree on their
// arguments across ranks over MPI, then call NCCL on the communicator's stream and wait for the
// result; NCCL's stream first waits, by an event, for the caller's stream (cuda::current_stream():
// the default stream, or the one a cuda::use_stream scope names). While waiting they poll NCCL's asynchronous errors and the peers' notices; an error, a
// peer's abort, or no progress for the stall shutdown time (HERD_STALL_SHUTDOWN_TIME_SECONDS, 30
// minutes when unset, DDP's default; 0 waits forever, as on the other communicators) aborts the NCCL communicator
// and raises herd::error, on every rank, instead of hanging. The _async collectives are
// stream-ordered: enqueued after the work on the communicator's stream, their handle's wait()
// makes the caller's stream wait for them, synchronize() waits on the host.
//
// Available under nvcc, and in host-compiled files of programs that link herd::nccl (which
// defines HERD_WITH_NCCL): NCCL and the CUDA runtime are plain C APIs.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/comm/detail/watchdog.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/cuda/error.hpp>
#include <herd/cuda/runtime.hpp>
#include <herd/tensor/buffer_view.hpp>
#if !defined(HERD_NO_MPI)
#include <herd/comm/mpi.hpp>
#endif

#if (defined(__CUDACC__) || defined(HERD_WITH_NCCL)) && !defined(HERD_NO_MPI)
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace herd {
namespace detail {

inline ncclDataType_t nccl_dtype(dtype t) {
  switch (t) {
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::i8: return ncclInt8;
    case dtype::u8: return ncclUint8;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
  }
  return ncclUint8;
}

// What NCCL's work in flight needs, owned together by a communicator and the handles of its
// asynchronous operations (a handle may outlive its communicator, or follow it when it is moved):
// the NCCL communicator, its stream and device, and the watchdog's settings. The last owner to go
// waits (a bounded time) for the work still queued, then destroys the NCCL communicator; it
// aborts it instead when the work does not finish or NCCL reports an error.
struct nccl_state {
  int device = 0;
  int rank = -1;
  int size = 0;
  comm_options options;
  std::unique_ptr<cuda::stream> own_stream;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  bool aborted = false;

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;
  ~nccl_state() { destroy(); }

  error_site site() const { return {"nccl_communicator", rank, size}; }

  ncclComm_t live() const {
    if (aborted || comm == nullptr) {
      raise(site(), "this NCCL communicator was aborted after an earlier error",
            "Create a new nccl_communicator (on every rank) to go on");
    }
    return comm;
  }

  void abort() noexcept {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }

  // Raises, after aborting the NCCL communicator (which ends its kernels), when NCCL reported an
  // asynchronous error.
  void poll_errors() {
    if (comm == nullptr) return;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess || state == ncclInProgress) return;
    const std::string what = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(state) + " (" +
                             ncclGetLastError(comm) + ")";
    abort();
    raise(site(), what,
          "A peer may have died or the network failed; the communicator was aborted. Set NCCL_DEBUG=WARN for "
          "NCCL's own account");
  }

  void destroy() noexcept {
    if (comm == nullptr) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (state == cudaSuccess && async == ncclSuccess) break;
      if ((state != cudaErrorNotReady && state != cudaSuccess) || (async != ncclSuccess && async != ncclInProgress) ||
          std::chrono::steady_clock::now() > deadline) {
        abort();
        return;
      }
      std::this_thread::yield();
    }
    ncclCommDestroy(comm);
    comm = nullptr;
  }
};

}  // namespace detail

class nccl_communicator {
 public:
  // A pending send or receive: a CUDA event recorded after it on the communicator's stream.
  class request {
   public:
    request() = default;
    bool pending() const noexcept { return done_ != nullptr; }

   private:
    friend class nccl_communicator;
    std::unique_ptr<cuda::event> done_;
    int peer_ = -1;
    int tag_ = 0;
    bool receiving_ = false;
  };

  // On `device`, with a stream of its own.
  nccl_communicator(const mpi_communicator& bootstrap, int device, comm_options options = {})
      : nccl_communicator(bootstrap, device, nullptr, options) {}

  // On `device`, enqueueing on `stream` (the caller's, e.g. the one its framework computes on;
  // nullptr: a stream of its own). An operation of `bootstrap`'s ranks: every rank creates its
  // communicator together, and a rank without a usable GPU makes every rank raise instead of
  // leaving the others in NCCL's set-up.
  nccl_communicator(const mpi_communicator& bootstrap, int device, cudaStream_t stream, comm_options options = {})
      : control_(bootstrap.native(), options), state_(std::make_shared<detail::nccl_state>()) {
    state_->device = device;
    state_->rank = control_.rank();
    state_->size = control_.size();
    state_->options = control_.options();
    struct {
      ncclUniqueId id;
      std::int32_t ok;
      char problem[512];
    } mine{};
    mine.ok = 1;
    try {
      const cuda::device_guard on(device);
      if (stream == nullptr) {
        state_->own_stream = std::make_unique<cuda::stream>();
        state_->stream = state_->own_stream->get();
      } else {
        state_->stream = stream;
      }
      if (control_.rank() == 0 && ncclGetUniqueId(&mine.id) != ncclSuccess) {
        throw error("rank 0 could not create NCCL's unique id (NCCL_DEBUG=WARN says why)");
      }
    } catch (const std::exception& e) {
      mine.ok = 0;
      std::strncpy(mine.problem, e.what(), sizeof mine.problem - 1);
    }
    ncclUniqueId id{};
    detail::run_operation(control_, {detail::op_kind::create}, [&] {
      const detail::exchanged all = detail::agree_identity(control_, &mine, sizeof mine);
      for (int r = 0; r < size(); ++r) {
        decltype(mine) theirs;
        std::memcpy(&theirs, all.payload(r), sizeof theirs);
        if (!theirs.ok) {
          theirs.problem[sizeof theirs.problem - 1] = '\0';
          detail::raise_agreed({"nccl_communicator", rank(), size()},
                               "rank " + std::to_string(r) + " could not use cuda:" + std::to_string(device) + " (" +
                                   theirs.problem + ")",
                               "Give every rank a GPU of its own (e.g. device herd::mpi::local_rank() with one process "
                               "per GPU)");
        }
        if (r == 0) id = theirs.id;
      }
    });
    init_rank(id);
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  // A moved-from communicator refuses every operation; the handles of its operations still hold
  // what they need.
  nccl_communicator(nccl_communicator&& other) noexcept = default;
  nccl_communicator& operator=(nccl_communicator&& other) noexcept = default;
  ~nccl_communicator() = default;

  int rank() const noexcept { return control_.rank(); }
  int size() const noexcept { return control_.size(); }
  int device_index() const noexcept { return state_ ? state_->device : -1; }
  cudaStream_t stream() const noexcept { return state_ ? state_->stream : nullptr; }
  // NCCL's communicator, for calling NCCL directly. It is non-blocking (so that its set-up can
  // be watched): a call may answer ncclInProgress, and is enqueued once ncclCommGetAsyncError
  // no longer does.
  ncclComm_t native() const noexcept { return state_ ? state_->comm : nullptr; }
  // The MPI communicator (a duplicate of the bootstrap one) for small host messages: herd's
  // cross-rank argument checks travel over it.
  mpi_communicator& control() noexcept { return control_; }
  const comm_options& options() const noexcept { return control_.options(); }
  // Its operations are those of control(): one sequence of operations across both.
  detail::operation_state& operations() noexcept { return control_.operations(); }

  // NCCL reaches this communicator's own GPU only.
  bool supports(device d) const noexcept { return state_ && d.is_cuda() && d.index == state_->device; }

  // Point to point, each one NCCL operation on stream(). NCCL runs them in order and a send
  // completes only when its receive runs, so a rank that sends and receives should use
  // sendrecv (one NCCL group) rather than an isend followed by an irecv. Tags are not used.
  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("isend", rank(), size(), peer);
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclSend(data, bytes, ncclUint8, peer, state().live(), state().stream), "ncclSend");
    return mark(peer, tag, false);
  }

  request irecv(void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("irecv", rank(), size(), peer);
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclRecv(data, bytes, ncclUint8, peer, state().live(), state().stream), "ncclRecv");
    return mark(peer, tag, true);
  }

  bool test(request& r) {
    if (!r.pending()) return true;
    if (r.done_->done()) {
      r.done_.reset();
      return true;
    }
    state().poll_errors();
    return false;
  }

  void wait(request& r) {
    watched(
        [&] { return test(r); }, [&] { return detail::waiting_for(operations(), r.peer_, r.receiving_, r.tag_); });
  }

  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    detail::check_peer("sendrecv", rank(), size(), destination);
    detail::check_peer("sendrecv", rank(), size(), source);
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(send, send_bytes, ncclUint8, destination, state().live(), state().stream), "ncclSend");
    check(ncclRecv(receive, receive_bytes, ncclUint8, source, state().live(), state().stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    request r = mark(source, tag, true);
    wait(r);
  }

  // The ranks of a split (or subset) of control(), on the same GPUs: a new NCCL communicator of
  // them. A rank left out (herd::no_color) gets one it is not a member of, as with NCCL's
  // NCCL_SPLIT_NOCOLOR: rank -1, size 0, every operation an error.
  nccl_communicator split(int color, int key) const { return of_part(control_.split(color, key)); }
  nccl_communicator subset(const std::vector<int>& ranks) const { return of_part(control_.subset(ranks)); }
  bool is_member() const noexcept { return control_.is_member(); }

  // A new communicator of the same ranks and GPU: how ranks go on after an abort (NCCL's
  // ncclCommAbort followed by a new ncclCommInitRank). Every rank calls it.
  nccl_communicator renew() const { return renew(options()); }
  nccl_communicator renew(const comm_options& options) const {
    return nccl_communicator(control_, state().device, state().own_stream ? nullptr : state().stream, options);
  }

  // Aborts NCCL's communicator and the running operation of control() (telling the peers).
  void abort(std::string_view reason) noexcept {
    if (state_) state_->abort();
    control_.abort(reason);
  }

  // A marker of the work enqueued so far, for a stream-ordered handle (herd::handle). It shares
  // the NCCL communicator's state, so that it can be waited for after the communicator is moved
  // or destroyed (whose NCCL communicator then lives until the marker is done with).
  std::shared_ptr<detail::device_completion> completion() {
    class marker : public detail::device_completion {
     public:
      explicit marker(std::shared_ptr<detail::nccl_state> state) : state_(std::move(state)) {
        const cuda::device_guard on(state_->device);
        done_.record(state_->stream);
      }
      bool test() override { return done_.done(); }
      // The caller's stream (cuda::current_stream()) waits for the operation.
      void wait() override { HERD_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_.get(), 0)); }
      // Waits on the host, watching NCCL's errors and the stall time; on a stall or an error it
      // aborts the NCCL communicator (which ends its kernels, so that nothing uses the tensors
      // after) and raises.
      void synchronize() override {
        if (done_.done()) return;
        try {
          detail::watched_wait(
              state_->options, state_->site(),
              [&] {
                if (done_.done()) return true;
                state_->poll_errors();
                return false;
              },
              [] {}, [] { return "for its GPU stream (an asynchronous NCCL operation)"; });
        } catch (...) {  // (after an error of NCCL's, poll_errors has aborted it already)
          state_->abort();
          throw;
        }
      }

     private:
      std::shared_ptr<detail::nccl_state> state_;
      cuda::event done_;
    };
    return std::make_shared<marker>(shared_state());
  }

  // The collectives herd's allreduce, broadcast, allgather and reduce_scatter call once the
  // arguments agree on every rank. They enqueue on stream(); synchronize() waits.
  // op: sum, prod, min, max, or avg on floats (NCCL's ncclAvg, which scales before it sums; herd's
  // collectives call it only where herd's own sum-then-divide kernel is not compiled in).
  void native_allreduce(const_buffer_view in, buffer_view out, reduce_op op) {
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclAllReduce(in.data, out.data, in.count, detail::nccl_dtype(in.type), nccl_op(op, in.type), state().live(), state().stream),
          "ncclAllReduce");
  }

  void native_broadcast(buffer_view data, int root) {
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclBroadcast(data.data, data.data, data.count, detail::nccl_dtype(data.type), root, state().live(), state().stream),
          "ncclBroadcast");
  }

  void native_allgather(const_buffer_view in, buffer_view out) {
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclAllGather(in.data, out.data, in.count, detail::nccl_dtype(in.type), state().live(), state().stream), "ncclAllGather");
  }

  void native_reduce_scatter(const_buffer_view in, buffer_view out, reduce_op op) {
    const cuda::device_guard on(state().device);
    order_after_caller();
    check(ncclReduceScatter(in.data, out.data, out.count, detail::nccl_dtype(in.type), nccl_op(op, in.type), state().live(),
                            state().stream),
          "ncclReduceScatter");
  }

  // Waits for everything enqueued on stream(), watching NCCL's asynchronous errors and the
  // stall times; aborts the NCCL communicator and raises herd::error rather than wait forever.
  void synchronize() {
    watched(
        [&] {
          const cudaError_t state = cudaStreamQuery(this->state().stream);
          if (state == cudaSuccess) return true;
          if (state != cudaErrorNotReady) cuda::check(state, "cudaStreamQuery");
          this->state().poll_errors();
          return false;
        },
        [] { return "for its GPU stream (a NCCL operation)"; });
  }

 private:
  struct outside_tag {};
  nccl_communicator(mpi_communicator outside, int device, outside_tag)
      : control_(std::move(outside)), state_(std::make_shared<detail::nccl_state>()) {
    state_->device = device;
    state_->options = control_.options();
  }

  nccl_communicator of_part(mpi_communicator part) const {
    if (!part.is_member()) return nccl_communicator(std::move(part), state().device, outside_tag{});
    return nccl_communicator(part, state().device, state().own_stream ? nullptr : state().stream, options());
  }

  // The state every operation needs; a moved-from communicator has none and says so.
  detail::nccl_state& state() const {
    if (!state_) {
      detail::raise({"nccl_communicator", control_.rank(), control_.size()}, "this nccl_communicator was moved from",
                    "Use the communicator it was moved to");
    }
    return *state_;
  }
  std::shared_ptr<detail::nccl_state> shared_state() const {
    state();
    return state_;
  }

  // ncclCommInitRank, watched: NCCL's set-up waits for every rank, and a rank that never comes
  // (or a network that does not connect) would hold the others in it for ever. Non-blocking
  // initialization is polled under the stall shutdown time (HERD_STALL_SHUTDOWN_TIME_SECONDS,
  // 30 minutes when unset, 0 for ever); past it the communicator is aborted and every waiting rank raises.
  void init_rank(const ncclUniqueId& id) {
    detail::nccl_state& st = state();
    const cuda::device_guard on(st.device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = ncclCommInitRankConfig(&st.comm, st.size, id, st.rank, &config);
    if (started != ncclInProgress) check(started, "ncclCommInitRankConfig");
    ncclResult_t state = ncclInProgress;
    auto initialized = [&] {
      if (st.comm != nullptr) check(ncclCommGetAsyncError(st.comm, &state), "ncclCommGetAsyncError");
      return state != ncclInProgress;
    };
    try {
      detail::watched_wait(options(), st.site(), initialized, [] {},
                           [] { return "in ncclCommInitRank for the other ranks"; });
    } catch (...) {
      st.abort();
      throw;
    }
    if (state == ncclSuccess) return;
    const std::string what =
        std::string("ncclCommInitRank failed: ") + ncclGetErrorString(state) + " (" + ncclGetLastError(st.comm) + ")";
    st.abort();
    detail::raise(st.site(), what,
                  "Check that every rank has a GPU of its own and runs the same NCCL; set NCCL_DEBUG=WARN for details");
  }

  // NCCL must not read a tensor before the kernels writing it are done: its stream waits, by an
  // event recorded on the caller's stream (cuda::current_stream(), which may belong to another
  // device), for that stream's work.
  void order_after_caller() {
    const cudaStream_t caller = cuda::current_stream();
    if (caller == state().stream) return;
    upstream_.after(state().stream, caller);
  }

  // The watched wait of this communicator's own steps, until done(): the peers' notices and the
  // watchdog, saying what() it waits for, raise (the running operation then aborts this
  // communicator) when a peer aborted or on a stall.
  template <class Done, class What> void watched(Done done, What what) {
    detail::watched_wait(
        options(), detail::site_of(operations(), "nccl_communicator", rank(), size()), done,
        [&] {
          if (operations().in_operation()) control_.check_peers();
        },
        what);
  }

  ncclRedOp_t nccl_op(reduce_op op, dtype type) const {
    switch (op) {
      case reduce_op::sum: return ncclSum;
      case reduce_op::prod: return ncclProd;
      case reduce_op::min: return ncclMin;
      case reduce_op::max: return ncclMax;
      case reduce_op::avg:
        if (is_floating_point(type)) return ncclAvg;
        break;
      default: break;
    }
    detail::raise({"nccl_communicator", rank(), size()},
                  "NCCL has no reduction for " + std::string(name(op)) + " on " + std::string(name(type)),
                  "Use sum, prod, min or max (and avg on floats); herd's collectives do integer avg themselves");
  }

  request mark(int peer, int tag, bool receiving) {
    request r;
    r.done_ = std::make_unique<cuda::event>();
    r.done_->record(state().stream);
    r.peer_ = peer;
    r.tag_ = tag;
    r.receiving_ = receiving;
    return r;
  }

  // Raises when an NCCL call failed. The communicator is non-blocking (see init_rank): a call that
  // answers ncclInProgress is still being enqueued, and events recorded on the stream before it
  // is would not follow it, so this waits (watched) until NCCL has finished with the call.
  void check(ncclResult_t code, const char* call) const {
    if (code == ncclInProgress && state_ && state_->comm != nullptr) code = enqueued(call);
    if (code == ncclSuccess) return;
    detail::raise({"nccl_communicator", control_.rank(), control_.size()},
                  std::string(call) + " failed: " + ncclGetErrorString(code) +
                      (state_ && state_->comm ? std::string(" (") + ncclGetLastError(state_->comm) + ")" : std::string()),
                  "Check that every rank has a GPU of its own and runs the same NCCL; set NCCL_DEBUG=WARN for details");
  }

  ncclResult_t enqueued(const char* call) const {
    ncclResult_t state = ncclSuccess;
    auto settled = [&] {
      ncclCommGetAsyncError(state_->comm, &state);
      return state != ncclInProgress;
    };
    try {
      detail::watched_wait(options(), state_->site(), settled, [] {},
                           [&] { return std::string("for ") + call + " to be enqueued"; });
    } catch (...) {
      state_->abort();
      throw;
    }
    return state;
  }

  mpi_communicator control_;
  std::shared_ptr<detail::nccl_state> state_;
  cuda::stream_order upstream_;  // NCCL's stream after the caller's
};

}  // namespace herd
#endif

#endif  // HERD_COMM_NCCL_HPP
