#ifndef HERD_OPTIM_DISTRIBUTED_OPTIMIZER_HPP
#define HERD_OPTIM_DISTRIBUTED_OPTIMIZER_HPP
// herd::distributed_optimizer: wraps any optimizer so that each of its steps uses the gradients
// averaged (or summed) over all ranks, like Horovod's DistributedOptimizer.
//
//   herd::sgd sgd(herd::views(w, b), herd::views(grad_w, grad_b), {.lr = 0.1, .momentum = 0.9});
//   herd::distributed_optimizer opt(sgd, herd::views(grad_w, grad_b), comm);
//   for (...) { forward(); backward(); opt.step(); }
//
// The wrapped optimizer needs only a step() member that reads the gradient tensors herd was given
// (herd overwrites them in place with the reduced values just before calling it).
//
// - Tensor fusion: gradients of one dtype are packed into a fusion buffer of up to
//   fusion_threshold_bytes (128 MiB, HERD_FUSION_THRESHOLD; 0 turns fusion off) and reduced with
//   one allreduce per buffer. A gradient larger than the threshold is reduced on its own, in place.
//   When every rank shares a node (mpi_communicator's shared memory) and nothing is compressed or
//   scaled, the group goes into shared memory and back straight from and into the gradients: one
//   allreduce, no fusion buffer, no packing copies.
// - Compression: f32/f64 gradients cross the wire as f16 or bf16 (optim/compression.hpp).
// - gradient_predivide_factor f: gradients are scaled by 1/f before the sum and by f/size after
//   (for op avg), which keeps sums of many large gradients from overflowing in f16. When every
//   gradient is 16-bit on the wire (f16/bf16 gradients, or compression), the average is always
//   divided before the sum (f = the divisor), as DDP's is: no average within range overflows.
// - backward_passes_per_step k: call step() after every backward pass; the first k-1 calls of a
//   round only accumulate the gradients locally, the k-th reduces the *sum* of the k passes (as
//   Horovod, and as libtorch's own gradient accumulation: divide the loss by k for their mean)
//   and steps the wrapped optimizer. no_sync() does the same for as long as its guard lives.
// - synchronize() reduces now (to clip or inspect the averaged gradients before step());
//   a later step() then does not reduce again. skip_synchronize() makes the next step() skip
//   the reduction altogether.
// - Overlap with the backward pass (DDP's buckets): call mark_ready(i) as soon as gradient i is
//   final. Gradients are grouped into buckets, in reverse order, the first of up to
//   first_bucket_bytes (1 MiB), the others of up to bucket_bytes (25 MiB, HERD_BUCKET_BYTES); a
//   bucket whose gradients are all ready is packed and its allreduce started asynchronously,
//   buckets in order on every rank; step() starts what is left, waits, unpacks and steps. After
//   the first such step the buckets are rebuilt in the order rank 0 saw its gradients become
//   ready. A gradient never marked in a pass is an error on every rank, or, with
//   find_unused_parameters, reduced as zeros. Without mark_ready, step() reduces everything at
//   once, in fusion buffers of fusion_threshold_bytes (Horovod's tensor fusion).
// - Gradients that live inside their bucket (DDP's gradient_as_bucket_view): a bucket whose
//   gradients follow each other in memory in the bucket's order is reduced where they are, with
//   no copy in or out. bucket_layout() says where each gradient goes for that; with
//   gradient_as_bucket_view the buckets keep that layout (they are not rebuilt), so storage
//   allocated by it stays valid for the optimizer's life. When every rank shares a node
//   (mpi_communicator's shared memory), a host bucket goes into shared memory straight from its
//   gradients wherever they are, and its result straight back into them: no copies either.
// - The first reduction checks that every rank holds the same gradients (count, sizes, dtypes)
//   and the same options, and raises herd::error on every rank if not. Later steps check that
//   this rank's gradients are still those (and on one device); a rank whose are not says so in
//   the agreement of its next reduction, so that every rank raises, not just that one.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/detail/bucket_plan.hpp>
#include <herd/optim/detail/gradient_movers.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/runtime/env.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <algorithm>
#include <bit>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace herd {

struct optimizer_options {
  reduce_op op = reduce_op::avg;  // avg or sum over ranks
  double gradient_predivide_factor = 1.0;
  int backward_passes_per_step = 1;
  std::size_t fusion_threshold_bytes = runtime::defaults().fusion_threshold_bytes;
  herd::compression compression = herd::compression::none;
  // Buckets, with mark_ready (DDP's bucket_cap_mb and first bucket).
  std::size_t bucket_bytes = runtime::defaults().bucket_bytes;
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // Gradients not marked ready in a pass are reduced as zeros instead of being an error.
  bool find_unused_parameters = false;
  // The gradients were laid out by bucket_layout(): keep the buckets as they are (no rebuild in
  // the ready order), so that each bucket's gradients stay back to back and reduce in place.
  bool gradient_as_bucket_view = false;
  // herd::torch::DistributedDataParallel only (DDP's broadcast_buffers): rank 0's buffers (BatchNorm's
  // running statistics) are broadcast at each forward, as DDP does, so that every rank keeps the same.
  bool broadcast_buffers = true;
  // Ranks may run out of batches at different steps (DDP's Join, Horovod's join()): a rank with
  // none left calls join(), and every reducing step (in step(), or at a pass's first mark_ready)
  // first agrees on which ranks are still training (one byte per rank). avg divides by the world
  // size, the joined ranks adding zeros (DDP's default), or, with divide_by_active_ranks, by the
  // ranks still training.
  bool uneven_inputs = false;
  bool divide_by_active_ranks = false;
};

// Bucket b of the distributed optimizer's buckets, in launch order: `count` elements of `type`,
// gradient members[k] at element offsets[k].
using gradient_bucket = detail::bucket_plan::bucket;

// Where to put the gradients so that they live inside their buckets (gradient_as_bucket_view):
// `shapes[i]` = (elements, dtype) of gradient i, in the order the optimizer is given them. Allocate
// one buffer of `count` elements per bucket and make gradient members[k] the view at offsets[k].
// `where`: the gradients' device (on a GPU, members start 16 bytes aligned).
inline std::vector<gradient_bucket> bucket_layout(const std::vector<std::pair<std::size_t, dtype>>& shapes,
                                                  const optimizer_options& options = {}, device where = device::cpu()) {
  return detail::bucket_plan::make(shapes, detail::bucket_plan::reverse_order(shapes.size()),
                                   options.first_bucket_bytes, options.bucket_bytes,
                                   detail::member_alignment(where))
      .buckets;
}

// Where the time of the overlapped reductions went, summed over steps (seconds): `communication`,
// each bucket's operation from its start to its end on the communicator (on its progress thread,
// while the caller goes on with its backward pass); `exposed`, the caller's own time in them:
// packing at mark_ready, and in step() starting what was left, waiting, unpacking; `waiting`, the
// part of `exposed` spent waiting for buckets to finish. communication - waiting is what the
// backward pass hid. `packed_bytes`: gradient bytes copied into buckets (and back out after
// the reduction); none for buckets whose gradients live in them.
struct overlap_stats {
  double communication = 0;
  double exposed = 0;
  double waiting = 0;
  std::size_t steps = 0;
  std::size_t packed_bytes = 0;
};

HERD_CONFIG_NAMESPACE_BEGIN

template <class Optimizer, communicator C> class distributed_optimizer {
 public:
  // Returns the current gradient views; for tensor libraries that reallocate gradients between steps.
  using gradient_source = std::function<std::vector<buffer_view>()>;

  distributed_optimizer(Optimizer& inner, std::vector<buffer_view> gradients, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, gradient_source([g = std::move(gradients)] { return g; }), comm, options) {}

  // The gradients of a parameters list (optim/parameters.hpp).
  distributed_optimizer(Optimizer& inner, const parameters& params, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, params.gradients, comm, options) {}

  distributed_optimizer(Optimizer& inner, gradient_source gradients, C& comm, optimizer_options options = {})
      : inner_(inner), gradients_(std::move(gradients)), comm_(comm), options_(options) {
    const detail::error_site site{"distributed_optimizer", comm.rank(), comm.size()};
    if (options_.op != reduce_op::avg && options_.op != reduce_op::sum)
      detail::raise(site, "op " + std::string(name(options_.op)) + " cannot combine gradients", "Use reduce_op::avg or reduce_op::sum");
    if (!(options_.gradient_predivide_factor > 0))
      detail::raise(site, "gradient_predivide_factor must be positive", "Pass 1.0 to turn predivision off");
    if (options_.gradient_predivide_factor != 1.0 && options_.op != reduce_op::avg)
      detail::raise(site, "gradient_predivide_factor applies to op avg only", "Use reduce_op::avg, or a factor of 1.0");
    if (options_.backward_passes_per_step < 1)
      detail::raise(site, "backward_passes_per_step must be at least 1", "Pass 1 to reduce after every backward pass");
    if (options_.bucket_bytes == 0 || options_.first_bucket_bytes == 0)
      detail::raise(site, "bucket_bytes and first_bucket_bytes must be positive", "Keep the defaults (25 MiB, 1 MiB)");
    detail::trace::name_track(track_, "distributed_optimizer: rank " + std::to_string(comm.rank()) + " of " +
                                          std::to_string(comm.size()));
  }

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  // Call once per backward pass. Returns true when this call reduced the gradients (unless
  // already synchronized or skipped) and stepped the wrapped optimizer.
  bool step() {
    const detail::trace::span slice(track_, "step", {.extra_name = "step", .extra = step_calls_++});
    const bool reduce_now = !synchronized_ && !skip_;
    if (reduce_now && (no_sync_ || accumulated_ + 1 < options_.backward_passes_per_step)) {
      accumulate();
      return false;
    }
    if (reduce_now) {
      synchronize();
    } else if (!synchronized_ && accumulated_ > 0) {
      std::vector<buffer_view> grads = gradients_();  // skipped mid-round: the passes so far still count, locally
      std::string fault = check(grads);
      if (fault.empty()) fault = std::exchange(pending_fault_, {});
      if (!fault.empty()) {
        accumulated_ = 0;  // the round is abandoned
        raise_alone(fault);
      }
      fold_accumulated(grads);
    }
    inner_.step();
    synchronized_ = false;
    accumulated_ = 0;
    return true;
  }

  // Reduces the gradients now (folding in the passes accumulated so far); the next step() uses
  // them without reducing again.
  void synchronize() {
    if (marks_ > 0) {
      finish_buckets();
      synchronized_ = true;
      return;
    }
    if (options_.uneven_inputs) agree_on_active(1);
    reduce_gradients();
    synchronized_ = true;
  }

  // This rank has no batches left (with optimizer_options::uneven_inputs): until every rank has
  // joined, it takes part in the other ranks' reductions with zero gradients (without stepping its
  // optimizer), so that nobody waits forever. Returns the last rank to join (Horovod's join()):
  // broadcast the parameters from it if the ranks' steps differed in number.
  int join() {
    if (!options_.uneven_inputs) {
      raise_alone("join() needs optimizer_options::uneven_inputs (on every rank), so that each step agrees on "
                  "which ranks still train");
    }
    accumulated_ = 0;
    synchronized_ = false;
    joining_ = true;
    try {
      while (const int mode = agree_on_active(0)) {
        std::vector<buffer_view> grads = gradients_();
        with_mover(grads, [&](auto& mover) {
          mover.begin();
          for (const auto& g : grads) mover.zero(g);
          mover.finish();
        });
        if (mode == 2) {  // the others reduce in buckets: mark every (zero) gradient, as they do theirs
          for (std::size_t i = 0; i < grads.size(); ++i) mark(i, nullptr);
          finish_buckets();
        } else {
          reduce_gradients();
        }
      }
    } catch (...) {
      joining_ = false;
      throw;
    }
    joining_ = false;
    return last_joined_;
  }

  // Ranks still training in the last reducing step (with uneven_inputs).
  int active_ranks() const noexcept { return active_ranks_; }

 private:
  // Every rank says whether it still trains, and how: 0 joined, 1 reducing in step(), 2 reducing
  // in mark_ready's buckets. Returns the largest (0: every rank has joined), remembering how many
  // still train and the highest of them (the last to join, once they all have).
  int agree_on_active(std::uint8_t mode) {
    const std::vector<std::uint8_t> mine = {mode};
    std::vector<std::uint8_t> all(static_cast<std::size_t>(comm_.size()));
    allgather(mine, all, detail::control_of(comm_));
    int count = 0, highest = -1, largest = 0;
    for (int r = 0; r < comm_.size(); ++r) {
      const int m = all[static_cast<std::size_t>(r)];
      if (m != 0) ++count, highest = r;
      largest = std::max(largest, m);
    }
    if (count > 0) {
      active_ranks_ = count;
      last_joined_ = highest;
    }
    return largest;
  }

  void reduce_gradients() {
    std::vector<buffer_view> grads = gradients_();
    std::string fault = check(grads);
    if (fault.empty()) fault = std::exchange(pending_fault_, {});
    if (!fault.empty()) {
      accumulated_ = 0;
      raise_everywhere(fault);
    }
    fold_accumulated(grads);
    with_mover(grads, [&](auto& mover) { reduce(grads, mover); });
  }

 public:

  // While the returned guard lives, step() does not reduce (each call steps the wrapped optimizer
  // with the local gradients, folding in any passes accumulated so far): for gradients reduced
  // some other way, or for deliberately local steps.
  class skip_guard {
   public:
    explicit skip_guard(distributed_optimizer& o) : owner_(&o) { owner_->skip_ = true; }
    skip_guard(skip_guard&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    skip_guard(const skip_guard&) = delete;
    skip_guard& operator=(const skip_guard&) = delete;
    skip_guard& operator=(skip_guard&&) = delete;
    ~skip_guard() {
      if (owner_) owner_->skip_ = false;
    }

   private:
    distributed_optimizer* owner_;
  };
  [[nodiscard]] skip_guard skip_synchronize() { return skip_guard(*this); }

  // While the returned guard lives, step() only accumulates the gradients locally (and does not
  // step the wrapped optimizer): DDP's no_sync(). The first step() after it reduces the sum of
  // every pass since the last reduction.
  class no_sync_guard {
   public:
    explicit no_sync_guard(distributed_optimizer& o) : owner_(&o) { owner_->no_sync_ = true; }
    no_sync_guard(no_sync_guard&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (owner_) owner_->no_sync_ = false;
    }

   private:
    distributed_optimizer* owner_;
  };
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  // Gradient i is final for this backward pass: its bucket starts reducing once all of its
  // gradients are. The first form reads the gradient from the list the optimizer was given (the
  // source is called once per pass); the second takes its current view. Call from one thread at a
  // time. In passes that only accumulate (no_sync, backward_passes_per_step) it does nothing.
  // From then until step() returns the gradient is herd's: the reduction may read it, and write
  // the reduced values into it, at any moment (as with DDP's gradient_as_bucket_view).
  void mark_ready(std::size_t i) { mark(i, nullptr); }
  void mark_ready(std::size_t i, const buffer_view& gradient) { mark(i, &gradient); }

  // Which gradients share a bucket now (indices into the gradient list), in launch order.
  std::vector<std::vector<std::size_t>> buckets() const {
    std::vector<std::vector<std::size_t>> out;
    for (const auto& b : plan_.buckets) out.push_back(b.members);
    return out;
  }
  const overlap_stats& overlap() const noexcept { return stats_; }

  Optimizer& inner() noexcept { return inner_; }
  C& comm() noexcept { return comm_; }
  const optimizer_options& options() const noexcept { return options_; }
  // Backward passes accumulated locally since the last reduction.
  int accumulated_passes() const noexcept { return accumulated_; }
  // Seconds spent reducing gradients since construction: packing, casting, communication, and
  // waiting for ranks that reach the reduction later (so it also shows imbalance between ranks).
  double reduce_seconds() const noexcept { return reduce_seconds_; }

 private:
  // The first call checks the gradients on every rank together (and raises on every rank);
  // later calls check this rank's own and return what is wrong ("" when nothing is), for the next
  // reduction to raise on every rank.
  std::string check(const std::vector<buffer_view>& grads) {
    std::string fault = local_fault(grads);
    if (!checked_) {
      detail::require_same_tensors(grads, comm_, "distributed_optimizer", "gradient", fault);
      require_same_options();
      shapes_.clear();
      for (const auto& g : grads) shapes_.emplace_back(g.count, g.type);
      device_ = grads.empty() ? device::cpu() : grads[0].device;
      checked_ = true;
      return {};
    }
    bool same = grads.size() == shapes_.size();
    for (std::size_t i = 0; same && i < grads.size(); ++i) same = shapes_[i] == std::make_pair(grads[i].count, grads[i].type);
    if (fault.empty() && !same) fault = "the gradients changed since the first step (their number, sizes or dtypes)";
    return fault;
  }

  // Raises `fault` on every rank: it travels in the agreement of the reduction the other ranks
  // start now (with argument checks off, it aborts the communicator, which tells them).
  [[noreturn]] void raise_everywhere(const std::string& fault) {
    if (comm_.size() == 1) raise_alone(fault);
    detail::call_check failed(detail::op_kind::allreduce, comm_.rank(), comm_.size());
    failed.fail(14, fault, "Hand the distributed optimizer the same gradient tensors, on one device, at every step");
    const auto call = detail::prepare_allreduce(std::move(failed), {}, buffer_view{}, comm_, reduce_op::sum);
    detail::run_collective(comm_, call.label(), [&](bool sync) { detail::run_allreduce(comm_, call, sync); });
    raise_alone(fault);  // not reached: the agreement raised
  }

  [[noreturn]] void raise_alone(const std::string& fault) const {
    detail::raise({"distributed_optimizer", comm_.rank(), comm_.size()}, fault,
                  "Hand the distributed optimizer the same gradient tensors, on one device, at every step");
  }

  void require_same_options() {
    const std::vector<std::int64_t> mine = {
        static_cast<std::int64_t>(options_.op), static_cast<std::int64_t>(options_.compression),
        static_cast<std::int64_t>(options_.fusion_threshold_bytes), options_.backward_passes_per_step,
        std::bit_cast<std::int64_t>(options_.gradient_predivide_factor), static_cast<std::int64_t>(options_.bucket_bytes),
        static_cast<std::int64_t>(options_.first_bucket_bytes), options_.find_unused_parameters ? 1 : 0,
        options_.gradient_as_bucket_view ? 1 : 0, options_.uneven_inputs ? 1 : 0, options_.divide_by_active_ranks ? 1 : 0};
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_.size()));
    allgather(mine, all, detail::control_of(comm_));
    static const char* const names[] = {"op",
                                        "compression",
                                        "fusion_threshold_bytes",
                                        "backward_passes_per_step",
                                        "gradient_predivide_factor",
                                        "bucket_bytes",
                                        "first_bucket_bytes",
                                        "find_unused_parameters",
                                        "gradient_as_bucket_view",
                                        "uneven_inputs",
                                        "divide_by_active_ranks"};
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm_.size()); ++r) {
      for (std::size_t k = 0; k < mine.size(); ++k) {
        if (all[r * mine.size() + k] != all[k]) {
          detail::raise({"distributed_optimizer", comm_.rank(), comm_.size()},
                std::string("option ") + names[k] + " differs between rank 0 and rank " + std::to_string(r),
                "Give every rank the same optimizer_options (and the same HERD_FUSION_THRESHOLD and HERD_BUCKET_BYTES)");
        }
      }
    }
  }

  void accumulate() {
    std::vector<buffer_view> grads = gradients_();
    if (std::string fault = check(grads); !fault.empty() || !pending_fault_.empty()) {
      if (pending_fault_.empty()) pending_fault_ = fault;  // raised by the reduction that ends this round
      ++accumulated_;
      return;
    }
    const bool first = accumulated_ == 0;
    with_mover(grads, [&](auto& mover) {
      mover.begin();
      if (first) accumulators_.clear();
      for (std::size_t i = 0; i < grads.size(); ++i) {
        if (first) accumulators_.push_back(mover.accumulator(i, detail::accumulation_dtype(grads[i].type), grads[i].count));
        mover.accumulate(accumulators_[i], grads[i], first);
      }
      mover.finish();
    });
    ++accumulated_;
  }

  // grads = the sum of the accumulated passes and the current one.
  void fold_accumulated(const std::vector<buffer_view>& grads) {
    if (accumulated_ == 0) return;
    with_mover(grads, [&](auto& mover) {
      mover.begin();
      for (std::size_t i = 0; i < grads.size(); ++i) mover.fold(grads[i], accumulators_[i]);
      mover.finish();
    });
    accumulated_ = 0;
  }

  // What is wrong with this rank's gradients on their own ("" when nothing is): every one in host
  // memory, or every one on the same GPU.
  std::string local_fault(const std::vector<buffer_view>& grads) const {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const auto& g = grads[i];
      if (!is_valid(g.type)) return "gradient " + std::to_string(i) + " has an invalid dtype (check its tensor_traits::dtype)";
      if (g.data == nullptr && g.count != 0) {
        return "gradient " + std::to_string(i) + " has a null data pointer and " + std::to_string(g.count) + " elements";
      }
      if (g.device != grads[0].device) {
        return "gradient " + std::to_string(i) + " lives on " + g.device.str() + " but gradient 0 on " +
               grads[0].device.str() + " (keep all gradients of one distributed optimizer on one device)";
      }
    }
#if !HERD_WITH_CUDA_KERNELS && !defined(HERD_WITH_NCCL)
    if (!grads.empty() && grads[0].device.is_cuda()) {
      return "the gradients live on " + grads[0].device.str() +
             " but this file was compiled without CUDA (compile it with nvcc, or link herd::nccl and use a "
             "nccl_communicator)";
    }
#endif
    return {};
  }

  // Calls f with the mover for where the gradients live.
  template <class F> void with_mover([[maybe_unused]] const std::vector<buffer_view>& grads, F&& f) {
#if HERD_WITH_CUDA_KERNELS || defined(HERD_WITH_NCCL)
    if (!grads.empty() && grads[0].device.is_cuda()) {
      if (!device_mover_ || device_index_ != grads[0].device.index) {
        device_mover_.emplace(grads[0].device.index);
        device_index_ = grads[0].device.index;
        if constexpr (requires { comm_.stream(); }) device_mover_->follow(comm_.stream());
      }
      return f(*device_mover_);
    }
#endif
    f(host_mover_);
  }

  // Groups the gradients by dtype (in order of first appearance), packs each group into buffers
  // of up to the fusion threshold, and reduces each buffer with one allreduce.
  template <class Mover> void reduce(const std::vector<buffer_view>& grads, Mover& mover) {
    if (comm_.size() == 1) return;  // the average (or sum) over one rank is the gradient itself
    const auto start = std::chrono::steady_clock::now();
    set_scales();

    std::vector<bool> done(grads.size(), false);
    for (std::size_t first = 0; first < grads.size(); ++first) {
      if (done[first]) continue;
      const dtype type = grads[first].type;
      const dtype wire = wire_dtype(options_.compression, type);
      std::vector<std::size_t> bucket;
      std::size_t bucket_bytes = 0;
      for (std::size_t i = first; i < grads.size(); ++i) {
        if (done[i] || grads[i].type != type) continue;
        done[i] = true;
        const std::size_t bytes = grads[i].count * size_of(wire);
        if (!bucket.empty() && bucket_bytes + bytes > options_.fusion_threshold_bytes) {
          reduce_bucket(grads, bucket, wire, mover);
          bucket.clear();
          bucket_bytes = 0;
        }
        bucket.push_back(i);
        bucket_bytes += bytes;
      }
      if (!bucket.empty()) reduce_bucket(grads, bucket, wire, mover);
    }
    reduce_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  template <class Mover>
  void reduce_bucket(const std::vector<buffer_view>& grads, const std::vector<std::size_t>& bucket, dtype wire,
                     Mover& mover) {
    const buffer_view& lone = grads[bucket.front()];
    if (bucket.size() == 1 && wire == lone.type && scale_before_ == 1.0 && scale_after_ == 1.0) {
      buffer_view in_place = lone;
      allreduce(in_place, comm_, wire_op_);
      return;
    }
    if (wire == lone.type && scale_before_ == 1.0 && scale_after_ == 1.0 && reduced_in_shared_memory(grads, bucket)) {
      return;
    }
    std::size_t total = 0;
    for (std::size_t i : bucket) total += grads[i].count;
    buffer_view packed = mover.fusion(wire, total);
    auto* base = static_cast<std::byte*>(packed.data);
    std::vector<detail::move_item> pack;
    std::vector<detail::move_item> unpack;
    std::size_t at = 0;
    for (std::size_t i : bucket) {
      pack.push_back({grads[i].data, base + at * size_of(wire), grads[i].count});
      unpack.push_back({base + at * size_of(wire), grads[i].data, grads[i].count});
      at += grads[i].count;
    }
    {
      const detail::trace::span phase(track_, "pack", detail::trace::fields::elements(total, wire));
      mover.begin();
      mover.move(pack, wire, lone.type, scale_before_);
      mover.finish();
    }
    allreduce(packed, comm_, wire_op_);
    const detail::trace::span phase(track_, "unpack", detail::trace::fields::elements(total, wire));
    mover.begin();
    mover.move(unpack, lone.type, wire, scale_after_);
    mover.finish();
  }

  // When every rank shares a node (mpi_communicator's shared memory), the group goes into shared
  // memory and back straight from and into the gradients: no fusion buffer, no packing copies.
  // False (nothing done) where that does not apply.
  bool reduced_in_shared_memory(const std::vector<buffer_view>& grads, const std::vector<std::size_t>& bucket) {
    std::vector<buffer_view> parts;
    parts.reserve(bucket.size());
    for (std::size_t i : bucket) parts.push_back(grads[i]);
    if (!detail::reduces_in_shared_memory(comm_, parts)) return false;
    detail::allreduce_in_shared_memory(comm_, parts, wire_op_);
    return true;
  }

  // --- Buckets (mark_ready).

  struct bucket_state {
    buffer_view buffer;          // what its allreduce reduces: the packed bucket, or its lone gradient
    std::size_t waiting = 0;     // gradients not yet ready in this pass
    std::string fault;           // this rank's problem with one of its gradients in this pass
    std::uint32_t fault_code = 14;  // its code for the other ranks (comm/detail/agreement.hpp)
    bool in_place = false;       // buffer is the gradients themselves: nothing to unpack
    std::optional<handle> done;  // its operation, once started
    std::shared_ptr<std::atomic<double>> seconds = std::make_shared<std::atomic<double>>(0.0);
  };

  // scale_before_/scale_after_/wire_op_ for the options (gradient_predivide_factor).
  void set_scales() {
    const bool average = options_.op == reduce_op::avg;
    // The average's divisor: the world size, or the ranks still training (uneven_inputs).
    const int divisor = options_.uneven_inputs && options_.divide_by_active_ranks ? active_ranks_ : comm_.size();
    // Every gradient 16-bit on the wire: the average is divided before the sum, as DDP does, so
    // that no average within f16's range overflows in the sum (two ranks averaging 40000).
    const bool narrow = !shapes_.empty() && std::all_of(shapes_.begin(), shapes_.end(), [&](const auto& shape) {
      return size_of(wire_dtype(options_.compression, shape.second)) == 2;
    });
    const double f = narrow ? static_cast<double>(divisor) : options_.gradient_predivide_factor;
    const bool scaled = average && (f != 1.0 || divisor != comm_.size());
    scale_before_ = scaled ? 1.0 / f : 1.0;
    scale_after_ = scaled ? f / divisor : 1.0;
    wire_op_ = scaled ? reduce_op::sum : options_.op;
  }

  // Whether this pass reduces (rather than accumulates, skips, or runs alone).
  bool reducing_pass() const {
    return comm_.size() > 1 && !skip_ && !no_sync_ && !synchronized_ &&
           (joining_ || accumulated_ + 1 >= options_.backward_passes_per_step);
  }

  const std::vector<buffer_view>& pass_views() {
    if (pass_views_.empty()) pass_views_ = gradients_();
    return pass_views_;
  }

  void mark(std::size_t i, const buffer_view* given) {
    if (!reducing_pass()) return;
    const auto start = std::chrono::steady_clock::now();
    if (marks_ == 0) begin_buckets();
    if (i >= shapes_.size()) {
      if (pass_fault_.empty()) {
        pass_fault_ = "mark_ready(" + std::to_string(i) + ") names no gradient (there are " +
                      std::to_string(shapes_.size()) + ")";
      }
      return;
    }
    if (marked_[i]) {
      if (pass_fault_.empty()) pass_fault_ = "gradient " + std::to_string(i) + " was marked ready twice in one pass";
      return;
    }
    const buffer_view v = given ? *given : (i < pass_views().size() ? pass_views()[i] : buffer_view{});
    bucket_state& b = buckets_[plan_.bucket_of[i]];
    if (b.fault.empty()) {
      if (v.count != shapes_[i].first || v.type != shapes_[i].second) {
        b.fault = "gradient " + std::to_string(i) + " changed since the first step (" + std::to_string(v.count) + " " +
                  std::string(name(v.type)) + " instead of " + std::to_string(shapes_[i].first) + " " +
                  std::string(name(shapes_[i].second)) + ")";
      } else if (v.data == nullptr && v.count != 0) {
        b.fault = "gradient " + std::to_string(i) + " has a null data pointer";
      } else if (v.device != device_) {
        b.fault = "gradient " + std::to_string(i) + " lives on " + v.device.str() + " but the first one on " +
                  device_.str() + " (keep all gradients of one distributed optimizer on one device)";
      }
    }
    marked_[i] = 1;
    ++marks_;
    ready_views_[i] = v;
    if (!rebuilt_) ready_order_.push_back(i);
    --b.waiting;
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0) launch(next_launch_++);
    stats_.exposed += seconds_since(start);
  }

  // The first mark of a pass: the first-step checks, the plan, and a fresh pass.
  void begin_buckets() {
    // With uneven_inputs the ranks first agree on who trains (a joined rank agreed in join()).
    if (options_.uneven_inputs && !joining_) agree_on_active(2);
    if (!checked_) check(gradients_());  // every rank's first mark: agreed there, or raised on every rank
    if (plan_.buckets.empty() && !shapes_.empty()) make_plan(detail::bucket_plan::reverse_order(shapes_.size()));
    set_scales();
    marked_.assign(shapes_.size(), 0);
    ready_views_.assign(shapes_.size(), buffer_view{});
    pass_views_.clear();
    pass_fault_.clear();
    ready_order_.clear();  // the rebuild follows the first pass that succeeds
    next_launch_ = 0;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].waiting = plan_.buckets[b].members.size();
      buckets_[b].fault.clear();
      buckets_[b].fault_code = 14;
      buckets_[b].in_place = false;
      buckets_[b].done.reset();
      buckets_[b].seconds->store(0.0);
    }
  }

  void make_plan(const std::vector<std::size_t>& order) {
    plan_ = detail::bucket_plan::make(shapes_, order, options_.first_bucket_bytes, options_.bucket_bytes,
                                      detail::member_alignment(device_));
    buckets_.clear();
    buckets_.resize(plan_.buckets.size());
  }

  // Packs bucket b (folding in accumulated passes) and starts its allreduce; a bucket this rank
  // found a problem with starts an operation that carries the problem instead, so that every rank
  // raises it and the buckets after it still pair up.
  void launch(std::size_t b) {
    bucket_state& st = buckets_[b];
    const detail::bucket_plan::bucket& plan = plan_.buckets[b];
    // In the timeline: packing and starting it, with the sequence number its operation takes.
    detail::trace::fields args = detail::trace::fields::elements(plan.count, plan.type);
    if (detail::trace::on()) args.seq = comm_.operations().issued();  // issued() takes a lock: only when traced
    args.extra_name = "bucket";
    args.extra = static_cast<std::int64_t>(b);
    const detail::trace::span slice(track_, "launch bucket", args);
    const std::string& fault = !pass_fault_.empty() ? pass_fault_ : st.fault;
    if (!fault.empty()) {
      detail::call_check failed(detail::op_kind::allreduce, comm_.rank(), comm_.size());
      failed.fail(!pass_fault_.empty() ? 14 : st.fault_code, fault, "Hand the distributed optimizer the same gradient tensors, on one device, at every step, "
                             "and mark each ready once per backward pass");
      start_bucket(st, std::move(failed), buffer_view{});
      return;
    }
    const dtype wire = wire_dtype(options_.compression, plan.type);
    bool started = false;
    with_device_mover([&](auto& mover) {
      mover.begin();
      if (accumulated_ > 0) {
        for (std::size_t i : plan.members) {
          if (marked_[i]) mover.fold(ready_views_[i], accumulators_[i]);
        }
      }
      const bool as_is = wire == plan.type && scale_before_ == 1.0 && scale_after_ == 1.0;
      st.in_place = as_is && lives_in_place(plan);
      if (as_is && !st.in_place && shared_memory_bucket(b)) {
        mover.finish();
        started = true;
        return;
      }
      if (st.in_place) {
        mover.finish();
        const buffer_view& first = ready_views_[plan.members.front()];
        st.buffer = {first.data, plan.count, plan.type, first.device};
      } else {
        st.buffer = mover.bucket(b, wire, plan.count);
        auto* base = static_cast<std::byte*>(st.buffer.data);
        std::vector<detail::move_item> pack, unused;
        for (std::size_t k = 0; k < plan.members.size(); ++k) {
          const std::size_t i = plan.members[k];
          void* slot = base + plan.offsets[k] * size_of(wire);
          if (marked_[i]) {
            pack.push_back({ready_views_[i].data, slot, shapes_[i].first});
          } else {  // unused in this pass (find_unused_parameters): zeros, plus the passes accumulated
            mover.zero({slot, shapes_[i].first, wire, device_});
            if (accumulated_ > 0) unused.push_back({accumulators_[i].data, slot, shapes_[i].first});
          }
        }
        mover.move(pack, wire, plan.type, scale_before_);
        mover.move(unused, wire, detail::accumulation_dtype(plan.type), scale_before_);
        mover.finish();
        stats_.packed_bytes += plan.count * size_of(plan.type);
      }
    });
    if (started) return;
    detail::call_check fine(detail::op_kind::allreduce, comm_.rank(), comm_.size());
    start_bucket(st, std::move(fine), st.buffer);
  }

  // When every rank shares a node and all of bucket b's gradients were marked, its allreduce goes
  // through shared memory straight from and into them (as gradient_as_bucket_view, without asking
  // for a layout): no packing, nothing to unpack. False (nothing started) where that does not apply.
  bool shared_memory_bucket(std::size_t b) {
    const detail::bucket_plan::bucket& plan = plan_.buckets[b];
    std::vector<buffer_view> parts;
    parts.reserve(plan.members.size());
    for (std::size_t i : plan.members) {
      if (!marked_[i]) return false;
      parts.push_back(ready_views_[i]);
    }
    if (!detail::reduces_in_shared_memory(comm_, parts)) return false;
    bucket_state& st = buckets_[b];
    st.in_place = true;
    st.buffer = {};
    auto [label, body] = detail::allreduce_in_shared_memory_body(comm_, std::move(parts), wire_op_);
    st.done.emplace(detail::start_collective(comm_, label, [body = std::move(body), seconds = st.seconds](bool sync) {
      const auto start = std::chrono::steady_clock::now();
      body(sync);
      seconds->store(seconds_since(start));
    }));
    return true;
  }

  // Whether the bucket's gradients were all marked and follow each other in memory in its order
  // (a single gradient always does): then the bucket is reduced where they are.
  bool lives_in_place(const detail::bucket_plan::bucket& plan) const {
    const auto* base = static_cast<const std::byte*>(ready_views_[plan.members.front()].data);
    for (std::size_t k = 0; k < plan.members.size(); ++k) {
      const std::size_t i = plan.members[k];
      if (!marked_[i] || ready_views_[i].data != base + plan.offsets[k] * size_of(plan.type)) return false;
    }
    return true;
  }

  void start_bucket(bucket_state& st, detail::call_check check, buffer_view v) {
    auto call = detail::prepare_allreduce(std::move(check), v, v, comm_, wire_op_);
    const auto label = call.label();
    st.done.emplace(detail::start_collective(
        comm_, label, [&comm = comm_, call = std::move(call), seconds = st.seconds](bool sync) {
          const auto start = std::chrono::steady_clock::now();
          detail::run_allreduce(comm, call, sync);
          seconds->store(seconds_since(start));
        }));
  }

  // step()'s part: starts the buckets left (gradients never marked: an error, or zeros with
  // find_unused_parameters), waits for all, unpacks, and rebuilds the buckets after the first pass.
  void finish_buckets() {
    const auto start = std::chrono::steady_clock::now();
    std::exception_ptr failure;
    for (std::size_t b = next_launch_; b < buckets_.size(); ++b) {
      std::string missing;
      for (std::size_t i : plan_.buckets[b].members) {
        if (!marked_[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      }
      if (!missing.empty() && !options_.find_unused_parameters && buckets_[b].fault.empty()) {
        buckets_[b].fault_code = 16;
        buckets_[b].fault = "gradient(s) " + missing +
                            " were not marked ready in this backward pass (pass find_unused_parameters = true to "
                            "reduce gradients a pass did not produce as zeros)";
      }
      try {
        launch(b);
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    next_launch_ = buckets_.size();
    const auto wait_start = std::chrono::steady_clock::now();
    {
      const detail::trace::span phase(track_, "wait for buckets");
      for (bucket_state& st : buckets_) {
        if (!st.done) continue;
        try {
          st.done->wait();
        } catch (...) {
          if (!failure) failure = std::current_exception();
        }
      }
    }
    stats_.waiting += seconds_since(wait_start);
    for (const bucket_state& st : buckets_) stats_.communication += st.seconds->load();
    marks_ = 0;
    if (failure) {
      accumulated_ = 0;  // the round is abandoned
      std::rethrow_exception(failure);
    }
    with_device_mover([&](auto& mover) {
      const detail::trace::span phase(track_, "unpack buckets");
      mover.begin();
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const detail::bucket_plan::bucket& plan = plan_.buckets[b];
        if (buckets_[b].in_place) continue;
        const dtype wire = buckets_[b].buffer.type;
        const auto* base = static_cast<const std::byte*>(buckets_[b].buffer.data);
        std::vector<detail::move_item> unpack;
        for (std::size_t k = 0; k < plan.members.size(); ++k) {
          const std::size_t i = plan.members[k];
          if (!marked_[i] && i >= pass_views().size()) continue;
          const buffer_view to = marked_[i] ? ready_views_[i] : pass_views()[i];
          unpack.push_back({base + plan.offsets[k] * size_of(wire), to.data, shapes_[i].first});
        }
        mover.move(unpack, plan.type, wire, scale_after_);
      }
      mover.finish();
    });
    accumulated_ = 0;
    ++stats_.steps;
    stats_.exposed += seconds_since(start);
    reduce_seconds_ += seconds_since(start);
    if (!rebuilt_ && !options_.gradient_as_bucket_view) rebuild();
  }

  // Once, after the first overlapped step: buckets in the order rank 0's gradients became ready
  // (those it never saw ready last, in reverse order), the same plan on every rank.
  void rebuild() {
    std::vector<std::int64_t> order(shapes_.size());
    std::vector<char> placed(shapes_.size(), 0);
    std::size_t at = 0;
    for (std::size_t i : ready_order_) {
      order[at++] = static_cast<std::int64_t>(i);
      placed[i] = 1;
    }
    for (std::size_t i = shapes_.size(); i-- > 0;) {
      if (!placed[i]) order[at++] = static_cast<std::int64_t>(i);
    }
    broadcast(order, detail::control_of(comm_), 0);
    std::vector<std::size_t> chosen(order.begin(), order.end());
    make_plan(chosen);
    rebuilt_ = true;
    ready_order_.clear();
  }

  template <class F> void with_device_mover(F&& f) {
    std::vector<buffer_view> where;
    if (device_.is_cuda()) where.push_back({nullptr, 0, dtype::f32, device_});
    with_mover(where, std::forward<F>(f));
  }

  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  Optimizer& inner_;
  gradient_source gradients_;
  C& comm_;
  optimizer_options options_;
  bool checked_ = false;
  std::string pending_fault_;  // found while accumulating; the round's reduction raises it
  bool synchronized_ = false;
  bool skip_ = false;
  bool joining_ = false;   // in join(): shadowing the others' reductions
  int active_ranks_ = 0;   // uneven_inputs: ranks training in the last reducing step (0: none agreed yet)
  int last_joined_ = -1;   // ...and the highest of them
  bool no_sync_ = false;
  int accumulated_ = 0;
  std::vector<std::pair<std::size_t, dtype>> shapes_;
  std::vector<buffer_view> accumulators_;
  detail::host_mover host_mover_;
#if HERD_WITH_CUDA_KERNELS || defined(HERD_WITH_NCCL)
  std::optional<detail::device_mover> device_mover_;
  int device_index_ = -1;
#endif
  double scale_before_ = 1.0;
  double scale_after_ = 1.0;
  reduce_op wire_op_ = reduce_op::avg;
  double reduce_seconds_ = 0;
  std::uint32_t track_ = detail::trace::new_track();  // in the timeline
  std::int64_t step_calls_ = 0;

  // Buckets (mark_ready).
  device device_ = device::cpu();  // where the gradients live (the first one's device)
  detail::bucket_plan plan_;
  std::vector<bucket_state> buckets_;
  std::vector<buffer_view> ready_views_;  // per gradient: its view in this pass, once marked
  std::vector<char> marked_;
  std::size_t marks_ = 0;                 // gradients marked in this pass
  std::size_t next_launch_ = 0;           // the next bucket to start
  std::string pass_fault_;                // a problem of this pass not tied to one bucket
  std::vector<buffer_view> pass_views_;   // gradients_() of this pass, read on demand
  std::vector<std::size_t> ready_order_;  // the order gradients became ready, until the rebuild
  bool rebuilt_ = false;
  overlap_stats stats_;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_OPTIM_DISTRIBUTED_OPTIMIZER_HPP
