#ifndef HERD_OPTIM_DETAIL_REDUCER_HPP
#define HERD_OPTIM_DETAIL_REDUCER_HPP
// The reducer: combines a list of gradients over the ranks, for herd::distributed_optimizer and
// herd::torch::DistributedDataParallel. It owns the buckets (DDP's: 1 MiB first, then 25 MiB, in
// reverse order, rebuilt once in the order rank 0 saw its gradients become ready), the readiness
// marks, each bucket's operation, unused gradients (zeros with find_unused_parameters, an error on
// every rank without), the first-step agreement (detail/gradient_checks.hpp) and, with
// uneven_inputs, the agreement on who still trains (detail/join.hpp; the DDP wrapper's forward()
// makes it instead, after agree_elsewhere()), whose rounds a joined rank shadows through the
// reducer's join_hook.
//
// States and transitions (one pass, from one thread at a time):
// - idle (no marks): synchronize() reduces every gradient at once, in fusion buffers, and is
//   synchronized; the first mark() instead agrees on who trains (uneven_inputs, unless agreed
//   elsewhere), checks the gradients on the first pass, makes the plan and the policy, and starts
//   collecting marks.
// - collecting marks: each mark() counts down its bucket; buckets whose gradients are all marked
//   are packed and started, in order on every rank (buckets in flight, on the progress thread),
//   but for the last, which synchronize() runs (last_on_caller).
// - synchronize() while collecting: starts the buckets left (unmarked gradients: zeros, or the
//   error that every rank raises), waits for them, runs the last one on its own thread, unpacks;
//   synchronized, and idle for the next pass. After the first synchronized pass the buckets are
//   rebuilt in rank 0's ready order (as DDP, not with find_unused_parameters unless static_graph).
// A failure anywhere ends the pass (and abandons a round of accumulated passes) on every rank.
//
// Step-time fusion (detail/step_fusion.hpp) is the "all ready at once" mode.

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/detail/accumulation.hpp>
#include <herd/optim/detail/bucket_operation.hpp>
#include <herd/optim/detail/bucket_plan.hpp>
#include <herd/optim/detail/gradient_checks.hpp>
#include <herd/optim/detail/gradient_movers.hpp>
#include <herd/optim/detail/join.hpp>
#include <herd/optim/detail/reduction_policy.hpp>
#include <herd/optim/detail/step_fusion.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C> class reducer final : public join_hook {
 public:
  // Returns the current gradient views (called once per pass, or per reduction).
  using gradient_source = std::function<std::vector<buffer_view>()>;

  // `accumulation`: the passes held back since the last reduction, folded into this one (none for
  // a caller whose gradients add up by themselves).
  reducer(C& comm, gradient_source gradients, const optimizer_options& options, local_accumulation* accumulation)
      : comm_(comm), source_(std::move(gradients)), options_(options), acc_(accumulation), checks_(comm, options) {
    validate(options_, {"distributed_optimizer", comm.rank(), comm.size()});
    trace::name_track(track_, "distributed_optimizer: rank " + std::to_string(comm.rank()) + " of " +
                                  std::to_string(comm.size()));
  }
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;

  std::vector<buffer_view> gradients() { return source_(); }
  // The gradients, and what went wrong reading them ("" when nothing did; the list is empty then):
  // a source may raise on one rank only (a missing gradient, a layout it refuses), and the checks
  // carry that to every rank as any other fault of its gradients, so that no rank waits in a
  // reduction this one never starts, nor pairs it with this rank's next one.
  std::pair<std::vector<buffer_view>, std::string> read_gradients() {
    try {
      return {source_(), {}};
    } catch (const std::exception& e) {
      return {{}, std::string("reading the gradients failed on this rank: ") + e.what()};
    }
  }
  gradient_checks<C>& checks() noexcept { return checks_; }
  join_roster& roster() noexcept { return roster_; }
  const join_roster& roster() const noexcept { return roster_; }
  std::uint32_t track() const noexcept { return track_; }
  // The owner agrees on who trains before each pass (DDP's forward()), not the reducer.
  void agree_elsewhere() noexcept { agreed_elsewhere_ = true; }
  template <class F> void with_mover(const std::vector<buffer_view>& grads, F&& f) {
    movers_.with(comm_, grads, std::forward<F>(f));
  }

  // Gradient i is final for this pass (`given`: its view, or null to read it from the source).
  void mark(std::size_t i, const buffer_view* given) { mark_one(i, given); }

  // Whether this pass has marks (its buckets set up, some maybe started).
  bool pass_open() const noexcept { return pass_open_; }

  // A problem of this pass its owner found (the DDP wrapper's), once it has marks: every rank
  // raises it at step(), as a bad mark.
  void fault(std::string why) {
    if (!pass_open_ || !pass_fault_.empty()) return;
    pass_fault_ = std::move(why);
    if (comm_.size() > 1 && next_launch_ == buckets_.size()) defer_late_fault();
  }

  // Reduces now: the buckets, if this pass marked gradients, or else every gradient at once.
  void synchronize() {
    if (pass_open_) return comm_.size() == 1 ? finish_alone() : finish();
    if (options_.uneven_inputs && !agreed_elsewhere_) roster_.agree(comm_, join_mode::at_step);
    reduce_all();
  }

  // A joined rank's round: zero gradients, reduced the way the ranks still training reduce theirs.
  void shadow(join_mode how) override;

  // Which gradients share a bucket now (indices into the gradient list), in launch order.
  std::vector<std::vector<std::size_t>> buckets() const {
    std::vector<std::vector<std::size_t>> out;
    for (const auto& b : plan_.buckets) out.push_back(b.members);
    return out;
  }
  const overlap_stats& overlap() const noexcept { return stats_; }
  double reduce_seconds() const noexcept { return reduce_seconds_; }

 private:
  bool sums() const noexcept { return acc_ && acc_->holds_sums(); }
  // Whether unmarked gradient i is reduced from its tensor, which holds the passes held back.
  bool sums_in_gradients(std::size_t i) {
    return acc_ && acc_->sums_in_gradients() && !marked_[i] && i < pass_views().size();
  }
  void end_round() noexcept {
    if (acc_) acc_->reset();
  }

  // The reduction policy for the options and the gradients (after the first check).
  void set_policy() {
    const int divisor = options_.uneven_inputs && options_.divide_by_active_ranks ? roster_.active_ranks() : comm_.size();
    policy_ = reduction_policy::make(options_.op, options_.gradient_predivide_factor, options_.compression, divisor,
                                     comm_.size());
  }

  // --- All ready at once (step-time fusion, detail/step_fusion.hpp).

  void reduce_all();

  // --- Buckets (marks).

  const std::vector<buffer_view>& pass_views() {
    if (pass_views_.empty()) pass_views_ = source_();
    return pass_views_;
  }

  void mark_one(std::size_t i, const buffer_view* given);
  // What is wrong with marking gradient i now, of `count` ("" when nothing is).
  std::string bad_mark(std::size_t i, std::size_t count) const {
    if (i >= count) return "mark_ready(" + std::to_string(i) + ") names no gradient (there are " + std::to_string(count) + ")";
    if (marked_[i]) return "gradient " + std::to_string(i) + " was marked ready twice in one pass";
    return {};
  }
  // What is wrong with the tensor of gradient i, not marked in this pass, which the pass reads or
  // writes as it is ("" when nothing is).
  std::string unmarked_view_fault(std::size_t i) {
    if (i >= pass_views().size()) return "the gradients changed since the first step (their number, sizes or dtypes)";
    return checks_.marked_fault(i, pass_views()[i]);
  }
  static std::string unmarked_fault(const std::string& missing) {
    return "gradient(s) " + missing +
           " were not marked ready in this backward pass (pass find_unused_parameters = true to reduce gradients a "
           "pass did not produce as zeros)";
  }

  // One rank: there is nothing to reduce, but the marks are kept and checked as on more ranks (as
  // DDP's reducer at world size 1), so that a marking mistake shows before the program runs on
  // several: an index out of range, a second mark, a gradient left unmarked without
  // find_unused_parameters (each raised by step()); with it, an unmarked gradient becomes zeros, as
  // the average of zeros that more ranks write into it. No bucket is packed.
  void mark_alone(std::size_t i, const buffer_view* given);
  [[noreturn]] void raise_no_gradients(std::size_t i) const {
    raise({"distributed_optimizer", comm_.rank(), comm_.size()},
          "mark_ready(" + std::to_string(i) + ") names no gradient (this distributed optimizer has none)",
          "Mark only gradients the distributed optimizer was given");
  }
  void finish_alone();
  // The first mark of a pass: the first-step checks, the plan, and a fresh pass.
  void begin_buckets();
  void make_plan(const std::vector<std::size_t>& order);

  // Packs bucket b (folding in accumulated passes) and starts its allreduce (`now`: runs it on this
  // thread); a bucket this rank found a problem with starts an operation that carries the problem
  // instead, so that every rank raises it and the buckets after it still pair up.
  void launch(std::size_t b, bool now = false);
  // launch()'s packing of bucket b into its buffer (or `started`: its operation started from the
  // gradients themselves; `packing` false while that operation runs).
  void pack(std::size_t b, bucket_operation& st, const bucket_plan::bucket& plan, dtype wire, bool now, bool& started,
            bool& packing);

  // Whether a pass's last bucket runs on the thread that finishes the pass, after the others, and
  // not on the progress thread as soon as its gradients are ready. It becomes ready as backward
  // ends and is waited for at once (the DDP wrapper finishes the pass then): the progress thread
  // would hide nothing of it, and handing it over and back costs a wake on each side, which is
  // most of all where the ranks' threads share cores (a model whose gradients fit one bucket then
  // ran slower overlapped than blocking). A GPU communicator's operations are stream-ordered, with
  // no thread to hand over to: there it is started as soon as it is ready.
  static constexpr bool last_on_caller = !native_collectives<C>;

  // step()'s part: starts the buckets left (gradients never marked: an error, or zeros with
  // find_unused_parameters), waits for all, unpacks, and rebuilds the buckets after the first pass.
  void finish();

  // A problem of this pass found once every bucket had started: raised by the next reduction.
  void defer_late_fault();

  // Once, after the first overlapped step: buckets in the order rank 0's gradients became ready
  // (those it never saw ready last, in reverse order), the same plan on every rank.
  void rebuild();

  C& comm_;
  gradient_source source_;
  optimizer_options options_;
  local_accumulation* acc_;
  gradient_checks<C> checks_;
  mover_set movers_;
  reduction_policy policy_;
  join_roster roster_;
  double reduce_seconds_ = 0;
  std::uint32_t track_ = trace::new_track();  // in the timeline

  // Buckets (marks).
  bucket_plan plan_;
  std::vector<bucket_operation> buckets_;
  std::vector<buffer_view> ready_views_;  // per gradient: its view in this pass, once marked
  std::vector<char> marked_;
  std::size_t marks_ = 0;                 // gradients marked in this pass
  bool pass_open_ = false;                // this pass has had a mark (valid or not): its buckets are set up
  std::size_t next_launch_ = 0;           // the next bucket to start
  std::string pass_fault_;                // a problem of this pass not tied to one bucket
  std::vector<buffer_view> pass_views_;   // source_() of this pass, read on demand
  std::vector<std::size_t> ready_order_;  // the order gradients became ready, until the rebuild
  bool rebuilt_ = false;
  bool agreed_elsewhere_ = false;
  overlap_stats stats_;
};

// The members that reduce are defined out of the class, so not inline: with
// HERD_SEPARATE_COMPILATION a file that trains compiles none of them (reducer<mpi_communicator> is
// an extern template there, collectives/separate_compilation.hpp), nor the collectives they call.

template <communicator C> void reducer<C>::shadow(join_mode how) {
  if (how == join_mode::no_reduction) return;
  if (how == join_mode::first_check) {  // no rank has checked yet: this one joined before its first pass
    if (!checks_.checked()) {
      const auto [grads, read_fault] = read_gradients();
      (void)checks_.check(grads, read_fault);
    }
    return;
  }
  const auto read = read_gradients();
  const std::vector<buffer_view>& grads = read.first;
  if (!read.second.empty() && how == join_mode::in_buckets) {
    // Gradients it cannot read: the pass opens as the others' do (its first check raises that on
    // every rank, on the first round), and each of its buckets carries it to them.
    begin_buckets();
    pass_open_ = true;
    if (pass_fault_.empty()) pass_fault_ = read.second;
    return finish();
  }
  // (Gradients it cannot read at step(): reduce_all reads them again, and carries that.)
  with_mover(grads, [&](auto& mover) {
    mover.begin();
    for (const auto& g : grads) mover.zero(g);
    mover.finish();
  });
  if (how == join_mode::in_buckets) {  // mark every (zero) gradient, as they do theirs
    for (std::size_t i = 0; i < grads.size(); ++i) mark_one(i, nullptr);
    finish();
  } else {
    reduce_all();
  }
}

template <communicator C> void reducer<C>::reduce_all() {
  try {
    auto read = read_gradients();  // (not a structured binding: lambdas below take it, which clang 14 refuses)
    std::vector<buffer_view>& grads = read.first;
    std::string fault = checks_.check_with_pending(grads, read.second);
    if (!fault.empty()) checks_.raise_everywhere(fault);
    if (sums()) with_mover(grads, [&](auto& mover) { acc_->fold(grads, mover); });
    if (comm_.size() == 1) return;  // the average (or sum) over one rank is the gradient itself
    const auto start = std::chrono::steady_clock::now();
    set_policy();
    with_mover(grads, [&](auto& mover) { fuse(comm_, policy_, options_.fusion_threshold_bytes, track_, grads, mover); });
    reduce_seconds_ += seconds_since(start);
  } catch (...) {
    // The round is abandoned on every rank: a rank with a fault raises it here, and the others
    // the agreed error of the reduction that carries it (or the abort), here too.
    end_round();
    throw;
  }
}

template <communicator C> void reducer<C>::mark_one(std::size_t i, const buffer_view* given) {
  if (comm_.size() == 1) return mark_alone(i, given);  // the average (or sum) over one rank is the gradient itself
  const auto start = std::chrono::steady_clock::now();
  // Where this rank has no gradients the first check comes first (it raises on every rank if
  // the others have some, naming the difference).
  if (!pass_open_ && !checks_.checked()) {  // (a source that raises: the first check in begin_buckets carries it)
    if (const auto [grads, read_fault] = read_gradients(); read_fault.empty() && grads.empty()) (void)checks_.check({});
  }
  if (!pass_open_ && checks_.checked() && checks_.shapes().empty()) {
    // No gradients, so no bucket: no operation of any pass could carry this mark's fault to the
    // other ranks, which reduce nothing. This rank raises it at once and opens no pass, so that
    // its step() makes the same calls as theirs.
    raise_no_gradients(i);
  }
  if (!pass_open_) {  // an invalid mark opens the pass too: its fault must reach synchronize()
    begin_buckets();
    pass_open_ = true;
  }
  if (std::string fault = bad_mark(i, checks_.shapes().size()); !fault.empty()) {
    if (pass_fault_.empty()) {
      pass_fault_ = std::move(fault);
      if (next_launch_ == buckets_.size()) defer_late_fault();
    }
    return;
  }
  buffer_view v = given ? *given : buffer_view{};
  std::string read_fault;
  if (!given) {  // the source, read once a pass: where it raises on this rank, the bucket carries that
    try {
      if (i < pass_views().size()) v = pass_views()[i];
    } catch (const std::exception& e) {
      read_fault = std::string("reading the gradients failed on this rank: ") + e.what();
    }
  }
  bucket_operation& b = buckets_[plan_.bucket_of[i]];
  if (b.fault.empty()) b.fault = read_fault.empty() ? checks_.marked_fault(i, v) : read_fault;
  marked_[i] = 1;
  ++marks_;
  ready_views_[i] = v;
  if (!rebuilt_) ready_order_.push_back(i);
  --b.waiting;
  // The last bucket waits for finish(), which runs it on this thread (see last_on_caller).
  const std::size_t launchable = buckets_.size() - (last_on_caller && !buckets_.empty() ? 1 : 0);
  while (next_launch_ < launchable && buckets_[next_launch_].waiting == 0) launch(next_launch_++);
  stats_.exposed += seconds_since(start);
}

template <communicator C> void reducer<C>::mark_alone(std::size_t i, const buffer_view* given) {
  if (!pass_open_) {
    pass_views_.clear();
    const std::size_t count = checks_.checked() ? checks_.shapes().size() : pass_views().size();
    if (count == 0) raise_no_gradients(i);  // as on more ranks
    marked_.assign(count, 0);
    pass_fault_.clear();
    pass_open_ = true;
  }
  if (!pass_fault_.empty()) return;
  pass_fault_ = bad_mark(i, marked_.size());
  if (pass_fault_.empty() && given && checks_.checked()) pass_fault_ = checks_.marked_fault(i, *given);
  if (pass_fault_.empty()) marked_[i] = 1;
}

template <communicator C> void reducer<C>::finish_alone() {
  pass_open_ = false;
  if (!checks_.checked()) (void)checks_.check(pass_views());  // the first check (it raises what it finds)
  std::string fault = std::exchange(pass_fault_, {});
  std::string missing;
  std::vector<buffer_view> unused;
  for (std::size_t i = 0; fault.empty() && i < marked_.size(); ++i) {
    if (marked_[i] || sums_in_gradients(i)) continue;  // in_gradients accumulation: the tensor holds the passes
    missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    fault = unmarked_view_fault(i);
    if (fault.empty()) unused.push_back(pass_views()[i]);
  }
  if (fault.empty() && !missing.empty() && !options_.find_unused_parameters) fault = unmarked_fault(missing);
  if (!fault.empty()) {
    end_round();  // the round is abandoned
    checks_.raise_alone(fault);
  }
  if (!unused.empty()) {
    with_mover(unused, [&](auto& mover) {
      mover.begin();
      for (const buffer_view& g : unused) mover.zero(g);
      mover.finish();
    });
  }
  reduce_all();  // the checks and the passes held back, as without marks
}

template <communicator C> void reducer<C>::begin_buckets() {
  // With uneven_inputs the ranks first agree on who trains (a joined rank agreed in join()).
  if (options_.uneven_inputs && !agreed_elsewhere_ && !roster_.joined()) roster_.agree(comm_, join_mode::in_buckets);
  if (!checks_.checked()) {  // every rank's first mark: agreed there, or raised on every rank
    const auto [grads, read_fault] = read_gradients();
    checks_.check(grads, read_fault);
  }
  if (plan_.buckets.empty() && !checks_.shapes().empty()) make_plan(bucket_plan::reverse_order(checks_.shapes().size()));
  set_policy();
  marked_.assign(checks_.shapes().size(), 0);
  ready_views_.assign(checks_.shapes().size(), buffer_view{});
  pass_views_.clear();
  pass_fault_ = checks_.take_pending();  // a problem an earlier pass found too late to send, or one that only accumulated
  ready_order_.clear();  // the rebuild follows the first pass that succeeds
  next_launch_ = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].reset(plan_.buckets[b].members.size());
}

template <communicator C> void reducer<C>::defer_late_fault() {
  // Every bucket has started (on a GPU communicator, where the last does not wait for finish()):
  // no operation of this pass is left to carry the problem to the other ranks, so the next
  // reduction's first operation carries it, and every rank raises it there.
  checks_.defer(pass_fault_);
  std::fprintf(stderr,
               "herd warning: distributed_optimizer on rank %d of %d: %s, after every bucket of the pass had started; "
               "every rank raises it at the next reduction.\n",
               comm_.rank(), comm_.size(), pass_fault_.c_str());
  std::fflush(stderr);
}

template <communicator C> void reducer<C>::make_plan(const std::vector<std::size_t>& order) {
  plan_ = bucket_plan::make(checks_.shapes(), order, options_.first_bucket_bytes, options_.bucket_bytes,
                                    member_alignment(checks_.where()));
  buckets_.clear();
  buckets_.resize(plan_.buckets.size());
}

template <communicator C> void reducer<C>::launch(std::size_t b, bool now) {
  bucket_operation& st = buckets_[b];
  const bucket_plan::bucket& plan = plan_.buckets[b];
  // In the timeline: packing and starting it, with the sequence number its operation takes.
  trace::fields args = trace::fields::elements(plan.count, plan.type);
  if (trace::on()) args.seq = comm_.operations().issued();  // issued() takes a lock: only when traced
  args.extra_name = "bucket";
  args.extra = static_cast<std::int64_t>(b);
  const trace::span slice(track_, "launch bucket", args);
  const std::string& fault = !pass_fault_.empty() ? pass_fault_ : st.fault;
  auto start_failed = [&](std::uint32_t code, const std::string& what, const char* todo) {
    call_check failed(op_kind::allreduce, comm_.rank(), comm_.size());
    failed.fail(code, what, todo);
    st.start(comm_, std::move(failed), buffer_view{}, policy_.wire_op(plan.type), now);
  };
  if (!fault.empty()) {
    return start_failed(!pass_fault_.empty() ? 14 : st.fault_code, fault,
                        "Hand the distributed optimizer the same gradient tensors, on one device, at every step, and mark "
                        "each ready once per backward pass");
  }
  const dtype wire = policy_.wire(plan.type);
  bool started = false;
  bool packing = true;  // false while pack() starts the bucket's operation from the gradients in place
  try {
    if (const bucket_hook hook = pack_hook()) hook(comm_.rank(), b);
    pack(b, st, plan, wire, now, started, packing);
  } catch (const std::exception& e) {
    if (!packing) throw;  // the operation's own error, raised as it raises them
    // Packing failed on this rank alone maybe (memory for the bucket on a GPU), before the bucket's
    // operation started. As an error inside an operation, it aborts the communicator: the ranks
    // waiting in this bucket raise at once, rather than pair it with this rank's next one.
    const std::string why =
        "packing bucket " + std::to_string(b) + " failed on rank " + std::to_string(comm_.rank()) + ": " + e.what();
    comm_.abort(why);
    raise({"distributed_optimizer", comm_.rank(), comm_.size()}, why,
          "Free memory on that rank (or make the buckets smaller: bucket_bytes), renew the communicator on every rank "
          "(comm.renew(), as herd::run_elastic does) and go on");
  }
  if (started) return;
  call_check fine(op_kind::allreduce, comm_.rank(), comm_.size());
  st.start(comm_, std::move(fine), st.buffer, policy_.wire_op(plan.type), now);
}

template <communicator C>
void reducer<C>::pack(std::size_t b, bucket_operation& st, const bucket_plan::bucket& plan, dtype wire, bool now,
                      bool& started, bool& packing) {
  movers_.with_device(comm_, checks_.where(), [&](auto& mover) {
    mover.begin();
    if (sums()) {
      for (std::size_t i : plan.members) {
        if (marked_[i]) mover.fold(ready_views_[i], acc_->sum(i));
      }
    }
    const bool as_is = policy_.as_is(plan.type);
    st.in_place = as_is && lives_in_place(plan, marked_, ready_views_);
    if (as_is && !st.in_place) {
      packing = false;
      started = st.start_from_gradients(comm_, plan, marked_, ready_views_, policy_.wire_op(plan.type), now);
      packing = !started;
      if (started) {
        mover.finish();
        return;
      }
    }
    if (st.in_place) {
      mover.finish();
      const buffer_view& first = ready_views_[plan.members.front()];
      st.buffer = {first.data, plan.count, plan.type, first.device};
    } else {
      st.buffer = mover.bucket(b, wire, plan.count);
      auto* base = static_cast<std::byte*>(st.buffer.data);
      std::vector<move_item> pack, unused;
      for (std::size_t k = 0; k < plan.members.size(); ++k) {
        const std::size_t i = plan.members[k];
        void* slot = base + plan.offsets[k] * size_of(wire);
        if (marked_[i] || sums_in_gradients(i)) {  // unused in this pass: the earlier passes' sum, as it is
          pack.push_back({(marked_[i] ? ready_views_[i] : pass_views()[i]).data, slot, checks_.shapes()[i].first});
        } else {  // unused in this pass (find_unused_parameters): zeros, plus the passes accumulated
          mover.zero({slot, checks_.shapes()[i].first, wire, checks_.where()});
          if (sums()) unused.push_back({acc_->sum(i).data, slot, checks_.shapes()[i].first});
        }
      }
      policy_.pack(mover, pack, wire, plan.type);
      policy_.pack(mover, unused, wire, accumulation_dtype(plan.type));
      mover.finish();
      stats_.packed_bytes += plan.count * size_of(plan.type);
    }
  });
}

template <communicator C> void reducer<C>::finish() {
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr failure;
  auto keep_first = [&](auto&& f) {
    try {
      f();
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  };
  const std::size_t last = buckets_.size() - 1;  // unused where there are none
  for (std::size_t b = next_launch_; b < buckets_.size(); ++b) {
    std::string missing;
    for (std::size_t i : plan_.buckets[b].members) {
      if (marked_[i]) continue;
      missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      // Its own tensor is read (accumulated passes) or written (zeros, or the others' gradients).
      // Reading the gradients may fail (the DDP wrapper's allocates): the bucket carries that too.
      if (buckets_[b].fault.empty()) {
        try {
          buckets_[b].fault = unmarked_view_fault(i);
        } catch (const std::exception& e) {
          buckets_[b].fault = std::string("reading gradient ") + std::to_string(i) + " failed: " + e.what();
        }
      }
    }
    if (!missing.empty() && !options_.find_unused_parameters && buckets_[b].fault.empty()) {
      buckets_[b].fault_code = 16;
      buckets_[b].fault = unmarked_fault(missing);
    }
    if (b != last || !last_on_caller) keep_first([&] { launch(b); });
  }
  next_launch_ = buckets_.size();
  const auto wait_start = std::chrono::steady_clock::now();
  {
    const trace::span phase(track_, "wait for buckets");
    for (bucket_operation& st : buckets_) {
      if (st.done) keep_first([&] { st.done->wait(); });
    }
    // The last bucket, once the others are done (it runs here, not behind them in the queue).
    if (last_on_caller && !buckets_.empty()) keep_first([&] { launch(last, true); });
  }
  stats_.waiting += seconds_since(wait_start);
  for (const bucket_operation& st : buckets_) stats_.communication += st.seconds->load();
  marks_ = 0;
  pass_open_ = false;
  if (failure) {
    end_round();  // the round is abandoned
    std::rethrow_exception(failure);
  }
  movers_.with_device(comm_, checks_.where(), [&](auto& mover) {
    const trace::span phase(track_, "unpack buckets");
    mover.begin();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const bucket_plan::bucket& plan = plan_.buckets[b];
      if (buckets_[b].in_place) continue;
      const dtype wire = buckets_[b].buffer.type;
      const auto* base = static_cast<const std::byte*>(buckets_[b].buffer.data);
      std::vector<move_item> unpack;
      for (std::size_t k = 0; k < plan.members.size(); ++k) {
        const std::size_t i = plan.members[k];
        if (!marked_[i] && i >= pass_views().size()) continue;
        const buffer_view to = marked_[i] ? ready_views_[i] : pass_views()[i];
        unpack.push_back({base + plan.offsets[k] * size_of(wire), to.data, checks_.shapes()[i].first});
      }
      policy_.unpack(mover, unpack, plan.type, wire);
    }
    mover.finish();
  });
  end_round();
  ++stats_.steps;
  stats_.exposed += seconds_since(start);
  reduce_seconds_ += seconds_since(start);
  // As DDP's: rebuilt only where the ready order is the graph's own (not with unused parameters,
  // whose order changes from pass to pass, unless the graph is declared static).
  if (!rebuilt_ && !options_.gradient_as_bucket_view && (options_.static_graph || !options_.find_unused_parameters)) {
    rebuild();
  }
}

template <communicator C> void reducer<C>::rebuild() {
  const std::vector<std::size_t> seen = bucket_plan::ready_order_first(ready_order_, checks_.shapes().size());
  std::vector<std::int64_t> order(seen.begin(), seen.end());
  herd::broadcast(order, control_of(comm_), 0);
  std::vector<std::size_t> chosen(order.begin(), order.end());
  make_plan(chosen);
  rebuilt_ = true;
  ready_order_.clear();
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_REDUCER_HPP
