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
// minutes when unset, DDP's default; 0 still means 30 minutes here) aborts the NCCL communicator
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
      : control_(bootstrap.native(), options), device_(device) {
    struct {
      ncclUniqueId id;
      std::int32_t ok;
      char problem[512];
    } mine{};
    mine.ok = 1;
    try {
      const cuda::device_guard on(device_);
      if (stream == nullptr) {
        own_stream_ = std::make_unique<cuda::stream>();
        stream_ = own_stream_->get();
      } else {
        stream_ = stream;
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
                               "rank " + std::to_string(r) + " could not use cuda:" + std::to_string(device_) + " (" +
                                   theirs.problem + ")",
                               "Give every rank a GPU of its own (e.g. device herd::mpi::local_rank() with one process "
                               "per GPU)");
        }
        if (r == 0) id = theirs.id;
      }
    });
    const cuda::device_guard on(device_);
    check(ncclCommInitRank(&comm_, control_.size(), id, control_.rank()), "ncclCommInitRank");
  }

  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  nccl_communicator(nccl_communicator&& other) noexcept
      : control_(std::move(other.control_)), device_(other.device_), own_stream_(std::move(other.own_stream_)),
        upstream_(std::move(other.upstream_)), stream_(other.stream_), comm_(std::exchange(other.comm_, nullptr)),
        aborted_(other.aborted_) {}
  nccl_communicator& operator=(nccl_communicator&& other) noexcept {
    if (this != &other) {
      destroy();
      control_ = std::move(other.control_);
      device_ = other.device_;
      own_stream_ = std::move(other.own_stream_);
      upstream_ = std::move(other.upstream_);
      stream_ = other.stream_;
      comm_ = std::exchange(other.comm_, nullptr);
      aborted_ = other.aborted_;
    }
    return *this;
  }
  ~nccl_communicator() { destroy(); }

  int rank() const noexcept { return control_.rank(); }
  int size() const noexcept { return control_.size(); }
  int device_index() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  ncclComm_t native() const noexcept { return comm_; }
  // The MPI communicator (a duplicate of the bootstrap one) for small host messages: herd's
  // cross-rank argument checks travel over it.
  mpi_communicator& control() noexcept { return control_; }
  const comm_options& options() const noexcept { return control_.options(); }
  // Its operations are those of control(): one sequence of operations across both.
  detail::operation_state& operations() noexcept { return control_.operations(); }

  // NCCL reaches this communicator's own GPU only.
  bool supports(device d) const noexcept { return d.is_cuda() && d.index == device_; }

  // Point to point, each one NCCL operation on stream(). NCCL runs them in order and a send
  // completes only when its receive runs, so a rank that sends and receives should use
  // sendrecv (one NCCL group) rather than an isend followed by an irecv. Tags are not used.
  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("isend", rank(), size(), peer);
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclSend(data, bytes, ncclUint8, peer, live(), stream_), "ncclSend");
    return mark(peer, tag, false);
  }

  request irecv(void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("irecv", rank(), size(), peer);
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclRecv(data, bytes, ncclUint8, peer, live(), stream_), "ncclRecv");
    return mark(peer, tag, true);
  }

  bool test(request& r) {
    if (!r.pending()) return true;
    if (r.done_->done()) {
      r.done_.reset();
      return true;
    }
    poll_errors();
    return false;
  }

  void wait(request& r) {
    detail::waiting watch(with_nccl_timeout(options()));
    while (!test(r)) {
      if (watch.tick()) stalled(watch, detail::waiting_for(operations(), r.peer_, r.receiving_, r.tag_));
      watch.pause();
    }
  }

  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    detail::check_peer("sendrecv", rank(), size(), destination);
    detail::check_peer("sendrecv", rank(), size(), source);
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclGroupStart(), "ncclGroupStart");
    check(ncclSend(send, send_bytes, ncclUint8, destination, live(), stream_), "ncclSend");
    check(ncclRecv(receive, receive_bytes, ncclUint8, source, live(), stream_), "ncclRecv");
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
    return nccl_communicator(control_, device_, own_stream_ ? nullptr : stream_, options);
  }

  // Aborts NCCL's communicator and the running operation of control() (telling the peers).
  void abort(std::string_view reason) noexcept {
    abort_nccl();
    control_.abort(reason);
  }

  // A marker of the work enqueued so far, for a stream-ordered handle (herd::handle).
  std::shared_ptr<detail::device_completion> completion() {
    class marker : public detail::device_completion {
     public:
      marker(nccl_communicator& owner) : owner_(&owner) {
        const cuda::device_guard on(owner.device_);
        done_.record(owner.stream_);
      }
      bool test() override { return done_.done(); }
      // The caller's stream (cuda::current_stream()) waits for the operation.
      void wait() override { HERD_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_.get(), 0)); }
      void synchronize() override {
        detail::waiting watch(with_nccl_timeout(owner_->options()));
        while (!done_.done()) {
          if (watch.tick()) owner_->stalled(watch, "for its GPU stream (an asynchronous NCCL operation)");
          watch.pause();
        }
      }

     private:
      nccl_communicator* owner_;
      cuda::event done_;
    };
    return std::make_shared<marker>(*this);
  }

  // The collectives herd's allreduce, broadcast, allgather and reduce_scatter call once the
  // arguments agree on every rank. They enqueue on stream(); synchronize() waits.
  // op: sum, prod, min, max, or avg on floats (NCCL's ncclAvg, which scales before it sums; herd's
  // collectives call it only where herd's own sum-then-divide kernel is not compiled in).
  void native_allreduce(const_buffer_view in, buffer_view out, reduce_op op) {
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclAllReduce(in.data, out.data, in.count, detail::nccl_dtype(in.type), nccl_op(op, in.type), live(), stream_),
          "ncclAllReduce");
  }

  void native_broadcast(buffer_view data, int root) {
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclBroadcast(data.data, data.data, data.count, detail::nccl_dtype(data.type), root, live(), stream_),
          "ncclBroadcast");
  }

  void native_allgather(const_buffer_view in, buffer_view out) {
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclAllGather(in.data, out.data, in.count, detail::nccl_dtype(in.type), live(), stream_), "ncclAllGather");
  }

  void native_reduce_scatter(const_buffer_view in, buffer_view out, reduce_op op) {
    const cuda::device_guard on(device_);
    order_after_caller();
    check(ncclReduceScatter(in.data, out.data, out.count, detail::nccl_dtype(in.type), nccl_op(op, in.type), live(),
                            stream_),
          "ncclReduceScatter");
  }

  // Waits for everything enqueued on stream(), watching NCCL's asynchronous errors and the
  // stall times; aborts the NCCL communicator and raises herd::error rather than wait forever.
  void synchronize() {
    detail::waiting watch(with_nccl_timeout(options()));
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) cuda::check(state, "cudaStreamQuery");
      poll_errors();
      if (watch.tick()) stalled(watch, "for its GPU stream (a NCCL operation)");
      watch.pause();
    }
  }

 private:
  struct outside_tag {};
  nccl_communicator(mpi_communicator outside, int device, outside_tag) : control_(std::move(outside)), device_(device) {}

  nccl_communicator of_part(mpi_communicator part) const {
    if (!part.is_member()) return nccl_communicator(std::move(part), device_, outside_tag{});
    return nccl_communicator(part, device_, own_stream_ ? nullptr : stream_, options());
  }

  // NCCL must not read a tensor before the kernels writing it are done: its stream waits, by an
  // event, for the caller's stream (cuda::current_stream()) when that is another stream.
  void order_after_caller() {
    const cudaStream_t caller = cuda::current_stream();
    if (caller == stream_) return;
    if (!upstream_) upstream_ = std::make_unique<cuda::event>();
    upstream_->record(caller);
    HERD_CUDA_CHECK(cudaStreamWaitEvent(stream_, upstream_->get(), 0));
  }

  // NCCL's operations get a finite patience even when herd's default (wait forever) is in force.
  static comm_options with_nccl_timeout(comm_options o) {
    if (o.stall_shutdown_seconds <= 0) o.stall_shutdown_seconds = 1800;
    return o;
  }

  // The watchdog and the peers' notices, while waiting for the GPU: raises (the running operation
  // then aborts this communicator) on a stall or when a peer aborted.
  void stalled(detail::waiting& watch, const std::string& what) {
    if (operations().in_operation()) control_.check_peers();
    watch.watch(detail::site_of(operations(), "nccl_communicator", rank(), size()), what);
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
    r.done_->record(stream_);
    r.peer_ = peer;
    r.tag_ = tag;
    r.receiving_ = receiving;
    return r;
  }

  ncclComm_t live() const {
    if (aborted_ || comm_ == nullptr) {
      detail::raise({"nccl_communicator", rank(), size()}, "this NCCL communicator was aborted after an earlier error",
                    "Create a new nccl_communicator (on every rank) to go on");
    }
    return comm_;
  }

  void poll_errors() {
    if (comm_ == nullptr) return;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess || state == ncclInProgress) return;
    const std::string what = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(state) + " (" +
                             ncclGetLastError(comm_) + ")";
    abort_nccl();
    detail::raise({"nccl_communicator", rank(), size()}, what,
                  "A peer may have died or the network failed; the communicator was aborted. Set NCCL_DEBUG=WARN "
                  "for NCCL's own account");
  }

  void check(ncclResult_t code, const char* call) const {
    if (code == ncclSuccess || code == ncclInProgress) return;
    detail::raise({"nccl_communicator", control_.rank(), control_.size()},
                  std::string(call) + " failed: " + ncclGetErrorString(code) +
                      (comm_ ? std::string(" (") + ncclGetLastError(comm_) + ")" : std::string()),
                  "Check that every rank has a GPU of its own and runs the same NCCL; set NCCL_DEBUG=WARN for details");
  }

  void abort_nccl() noexcept {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
  }

  // Waits (a bounded time) for queued work, then destroys; aborts instead when the work does not
  // finish or NCCL reports an error, e.g. while unwinding after a peer died.
  void destroy() noexcept {
    if (comm_ == nullptr) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (state == cudaSuccess && async == ncclSuccess) break;
      if ((state != cudaErrorNotReady && state != cudaSuccess) || (async != ncclSuccess && async != ncclInProgress) ||
          std::chrono::steady_clock::now() > deadline) {
        abort_nccl();
        return;
      }
      std::this_thread::yield();
    }
    ncclCommDestroy(comm_);
    comm_ = nullptr;
  }

  mpi_communicator control_;
  int device_ = 0;
  std::unique_ptr<cuda::stream> own_stream_;
  std::unique_ptr<cuda::event> upstream_;  // marks the caller's work that NCCL waits for
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

}  // namespace herd
#endif

#endif  // HERD_COMM_NCCL_HPP
