#ifndef HERD_TORCH_DETAIL_DDP_STATE_HPP
#define HERD_TORCH_DETAIL_DDP_STATE_HPP
// What herd::torch::DistributedDataParallel (torch/distributed_data_parallel.hpp) keeps behind a
// pointer, for the hooks on the gradient accumulators to reach: the reducer, the flags of which
// parameters each pass used, the gradients' places in their buckets, and what happens when a
// hook fires and when backward ends.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/detail/reducer.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/torch/detail/layout.hpp>
#include <herd/torch/detail/missing_gradient.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN
namespace detail {

// A gradient accumulator as libtorch hands it out: std::shared_ptr, c10::intrusive_ptr in newer releases.
using accumulator_ptr = decltype(::torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// The tensors a forward returned, for find_unused_parameters: a tensor, or vectors, tuples and
// pairs of them, nested. `known` turns false for anything else (then no parameter counts as unused
// until backward ends).
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& into, bool&) { into.push_back(t); }
template <class T> void collect_tensors(const std::vector<T>& all, std::vector<at::Tensor>& into, bool& known);
template <class A, class B> void collect_tensors(const std::pair<A, B>& two, std::vector<at::Tensor>& into, bool& known);
template <class... T> void collect_tensors(const std::tuple<T...>& all, std::vector<at::Tensor>& into, bool& known);
template <class T> void collect_tensors(const T&, std::vector<at::Tensor>&, bool& known);  // anything else
template <class T> void collect_tensors(const std::vector<T>& all, std::vector<at::Tensor>& into, bool& known) {
  for (const T& t : all) collect_tensors(t, into, known);
}
template <class A, class B> void collect_tensors(const std::pair<A, B>& two, std::vector<at::Tensor>& into, bool& known) {
  collect_tensors(two.first, into, known);
  collect_tensors(two.second, into, known);
}
template <class... T> void collect_tensors(const std::tuple<T...>& all, std::vector<at::Tensor>& into, bool& known) {
  std::apply([&](const auto&... t) { (collect_tensors(t, into, known), ...); }, all);
}
template <class T> void collect_tensors(const T&, std::vector<at::Tensor>&, bool& known) { known = false; }

template <class T> std::vector<at::Tensor> tensors_of(const T& output) {
  std::vector<at::Tensor> found;
  bool known = true;
  collect_tensors(output, found, known);
  return known ? found : std::vector<at::Tensor>{};
}

// What the hooks point to: it stays where it is when the DDP object moves.
template <communicator C> struct ddp_state final : herd::detail::join_hook {
  // No local accumulation: under no_sync() libtorch adds the passes up in param.grad() itself.
  // static_graph, as DDP's, allows unused parameters without find_unused_parameters.
  ddp_state(C& c, optimizer_options options)
      : reducer(c, gradient_source(), with_unused(options), nullptr),
        comm(&c),
        broadcast_buffers(options.broadcast_buffers),
        op(options.op),
        find_unused(options.find_unused_parameters || options.static_graph),
        static_graph(options.static_graph),
        uneven(options.uneven_inputs) {
    if (uneven) reducer.agree_elsewhere();  // in forward(), as DDP's
  }
  static optimizer_options with_unused(optimizer_options o) {
    o.find_unused_parameters = o.find_unused_parameters || o.static_graph;
    return o;
  }

  void sync_buffers(int root) {
    herd::detail::row_major_views staged;  // element by element, whatever each rank's layout
    std::vector<at::Tensor> all = buffers();
    for (auto& b : all) staged.add(b);
    for (buffer_view v : staged.views()) broadcast(v, *comm, root);
    staged.write_back();
  }

  // A joined rank's round (join_hook): what a forward and backward of the ranks still training
  // run, in their order. The buckets reduce zeros in tensors of their own (the rank's gradients
  // stay as they are, as DDP's join hook leaves them).
  void shadow(herd::detail::join_mode how) override {
    if (sync_buffers_next && broadcast_buffers && comm->size() > 1) sync_buffers(reducer.roster().last_joined());
    sync_buffers_next = how != herd::detail::join_mode::no_reduction;
    if (!sync_buffers_next) return;
    shadowing = true;
    try {
      reducer.shadow(how);
    } catch (...) {
      shadowing = false;
      throw;
    }
    shadowing = false;
    if (find_unused && !(static_graph && used_known)) {
      // The flags of the last reduction this rank took part in, kept from round to round.
      if (anywhere.size() != params.size()) anywhere.assign(params.size(), 0);
      allreduce(anywhere, *comm, reduce_op::max);
      // With static_graph the others exchange used flags in their first synchronized pass only:
      // this rank, joined before its own first, counts that exchange as made too.
      if (static_graph) used_known = true;
    }
  }

  // The gradients as the reducer reads those it was not told of (unused parameters): zeros
  // for a parameter that got none, as PyTorch's DDP reduces them.
  typename herd::detail::reducer<C>::gradient_source gradient_source() {
    return [this] {
      std::vector<buffer_view> views;
      if (shadowing) {
        if (shadow_grads.empty()) {
          for (std::size_t i = 0; i < params.size(); ++i) {
            shadow_grads.push_back(sparse[i] ? ::torch::empty({0}, params[i].options())
                                             : ::torch::zeros_like(params[i], ::torch::MemoryFormat::Contiguous));
          }
        }
        for (auto& g : shadow_grads) views.push_back(view_of(g));
        return views;
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        at::Tensor& p = params[i];
        if (sparse[i]) {
          views.push_back(sparse_slot(i));
          continue;
        }
        if (herd::detail::fill_missing_gradient(p, in_bucket.empty() ? nullptr : &in_bucket[i]) && !created.empty()) {
          created[i] = 1;
        }
        views.push_back(gradient_view(i));
      }
      return views;
    };
  }

  // Makes every defined gradient a tensor inside its bucket's storage (its current values kept). Not a
  // view in autograd's sense (zero_grad() detaches gradients in place, which views refuse): a
  // tensor on the bucket's storage at the gradient's offset.
  void place_gradients_in_buckets(const optimizer_options& options) {
    ::torch::NoGradGuard no_grad;
    in_bucket.resize(params.size());
    std::vector<std::pair<std::size_t, dtype>> shapes;
    for (std::size_t i = 0; i < params.size(); ++i) {
      shapes.emplace_back(sparse[i] ? 0 : static_cast<std::size_t>(params[i].numel()), herd::detail::torch_dtype(params[i]));
    }
    for (const gradient_bucket& b : bucket_layout(shapes, options, herd::detail::torch_device(params.front()))) {
      const at::Tensor& first = params[b.members.front()];
      at::Tensor storage = ::torch::zeros({static_cast<std::int64_t>(b.count)}, first.options());
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        if (sparse[b.members[k]]) continue;  // its place is empty: sparse gradients are reduced apart
        at::Tensor& p = params[b.members[k]];
        at::Tensor g = ::torch::empty({0}, first.options());
        g.set_(storage.storage(), static_cast<std::int64_t>(b.offsets[k]), p.sizes(), herd::detail::gradient_strides(p));
        if (p.grad().defined()) {  // an undefined one stays so until a pass produces it (as DDP's)
          g.copy_(p.grad());
          p.mutable_grad() = g;
        }
        in_bucket[b.members[k]] = g;
      }
    }
  }

  // With gradient_as_bucket_view: gradient i in its place in the bucket again, if it left it.
  void repoint(std::size_t i) {
    at::Tensor& g = params[i].mutable_grad();
    if (in_bucket.empty() || (g.defined() && g.data_ptr() == in_bucket[i].data_ptr())) return;
    const ::torch::NoGradGuard no_grad;
    if (g.defined()) in_bucket[i].copy_(g);
    else in_bucket[i].zero_();
    g = in_bucket[i];
  }

  // Gradient i as its bucket reduces it: in its parameter's gradient layout (detail/layout.hpp),
  // which autograd gives the gradients it creates. One the program set in another layout is
  // first copied into a tensor of that layout, which becomes param.grad(), as DDP copies such a
  // gradient into its bucket view; one of other sizes or dtype keeps them (row-major if it is not
  // dense), and the reducer's check of the marked view reports it on every rank.
  buffer_view gradient_view(std::size_t i) {
    at::Tensor& g = params[i].mutable_grad();
    if (g.defined() && g.layout() == at::kStrided && !herd::detail::in_gradient_layout(g, params[i])) {
      const ::torch::NoGradGuard no_grad;
      if (g.sizes() == params[i].sizes() && g.scalar_type() == params[i].scalar_type()) {
        at::Tensor placed = herd::detail::empty_gradient(params[i]);
        placed.copy_(g);
        g = placed;
      } else if (!g.is_non_overlapping_and_dense()) {
        g = g.contiguous();
      }
    }
    return herd::detail::span_view(g);
  }

  // What parameter i's gradient held before a pass that did not use it: a copy, or undefined where
  // it held none (or only what the reduction created), to restore if no rank used it.
  at::Tensor kept_gradient(std::size_t i) const {
    const at::Tensor& g = params[i].grad();
    return g.defined() && !created[i] ? g.detach().clone() : at::Tensor();
  }

  // Parameter i's gradient, in its bucket's place and layout, marked ready.
  void mark_gradient(std::size_t i) {
    repoint(i);
    const buffer_view grad = gradient_view(i);
    reducer.mark(i, &grad);
  }

  // find_unused_parameters, as DDP's prepare_for_backward: which parameters the output of a
  // synchronized forward reaches through the autograd graph (`reached`; empty where the output
  // holds no tensor herd can find, and then each counts as reached).
  void find_reached(const std::vector<at::Tensor>& outputs) {
    reached.clear();
    if (outputs.empty()) return;
    std::unordered_map<const void*, std::size_t> accumulators;  // a parameter's node in the graph
    for (std::size_t i = 0; i < hooks.size(); ++i) accumulators.emplace(hooks[i].first.get(), i);
    std::vector<::torch::autograd::Node*> todo;
    std::unordered_set<const ::torch::autograd::Node*> seen;
    for (const at::Tensor& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      const ::torch::autograd::Edge edge = ::torch::autograd::impl::gradient_edge(t);
      if (edge.function) todo.push_back(edge.function.get());
    }
    reached.assign(params.size(), 0);
    while (!todo.empty()) {
      ::torch::autograd::Node* node = todo.back();
      todo.pop_back();
      if (!seen.insert(node).second) continue;
      if (const auto it = accumulators.find(node); it != accumulators.end()) reached[it->second] = 1;
      for (const ::torch::autograd::Edge& next : node->next_edges()) {
        if (next.function) todo.push_back(next.function.get());
      }
    }
  }

  // At the pass's first hook: the parameters the output does not reach get no gradient in this
  // pass, so they are marked now, with the gradient each holds (zeros where it holds none), as
  // DDP marks its unused parameters at its first hook. Their buckets then start as soon as those
  // before them have, as on the ranks that used them, rather than at the end of backward (after
  // backward's other collectives, SyncBatchNorm's). What each held is kept for finish(), which
  // restores those that no rank used.
  void mark_unreached() {
    marked_early.assign(params.size(), 0);
    kept_early.clear();
    if (reached.empty()) return;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (reached[i]) continue;
      marked_early[i] = 1;
      if (sparse[i]) {  // its empty place in the bucket; reduce_sparse() finds it has no gradient
        const buffer_view none = sparse_slot(i);
        reducer.mark(i, &none);
        continue;
      }
      kept_early.emplace_back(i, kept_gradient(i));
      if (!params[i].grad().defined() &&
          herd::detail::fill_missing_gradient(params[i], in_bucket.empty() ? nullptr : &in_bucket[i])) {
        created[i] = 1;
      }
      mark_gradient(i);
    }
  }

  // A hook on parameter i, as a gradient reaches it (before its accumulator adds it up). A gradient
  // of the wrong kind fails backward on this rank, maybe this rank alone (a data-dependent one):
  // as after any backward that raised, the next forward refuses, so that ranks waiting in this
  // pass's reduction raise rather than pair it with this rank's next pass.
  void arriving(std::size_t i, const at::Tensor& g) {
    if (!g.defined() || (g.layout() == at::kStrided) == !sparse[i]) return;
    const std::string what =
        sparse[i] ? "parameter " + names[i] + ", the weight of an Embedding or EmbeddingBag with sparse=true, got a dense "
                    "gradient; it is reduced as a sparse one"
                  : "parameter " + names[i] + " has a sparse gradient, and is not the weight of an Embedding or "
                    "EmbeddingBag with sparse=true, whose gradients herd's DDP reduces as sparse ones (as DDP's "
                    "expect_sparse_gradient); its bucket holds a dense gradient";
    if (comm->size() > 1) {  // (at one rank no one waits: the wrapper goes on, as after an agreed error)
      std::lock_guard lock(mutex);
      if (prepared && unfinished.empty()) unfinished = "the last backward pass raised on this rank (" + what + ")";
    }
    herd::detail::raise({"DistributedDataParallel", comm->rank(), comm->size()}, what,
                        sparse[i] ? "Give it sparse gradients only (the module's own forward), or build the module with sparse=false"
                                  : "Make it such a module's weight, or give it dense gradients (sparse=false)");
  }

  // The hook of parameter i's gradient accumulator: its gradient is final for this pass. A hook
  // may fire with no gradient (a backward function that gives its input none): as DDP's, that
  // parameter was not used here, and is reduced as zeros (find_unused_parameters: from what it
  // holds, at the end of the pass). Only a backward after a synchronized forward through the
  // wrapper reduces, once (as DDP's expect_autograd_hooks_): one of a forward under no_sync(),
  // of module()->forward(), or a second backward of the same graph leaves the local gradients.
  void ready(std::size_t i) {
    std::lock_guard lock(mutex);
    if (!prepared) {
      if (find_unused) used_unsynced[i] = 1;  // used at the next reduction, as DDP's from PyTorch 2.4
      if (!forward_since_reduction && !warned_unprepared) warn_unprepared();
      return;
    }
    const bool first = !queued;
    if (first) {
      queued = true;
      ::torch::autograd::Engine::get_default_engine().queue_callback([this] { finish(); });
    }
    try {
      if (first && find_unused) mark_unreached();
      mark_ready(i);
    } catch (...) {
      // Backward fails here, so the callback that ends the pass will not run. An agreed error
      // before this pass's reduction started (the first step's check, failed on every rank alike),
      // or any error at one rank, lets the wrapper go on; any other, on this rank alone maybe,
      // leaves the pass queued, and the next forward refuses (refuse_after_an_unfinished_pass).
      if (!reducer.pass_open() && (comm->size() == 1 || raised_alike(std::current_exception()))) queued = false;
      throw;
    }
  }

  // ready()'s part once the pass is under way: parameter i's gradient joins its bucket.
  void mark_ready(std::size_t i) {
    if (!marked_early.empty() && marked_early[i]) {
      // Reached by the backward pass after all (the loss used it outside the wrapper's forward,
      // or the output of an earlier forward): marked already, with what it held. As DDP's.
      reducer.fault("parameter " + names[i] +
                    " got a gradient in backward but the output of the last forward through the wrapper does not "
                    "reach it, so with find_unused_parameters it was reduced as unused at the start of backward (as "
                    "DDP's); use every parameter inside the module's forward, and run one forward per backward");
      return;
    }
    if (sparse[i]) {  // an empty place in its bucket; reduced at the end of backward (reduce_sparse)
      if (params[i].grad().defined()) used[i] = 1;
      const buffer_view none = sparse_slot(i);
      reducer.mark(i, &none);
      return;
    }
    if (!params[i].grad().defined()) {
      if (find_unused) return;
      herd::detail::fill_missing_gradient(params[i], in_bucket.empty() ? nullptr : &in_bucket[i]);
    } else {
      used[i] = 1;
    }
    mark_gradient(i);
  }

  // A backward with no forward through the wrapper since the last reduction: DDP keeps its
  // gradients local without a word, which leaves the ranks' models apart if it was not meant
  // (the module's own forward called by mistake). Said once per wrapper; no_sync() passes, whose
  // forward went through the wrapper, are meant and say nothing.
  void warn_unprepared() {
    warned_unprepared = true;
    std::fprintf(stderr,
                 "herd warning: DistributedDataParallel on rank %d of %d: a backward pass with no forward through the "
                 "wrapper since the last reduction (the module's own forward, or a second backward of one graph) keeps "
                 "its gradients local, unreduced, as PyTorch's DDP does. Call the wrapper (ddp(x), ddp.forward(x) or "
                 "ddp->forward(x)) for each backward that should reduce.\n",
                 comm->rank(), comm->size());
    std::fflush(stderr);
  }

  // A backward pass whose hooks readied gradients but that never reached its end-of-backward
  // reduction (it raised in between: an exception inside backward, or an error of another
  // collective there) leaves this rank's buckets part started and the other ranks waiting in them.
  // As PyTorch's DDP ("Expected to have finished reduction in the prior iteration"), the wrapper
  // then refuses every forward and join(); herd also aborts the communicator, so that the others
  // raise at once rather than wait for the stall shutdown.
  void refuse_after_an_unfinished_pass() {
    std::string reason;
    {
      std::lock_guard lock(mutex);
      if (queued && unfinished.empty()) {
        unfinished = "the last backward pass ended before its gradients were reduced (it raised after some of them were "
                     "ready: an exception inside backward?), so this rank started part of that reduction and the "
                     "other ranks wait in it";
      }
      reason = unfinished;
    }
    if (reason.empty()) return;
    if (!comm->operations().aborted()) comm->abort("DistributedDataParallel: " + reason);
    herd::detail::raise({"DistributedDataParallel", comm->rank(), comm->size()}, reason,
                        "This wrapper and its communicator cannot go on: end the job, or renew the communicator on every "
                        "rank (comm.renew(), as herd::run_elastic does) and build a new DistributedDataParallel on it");
  }

  // A sparse gradient's place in its bucket: empty (no element; the parameter's own address, never
  // read, rather than a null one that memcpy may not take), so that the reducer's gradients are
  // still numbered as the parameters are.
  buffer_view sparse_slot(std::size_t i) const {
    return {params[i].data_ptr(), 0, herd::detail::torch_dtype(params[i]), herd::detail::torch_device(params[i])};
  }

  // The sparse gradients, each alone in parameter order, as DDP's sparse buckets over gloo: every
  // rank's entries (rows and values) gathered, libtorch sums the rows that repeat (coalesce), and
  // the sum is divided by the ranks (op avg). A rank whose parameter got no gradient in the pass
  // adds no entry; where no rank has one, it stays undefined.
  void reduce_sparse() {
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (sparse[i]) which.push_back(i);
    }
    if (which.empty()) return;
    std::vector<std::int32_t> defined(which.size());
    for (std::size_t k = 0; k < which.size(); ++k) defined[k] = params[which[k]].grad().defined() ? 1 : 0;
    allreduce(defined, *comm, reduce_op::max);
    const ::torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < which.size(); ++k) {
      if (!defined[k]) continue;
      at::Tensor& param = params[which[k]];
      at::Tensor& grad = param.mutable_grad();
      const std::int64_t width = param.size(0) == 0 ? 0 : param.numel() / param.size(0);  // elements per row
      at::Tensor rows = ::torch::empty({0}, ::torch::kLong), values = ::torch::empty({0, width}, param.options());
      if (grad.defined()) {
        const at::Tensor mine = grad.coalesce();
        rows = mine._indices().reshape({-1}).contiguous();
        values = mine._values().reshape({-1, width}).contiguous();
      }
      std::vector<std::int64_t> all_rows;
      std::vector<std::size_t> counts = allgatherv(herd::detail::span_view(rows), all_rows, *comm);
      for (std::size_t& c : counts) c *= static_cast<std::size_t>(width);
      at::Tensor all_values = ::torch::empty({static_cast<std::int64_t>(all_rows.size()), width}, param.options());
      buffer_view out = herd::detail::span_view(all_values);
      allgatherv(herd::detail::span_view(values), out, std::span<const std::size_t>(counts), *comm);
      std::vector<std::int64_t> shape = param.sizes().vec();
      shape.front() = static_cast<std::int64_t>(all_rows.size());
      at::Tensor indices = ::torch::from_blob(all_rows.data(), {1, static_cast<std::int64_t>(all_rows.size())}, ::torch::kLong).clone();
      at::Tensor sum = ::torch::sparse_coo_tensor(indices, all_values.reshape(shape), param.sizes(), param.options().layout(at::kSparse)).coalesce();
      if (op == reduce_op::avg) sum.div_(static_cast<double>(comm->size()));
      grad = sum;
    }
  }

  // At the end of backward: waits for the buckets and writes the averages into the gradients. An
  // error every rank raised alike (herd::argument_error: the reducer ended the pass on every rank),
  // or any error at one rank, lets the wrapper go on; any other, raised on this rank alone maybe
  // before or between the pass's collectives, makes the next forward refuse, as after a backward
  // that raised.
  void finish() {
    std::lock_guard lock(mutex);
    queued = false;
    prepared = false;
    forward_since_reduction = false;
    try {
      finish_pass();
    } catch (const std::exception& e) {
      if (comm->size() > 1 && !raised_alike(std::current_exception()) && unfinished.empty())
        unfinished = std::string("the end of the last backward pass raised on this rank (") + e.what() + ")";
      throw;
    }
  }

  // Whether `e` is an error every rank raised alike, after an agreement (herd::argument_error).
  static bool raised_alike(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const herd::argument_error&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  // finish()'s work, under its lock.
  void finish_pass() {
    if (!find_unused) {
      reducer.synchronize();
      reduce_sparse();
      std::fill(created.begin(), created.end(), 0);
      std::fill(used.begin(), used.end(), 0);
      return;
    }
    // The gradients this rank did not produce, as they were before the pass (undefined where the
    // reduction had to create them), for those that no rank produced; those the first hook marked
    // (mark_unreached) were kept then.
    std::vector<std::pair<std::size_t, at::Tensor>> kept = std::move(kept_early);
    kept_early.clear();
    const std::vector<char> early = std::exchange(marked_early, {});
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (used[i] || sparse[i] || (!early.empty() && early[i])) continue;
      kept.emplace_back(i, kept_gradient(i));
    }
    // As DDP's: one this pass did not use is reduced from the gradient it holds (the sum of
    // no_sync() passes, say), zeros where it holds none.
    for (auto& [i, g] : kept) {
      if (g.defined() && (early.empty() || !early[i])) mark_gradient(i);
    }
    reducer.synchronize();
    reduce_sparse();
    // With static_graph, those found unused in the first pass are those of every pass.
    if (!static_graph || !used_known) {
      anywhere.assign(used.begin(), used.end());
      for (std::size_t i = 0; i < anywhere.size(); ++i) anywhere[i] |= used_unsynced[i];
      allreduce(anywhere, *comm, reduce_op::max);
      used_known = static_graph;
    }
    std::fill(used.begin(), used.end(), 0);
    // The flags of this pass's zero-filled gradients end with it (set by the synchronize above):
    // read in the next pass, a gradient that reduction defined (and the optimizer then used)
    // would count as one that never existed on this rank alone, and the ranks would part.
    std::fill(created.begin(), created.end(), 0);
    std::fill(used_unsynced.begin(), used_unsynced.end(), 0);
    const ::torch::NoGradGuard no_grad;
    for (auto& [i, g] : kept) {
      if (anywhere[i]) continue;
      if (!g.defined()) params[i].mutable_grad() = at::Tensor();
      else params[i].mutable_grad().copy_(g);
    }
  }

  std::vector<at::Tensor> params;
  std::vector<std::string> names;  // the module's, of params
  std::vector<char> sparse;        // per parameter: an Embedding's or EmbeddingBag's with sparse=true
  herd::detail::reducer<C> reducer;
  std::vector<std::pair<accumulator_ptr, std::uintptr_t>> hooks;
  std::vector<unsigned> gradient_hooks;  // params[i].register_hook's, which sees the gradient arriving
  std::vector<at::Tensor> in_bucket;  // gradient_as_bucket_view: each gradient's place in its bucket
  std::vector<char> used;              // find_unused_parameters: produced by this rank in this pass
  std::vector<char> used_unsynced;     // ... or in a no_sync() pass since the last reduction
  std::vector<char> created;           // undefined until the reduction of this pass zero-filled it
  std::vector<std::int32_t> anywhere;  // per parameter: some rank used it (in the first pass, with static_graph)
  std::vector<at::Tensor> shadow_grads;  // what a joined rank's rounds reduce
  std::function<std::vector<at::Tensor>()> buffers;  // the module's, as they are now
  C* comm = nullptr;
  std::mutex mutex;
  bool queued = false;       // the end-of-backward reduction is queued: the pass's first hook ran
  std::string unfinished;    // why this wrapper refuses to go on (refuse_after_an_unfinished_pass)
  bool no_sync = false;
  bool prepared = false;  // a synchronized forward ran since the last reduction: the next backward reduces
  bool forward_since_reduction = false;  // any forward through the wrapper (no_sync() too) since the last reduction
  bool warned_unprepared = false;
  bool broadcast_buffers = true;
  reduce_op op = reduce_op::avg;
  bool find_unused = false;
  bool static_graph = false;
  bool uneven = false;
  bool used_known = false;  // static_graph: anywhere holds the first pass's
  bool shadowing = false;   // in a joined rank's round: the gradients are shadow_grads
  bool sync_buffers_next = true;
  std::vector<char> reached;       // find_unused: the last synchronized forward's output reaches it (empty: not known)
  std::vector<char> marked_early;  // this pass: marked at its first hook (mark_unreached)
  std::vector<std::pair<std::size_t, at::Tensor>> kept_early;  // ... with the gradient each held before
};

}  // namespace detail
HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_TORCH_DETAIL_DDP_STATE_HPP
