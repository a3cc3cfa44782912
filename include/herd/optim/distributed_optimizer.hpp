#pragma once
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
// - Compression: f32/f64 gradients cross the wire as f16 or bf16 (optim/compression.hpp).
// - gradient_predivide_factor f: gradients are scaled by 1/f before the sum and by f/size after
//   (for op avg), which keeps sums of many large gradients from overflowing in f16.
// - backward_passes_per_step k: call step() after every backward pass; the first k-1 calls of a
//   round only accumulate the gradients locally, the k-th reduces the mean over the k passes and
//   steps the wrapped optimizer. The effective batch is k × ranks × per-rank batch.
// - synchronize() reduces now (to clip or inspect the averaged gradients before step());
//   a later step() then does not reduce again. skip_synchronize() makes the next step() skip
//   the reduction altogether.
// - The first reduction checks that every rank holds the same gradients (count, sizes, dtypes)
//   and the same options, and raises herd::error on every rank if not. Later steps check that
//   this rank's gradients are still those (and on one device); a rank whose are not says so in
//   the agreement of its next reduction, so that every rank raises, not just that one.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/detail/gradient_movers.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/runtime/env.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <bit>
#include <chrono>
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
};

HERD_CONFIG_NAMESPACE_BEGIN

template <class Optimizer, communicator C> class distributed_optimizer {
 public:
  // Returns the current gradient views; for tensor libraries that reallocate gradients between steps.
  using gradient_source = std::function<std::vector<buffer_view>()>;

  distributed_optimizer(Optimizer& inner, std::vector<buffer_view> gradients, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, gradient_source([g = std::move(gradients)] { return g; }), comm, options) {}

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
  }

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  // Call once per backward pass. Returns true when this call reduced the gradients (unless
  // already synchronized or skipped) and stepped the wrapped optimizer.
  bool step() {
    const bool reduce_now = !synchronized_ && !skip_;
    if (reduce_now && accumulated_ + 1 < options_.backward_passes_per_step) {
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
    std::vector<buffer_view> grads = gradients_();
    std::string fault = check(grads);
    if (fault.empty()) fault = std::exchange(pending_fault_, {});
    if (!fault.empty()) {
      accumulated_ = 0;
      raise_everywhere(fault);
    }
    fold_accumulated(grads);
    with_mover(grads, [&](auto& mover) { reduce(grads, mover); });
    synchronized_ = true;
  }

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
        std::bit_cast<std::int64_t>(options_.gradient_predivide_factor)};
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_.size()));
    allgather(mine, all, detail::control_of(comm_));
    static const char* const names[] = {"op", "compression", "fusion_threshold_bytes", "backward_passes_per_step",
                                        "gradient_predivide_factor"};
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm_.size()); ++r) {
      for (std::size_t k = 0; k < mine.size(); ++k) {
        if (all[r * mine.size() + k] != all[k]) {
          detail::raise({"distributed_optimizer", comm_.rank(), comm_.size()},
                std::string("option ") + names[k] + " differs between rank 0 and rank " + std::to_string(r),
                "Give every rank the same optimizer_options (and the same HERD_FUSION_THRESHOLD)");
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

  // grads = the mean of the accumulated passes and the current one.
  void fold_accumulated(const std::vector<buffer_view>& grads) {
    if (accumulated_ == 0) return;
    with_mover(grads, [&](auto& mover) {
      mover.begin();
      for (std::size_t i = 0; i < grads.size(); ++i)
        mover.fold_mean(grads[i], accumulators_[i], static_cast<double>(accumulated_ + 1));
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
    const bool average = options_.op == reduce_op::avg;
    const double f = options_.gradient_predivide_factor;
    scale_before_ = average && f != 1.0 ? 1.0 / f : 1.0;
    scale_after_ = average && f != 1.0 ? f / comm_.size() : 1.0;
    wire_op_ = average && f != 1.0 ? reduce_op::sum : options_.op;

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
    mover.begin();
    mover.move(pack, wire, lone.type, scale_before_);
    mover.finish();
    allreduce(packed, comm_, wire_op_);
    mover.begin();
    mover.move(unpack, lone.type, wire, scale_after_);
    mover.finish();
  }

  Optimizer& inner_;
  gradient_source gradients_;
  C& comm_;
  optimizer_options options_;
  bool checked_ = false;
  std::string pending_fault_;  // found while accumulating; the round's reduction raises it
  bool synchronized_ = false;
  bool skip_ = false;
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
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd
