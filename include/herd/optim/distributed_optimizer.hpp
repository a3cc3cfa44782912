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
//   (for op avg), which keeps sums of many large gradients from overflowing in f16. Gradients
//   that are 16-bit on the wire (f16/bf16 gradients, or compression) are always averaged with
//   f = the divisor, as DDP divides before its sum, whatever the dtypes beside them: no average
//   within range overflows.
// - backward_passes_per_step k: call step() after every backward pass; the first k-1 calls of a
//   round do not reduce, the k-th reduces the *sum* of the k passes (as Horovod, and as
//   libtorch's own gradient accumulation: divide the loss by k for their mean) and steps the
//   wrapped optimizer. no_sync() does the same for as long as its guard lives. How the passes add
//   up (accumulate): by default PyTorch's way (accumulation::in_gradients), the backward passes
//   add into the gradients, zeroed once per optimizer step, and herd leaves them alone until the
//   reduction (a gradient the last pass did not mark, with find_unused_parameters, is reduced as
//   the earlier passes left it, as DDP's); with accumulation::by_copy, for backward passes that
//   overwrite the gradients, herd keeps the running sum itself. (The default was by_copy before: code whose passes overwrite
//   the gradients must now ask for it, or it reduces the last pass alone.)
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

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/accumulation.hpp>
#include <herd/optim/detail/reducer.hpp>
#include <herd/optim/detail/scoped_switch.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {
namespace detail {
// A gradient source that also wants to hear, on every rank, that the gradients were reduced.
template <class Source, class C>
concept reduction_aware_source = std::is_invocable_r_v<std::vector<buffer_view>, const Source&> &&
                                 requires(const Source& source, C& comm) { source.after_reduction(comm); };
}  // namespace detail

HERD_CONFIG_NAMESPACE_BEGIN

// The reducing itself (buckets, fusion, the policy, join's rounds) is detail::reducer's
// (optim/detail/reducer.hpp); this class adds the wrapped optimizer, the rounds of local
// accumulation (detail/accumulation.hpp), synchronize() and skip_synchronize().
template <class Optimizer, communicator C> class distributed_optimizer {
 private:
  // What the guards of skip_synchronize() and no_sync() turn on and off.
  struct skip_switch {
    distributed_optimizer* owner;
    void operator()(bool on) const noexcept { owner->skip_ = on; }
  };
  struct no_sync_switch {
    distributed_optimizer* owner;
    void operator()(bool on) const noexcept { owner->accumulation_.set_no_sync(on); }
  };

 public:
  // Returns the current gradient views; for tensor libraries that reallocate gradients between steps.
  using gradient_source = std::function<std::vector<buffer_view>()>;

  distributed_optimizer(Optimizer& inner, std::vector<buffer_view> gradients, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, gradient_source([g = std::move(gradients)] { return g; }), comm, options) {}

  // The gradients of a parameters list (optim/parameters.hpp).
  distributed_optimizer(Optimizer& inner, const parameters& params, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, params.gradients, comm, options) {}

  distributed_optimizer(Optimizer& inner, gradient_source gradients, C& comm, optimizer_options options = {})
      : inner_(inner),
        comm_(comm),
        options_(options),
        accumulation_(options.backward_passes_per_step, options.accumulate),
        reducer_(comm, std::move(gradients), options, &accumulation_) {}

  // A source that also hears of each reduction (torch_gradients'): source.after_reduction(comm)
  // runs on every rank once the gradients are reduced, before the wrapped optimizer steps. Not with
  // uneven_inputs, where a rank that joined runs no such step of its own: there the gradients stay
  // as the reduction left them.
  template <detail::reduction_aware_source<C> Source>
  distributed_optimizer(Optimizer& inner, Source source, C& comm, optimizer_options options = {})
      : distributed_optimizer(inner, gradient_source(source), comm, options) {
    if (!options.uneven_inputs) after_reduction_ = [source = std::move(source), &comm] { source.after_reduction(comm); };
  }

  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  // Call once per backward pass. Returns true when this call reduced the gradients (unless
  // already synchronized or skipped) and stepped the wrapped optimizer.
  bool step() {
    const detail::trace::span slice(reducer_.track(), "step", {.extra_name = "step", .extra = step_calls_++});
    const bool reduce_now = !synchronized_ && !skip_;
    if (reduce_now && accumulation_.holds_back()) {
      accumulate();
      return false;
    }
    // The pass ends here whatever raises from now on, on one rank say: the source's after_reduction
    // (after the reduction), the fold of a skipped round or the wrapped optimizer. Otherwise this
    // rank's next step() would find its gradients reduced already and skip the reduction that the
    // other ranks make.
    struct end_of_pass {
      distributed_optimizer& self;
      ~end_of_pass() {
        self.synchronized_ = false;
        self.accumulation_.reset();
      }
    } end{*this};
    if (reduce_now) {
      synchronize();
    } else if (!synchronized_ && accumulation_.passes() > 0) {
      std::vector<buffer_view> grads = reducer_.gradients();  // skipped mid-round: the passes so far still count, locally
      if (std::string fault = reducer_.checks().check_with_pending(grads); !fault.empty()) {
        reducer_.checks().raise_alone(fault);  // the round is abandoned
      }
      if (accumulation_.holds_sums()) reducer_.with_mover(grads, [&](auto& mover) { accumulation_.fold(grads, mover); });
    }
    inner_.step();
    return true;
  }

  // Reduces the gradients now (folding in the passes accumulated so far); the next step() uses
  // them without reducing again. Once per step, as Horovod's: a second call before step() finds
  // them reduced already and does nothing (reducing the averages again would scale them).
  void synchronize() {
    if (synchronized_) return;
    reducer_.synchronize();
    synchronized_ = true;
    if (after_reduction_) after_reduction_();
  }

  // This rank has no batches left (with optimizer_options::uneven_inputs): until every rank has
  // joined, it takes part in the other ranks' reductions with zero gradients (without stepping its
  // optimizer), so that nobody waits forever. Returns the last rank to join (Horovod's join()):
  // broadcast the parameters from it if the ranks' steps differed in number.
  int join() {
    if (!options_.uneven_inputs) {
      reducer_.checks().raise_alone("join() needs optimizer_options::uneven_inputs (on every rank), so that each step "
                                    "agrees on which ranks still train");
    }
    accumulation_.reset();
    synchronized_ = false;
    detail::join_hook* const hooks[] = {&reducer_};
    return reducer_.roster().join(comm_, hooks);
  }

  // Ranks still training in the last reducing step (with uneven_inputs).
  int active_ranks() const noexcept { return reducer_.roster().active_ranks(); }

  // While the returned guard lives, step() does not reduce (each call steps the wrapped optimizer
  // with the local gradients, folding in any passes accumulated so far): for gradients reduced
  // some other way, or for deliberately local steps.
  using skip_guard = detail::scoped_switch<skip_switch>;
  [[nodiscard]] skip_guard skip_synchronize() { return skip_guard(skip_switch{this}); }

  // While the returned guard lives, step() only accumulates the gradients locally (and does not
  // step the wrapped optimizer): DDP's no_sync(). The first step() after it reduces the sum of
  // every pass since the last reduction.
  using no_sync_guard = detail::scoped_switch<no_sync_switch>;
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(no_sync_switch{this}); }

  // Gradient i is final for this backward pass: its bucket starts reducing once all of its
  // gradients are. The first form reads the gradient from the list the optimizer was given (the
  // source is called once per pass); the second takes its current view. Call from one thread at a
  // time. In passes that only accumulate (no_sync, backward_passes_per_step) it does nothing.
  // From then until step() returns the gradient is herd's: the reduction may read it, and write
  // the reduced values into it, at any moment (as with DDP's gradient_as_bucket_view).
  void mark_ready(std::size_t i) {
    if (reducing_pass()) reducer_.mark(i, nullptr);
  }
  void mark_ready(std::size_t i, const buffer_view& gradient) {
    if (reducing_pass()) reducer_.mark(i, &gradient);
  }

  // Which gradients share a bucket now (indices into the gradient list), in launch order.
  std::vector<std::vector<std::size_t>> buckets() const { return reducer_.buckets(); }
  const overlap_stats& overlap() const noexcept { return reducer_.overlap(); }

  Optimizer& inner() noexcept { return inner_; }
  C& comm() noexcept { return comm_; }
  const optimizer_options& options() const noexcept { return options_; }
  // Backward passes accumulated locally since the last reduction.
  int accumulated_passes() const noexcept { return accumulation_.passes(); }
  // Seconds spent reducing gradients since construction: packing, casting, communication, and
  // waiting for ranks that reach the reduction later (so it also shows imbalance between ranks).
  double reduce_seconds() const noexcept { return reducer_.reduce_seconds(); }

 private:
  // A pass that only accumulates: its gradients join the round's sum (with by_copy; in_gradients
  // leaves them where they add up). A problem with them waits for the round's reduction, which
  // raises it on every rank.
  void accumulate() {
    auto read = reducer_.read_gradients();  // (not a structured binding: a lambda below takes it)
    std::vector<buffer_view>& grads = read.first;
    const std::string& read_fault = read.second;
    // The first pass checks the gradients on every rank together: with uneven_inputs a rank that
    // joined before it (no batches at all) makes that check in its round of join().
    if (options_.uneven_inputs && !reducer_.checks().checked()) reducer_.roster().agree(comm_, detail::join_mode::first_check);
    if (reducer_.checks().defer(reducer_.checks().check(grads, read_fault)) || !accumulation_.copies()) {
      accumulation_.count_pass();
      return;
    }
    reducer_.with_mover(grads, [&](auto& mover) { accumulation_.add(grads, mover); });
  }

  // Whether this pass reduces (rather than accumulates or skips).
  bool reducing_pass() const { return !skip_ && !synchronized_ && !accumulation_.holds_back(); }

  Optimizer& inner_;
  C& comm_;
  optimizer_options options_;
  detail::local_accumulation accumulation_;
  detail::reducer<C> reducer_;
  bool synchronized_ = false;
  bool skip_ = false;
  std::int64_t step_calls_ = 0;
  std::function<void()> after_reduction_;  // the source's, if it has one
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_OPTIM_DISTRIBUTED_OPTIMIZER_HPP
