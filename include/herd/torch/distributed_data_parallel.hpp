#ifndef HERD_TORCH_DISTRIBUTED_DATA_PARALLEL_HPP
#define HERD_TORCH_DISTRIBUTED_DATA_PARALLEL_HPP
// herd::torch::DistributedDataParallel: PyTorch's DistributedDataParallel for libtorch, which has
// none (pytorch/pytorch#48959). Opt-in: include it after <torch/torch.h>.
//
//   auto model = std::make_shared<Net>();
//   herd::torch::DistributedDataParallel ddp(model, comm);   // checks shapes, broadcasts from rank 0
//   torch::optim::SGD sgd(model->parameters(), 0.01);
//   for (auto& batch : loader) {
//     sgd.zero_grad();
//     loss(ddp->forward(batch.data), batch.target).backward();   // buckets reduce during backward
//                                                                 // (ddp(x) too; both go through the wrapper)
//     sgd.step();                                                // the gradients are averaged already
//   }
//
// As DDP's Reducer: a hook on each parameter's gradient accumulator tells herd's reducer
// (optim/detail/reducer.hpp, as distributed_optimizer's) that the gradient is final; buckets
// of gradients start their allreduce as soon as they are complete, in bucket order on every rank,
// while backward goes on; a callback queued on the autograd engine at the first hook waits for
// the buckets at the end of backward and writes the averaged gradients back into param.grad(),
// so that the optimizer's step needs no call of herd's. Errors (a parameter without a gradient,
// unless find_unused_parameters; a rank whose gradients changed) raise from backward() on every
// rank. As DDP's, forward() decides whether the backward that follows reduces: one that ran under
// no_sync() (or with autograd off) does not, wherever its backward runs, and libtorch sums the
// gradients of those passes in param.grad(); the backward of the next synchronized forward reduces
// the sum. The hooks reduce once per synchronized forward: a second backward of the same graph
// (retain_graph) or the backward of module()->forward() leaves the local gradients, as DDP does.
//
// As DDP (each checked against it by tests/parity, parity_ddp):
// - forward() first broadcasts rank 0's buffers (BatchNorm's running statistics) when the last
//   forward was a synchronized one with autograd on (options.broadcast_buffers, default on). Off,
//   neither the constructor nor join() broadcasts them either, as PyTorch 2's DDP (1.13's
//   constructor did).
// - The constructor raises on every rank for a module with no parameter that requires a gradient
//   and for trainable parameters whose count, dtype, shape or memory layout differ between ranks
//   (naming the parameter and both shapes or both strides; strides of length-1 dimensions, which
//   place no element, are not compared, where DDP compares them too).
// - Sparse gradients: the weights of Embedding and EmbeddingBag modules with sparse=true stay out
//   of the buckets, as DDP's expect_sparse_gradient; at the end of backward every rank's entries
//   are gathered and summed into a coalesced sparse gradient, divided by the ranks (gloo's sparse
//   allreduce under DDP). CPU parameters only, not with uneven_inputs; a sparse gradient of
//   another parameter raises from backward(), naming it.
// - Parameters in any memory layout (channels_last convolution weights, a transposed matrix): as
//   DDP's bucket views, a gradient's place in its bucket has its parameter's strides where the
//   parameter is dense, row-major strides otherwise (torch/detail/layout.hpp), and param.grad()
//   keeps that layout; one set in another layout is copied into it. Parameters and buffers are
//   broadcast element by element whatever each rank's layout.
// - With find_unused_parameters, a parameter no rank used in the pass, nor in the no_sync()
//   passes before it, keeps its gradient as it was (undefined stays undefined, so weight decay and
//   momentum leave it alone); one that some rank used gets the average, counting for the ranks
//   that did not the gradient they hold (the sum of no_sync() passes, say), or zeros. One more
//   allreduce, of a flag per parameter, finds them. (PyTorch before 2.4 forgot what no_sync()
//   passes used: pytorch/pytorch#69031.)
// - With gradient_as_bucket_view, each param.grad() is a tensor inside its bucket's storage (laid
//   out by herd::bucket_layout, kept for the wrapper's life): buckets reduce in place, without
//   copies. A gradient that is not (zero_grad(true) set it to undefined, or it was replaced) is
//   copied into its place when it becomes ready and param.grad() points there again.
// - With uneven_inputs, as under DDP's Join([ddp]): each forward first agrees on who still trains,
//   a rank out of batches calls join() and shadows the others' collectives with zeros until all
//   have joined, then every rank takes the last joiner's parameters and buffers. A joined rank
//   reports as used, in every round, the parameters used in the last reduction it took part in
//   or in a round since (its flags reduced in place, as DDP's join hook does): with
//   find_unused_parameters such a parameter gets a gradient on the ranks still training (zeros
//   where none of them produced one).
// - With static_graph, the parameters no rank used in the first pass are the unused ones of every
//   pass. What differs from DDP: docs/training.md.
//
// On GPU tensors, give it a nccl_communicator: buckets are packed on the device and reduced
// stream-ordered, with no host copy of the gradients; by herd's kernels in a file nvcc compiles,
// by libtorch's in one g++ compiles (link herd::nccl, which defines HERD_WITH_NCCL).

#include <herd/collectives/allgather.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/broadcast.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/detail/reducer.hpp>
#include <herd/optim/detail/scoped_switch.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/torch/broadcast.hpp>
#include <herd/torch/detail/ddp_state.hpp>
#include <herd/torch/detail/device_arithmetic.hpp>
#include <herd/torch/detail/layout.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/embedding.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN

template <class Module, communicator C> class DistributedDataParallel {
 private:
  using state = detail::ddp_state<C>;
  // What the guard of no_sync() turns on and off: a flag of the state, which stays where it is
  // when the wrapper moves.
  struct no_sync_switch {
    state* s;
    void operator()(bool on) const noexcept { s->no_sync = on; }
  };

 public:
  // `module`: a std::shared_ptr to a torch::nn::Module, or a module holder (torch::nn::Sequential,
  // TORCH_MODULE types). `options`: op, compression, gradient_predivide_factor, bucket_bytes,
  // first_bucket_bytes, find_unused_parameters, gradient_as_bucket_view (backward_passes_per_step
  // must stay 1: use no_sync()).
  DistributedDataParallel(Module module, C& comm, optimizer_options options = {})
      : module_(std::move(module)), state_(std::make_unique<state>(comm, options)) {
    herd::detail::lend_torch_device_arithmetic();  // libtorch's kernels pack CUDA buckets where herd's are not compiled
    if (options.backward_passes_per_step != 1) {
      herd::detail::raise({"DistributedDataParallel", comm.rank(), comm.size()},
                    "backward_passes_per_step is for herd::distributed_optimizer",
                    "Accumulate passes as with PyTorch's DDP: run them under no_sync(); libtorch sums their gradients");
    }
    for (auto& item : module_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      state_->params.push_back(item.value());
      state_->names.push_back(item.key());
    }
    state_->sparse = sparse_parameters();
    // Every rank has the same parameters, then rank 0's values.
    check_parameters();
    sync_module_states(0);
    state_->buffers = [m = module_] { return m->buffers(); };
    state_->used.assign(state_->params.size(), 0);
    state_->used_unsynced.assign(state_->params.size(), 0);
    state_->created.assign(state_->params.size(), 0);
    if (options.gradient_as_bucket_view) state_->place_gradients_in_buckets(options);
    state* s = state_.get();
    for (std::size_t i = 0; i < s->params.size(); ++i) {
      accumulator_ptr accumulator = ::torch::autograd::impl::grad_accumulator(s->params[i]);
      const auto key = accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
          [s, i](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
            s->ready(i);
            return outputs;
          }));
      s->hooks.emplace_back(std::move(accumulator), key);
      // Before the accumulator adds it up: a sparse gradient added to a dense one (the zeros a pass
      // gives a gradient not produced yet) would become dense without a word.
      s->gradient_hooks.push_back(s->params[i].register_hook([s, i](const at::Tensor& g) { s->arriving(i, g); }));
    }
  }

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept = default;
  ~DistributedDataParallel() {
    if (!state_) return;
    for (auto& [accumulator, key] : state_->hooks) accumulator->del_post_hook(key);
    for (std::size_t i = 0; i < state_->gradient_hooks.size(); ++i) state_->params[i].remove_hook(state_->gradient_hooks[i]);
  }

  // The wrapped module, for what the wrapper does not pass on (its own members): as DDP's .module.
  Module& module() noexcept { return module_; }
  // ddp->forward(x) and ddp(x) go through the wrapper, as DDP's model(x): a call that skipped it
  // would skip the buffer broadcast and the agreement on who still trains. The Module functions a
  // training loop calls on a model are passed on; anything else is ddp.module()->...
  DistributedDataParallel* operator->() noexcept { return this; }
  template <class... Args> auto operator()(Args&&... args) { return forward(std::forward<Args>(args)...); }
  auto parameters(bool recurse = true) const { return module_->parameters(recurse); }
  auto named_parameters(bool recurse = true) const { return module_->named_parameters(recurse); }
  auto buffers(bool recurse = true) const { return module_->buffers(recurse); }
  auto named_buffers(bool recurse = true) const { return module_->named_buffers(recurse); }
  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  bool is_training() const noexcept { return module_->is_training(); }
  template <class... Args> void zero_grad(Args&&... args) { module_->zero_grad(std::forward<Args>(args)...); }
  template <class... Args> void to(Args&&... args) { module_->to(std::forward<Args>(args)...); }

  template <class... Args> auto forward(Args&&... args) {
    state* s = state_.get();
    s->refuse_after_an_unfinished_pass();
    const bool reduces = ::torch::GradMode::is_enabled() && !s->no_sync;
    int root = 0;
    if (s->uneven && s->comm->size() > 1) {
      // As DDP in a Join: who still trains is agreed before the buffers move, and they come from
      // the highest rank still training (rank 0 may have joined, its buffers stale).
      s->reducer.roster().agree(*s->comm, reduces ? herd::detail::join_mode::in_buckets : herd::detail::join_mode::no_reduction);
      root = s->reducer.roster().last_joined();
    }
    if (s->sync_buffers_next && s->broadcast_buffers && s->comm->size() > 1) s->sync_buffers(root);
    // As DDP: the next forward syncs the buffers if this one is followed by a synchronized backward.
    s->sync_buffers_next = reduces;
    auto out = module_->forward(std::forward<Args>(args)...);
    // As DDP's prepare_for_backward: whether the backward of this output reduces is decided here,
    // not by the no_sync() of the moment it runs.
    if (reduces) {
      s->prepared = true;
      if (s->find_unused) s->find_reached(detail::tensors_of(out));
    }
    s->forward_since_reduction = true;
    return out;
  }

  // This rank has no batches left (options.uneven_inputs, DDP's Join([ddp])): until every rank has
  // joined, it runs what each forward and backward of the others needs of it (the buffer broadcast,
  // the buckets' allreduces with zeros, the used flags), without touching its own gradients. Then,
  // as DDP's join hook, every rank takes the parameters and buffers of the last rank to join
  // (the highest, if several), which it returns. Every rank calls it once out of batches.
  int join() {
    state* s = state_.get();
    s->refuse_after_an_unfinished_pass();
    if (!s->uneven) {
      herd::detail::raise({"DistributedDataParallel", s->comm->rank(), s->comm->size()},
                          "join() needs optimizer_options::uneven_inputs, so that each forward agrees on who still trains",
                          "Pass uneven_inputs = true to DistributedDataParallel on every rank");
    }
    herd::detail::join_hook* const hooks[] = {s};
    int last = s->reducer.roster().join(*s->comm, hooks);
    if (last < 0) last = s->comm->size() - 1;  // no rank trained since the start: DDP takes the highest
    sync_module_states(last);
    return last;
  }

  // While the guard lives, forward passes do not prepare a reduction: their backward passes, run
  // inside the guard or after it, do not reduce (their gradients add up in param.grad()).
  using no_sync_guard = herd::detail::scoped_switch<no_sync_switch>;
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(no_sync_switch{state_.get()}); }

  // The buckets (indices into the parameters that require a gradient) and the time their
  // reductions took, hidden and not (optim/distributed_optimizer.hpp).
  std::vector<std::vector<std::size_t>> buckets() const { return state_->reducer.buckets(); }
  const overlap_stats& overlap() const noexcept { return state_->reducer.overlap(); }

 private:
  using accumulator_ptr = detail::accumulator_ptr;

  // As DDP's expect_sparse_gradient: per trainable parameter, whether it is the weight of an
  // Embedding or EmbeddingBag with sparse=true.
  std::vector<char> sparse_parameters() {
    std::vector<const void*> weights;
    auto take = [&](const auto* embedding) {  // null where the module is not of that kind
      if (embedding && embedding->options.sparse()) weights.push_back(embedding->weight.unsafeGetTensorImpl());
    };
    for (const auto& m : module_->modules()) {
      take(dynamic_cast<const ::torch::nn::EmbeddingImpl*>(m.get()));
      take(dynamic_cast<const ::torch::nn::EmbeddingBagImpl*>(m.get()));
    }
    std::vector<char> flags;
    for (const auto& p : state_->params) {
      flags.push_back(std::find(weights.begin(), weights.end(), p.unsafeGetTensorImpl()) != weights.end() ? 1 : 0);
    }
    return flags;
  }

  // As DDP's constructor: something to reduce, and the same parameters that require a gradient
  // on every rank (count, dtypes, shapes and memory layouts: the same number of elements in
  // another shape or order would take rank 0's values in the wrong places, and the buckets reduce
  // each gradient's elements in memory order). A problem one rank finds raises on every rank.
  void check_parameters() {
    state* s = state_.get();
    C& comm = *s->comm;
    std::string fault;
    if (s->params.empty()) {
      fault = "the module has no parameter that requires a gradient, so DistributedDataParallel is not needed "
              "(it would reduce nothing). Train the module without the wrapper, or give it a parameter to train";
    }
    for (std::size_t i = 0; i < s->params.size() && fault.empty(); ++i) {
      if (!s->sparse[i]) continue;
      if (s->uneven) {
        fault = "parameter " + s->names[i] + " has sparse gradients (an Embedding or EmbeddingBag with sparse=true), "
                "which herd's DDP does not reduce with uneven_inputs. Use sparse=false, or even inputs";
      } else if (!s->params[i].device().is_cpu()) {
        fault = "parameter " + s->names[i] + " has sparse gradients (an Embedding or EmbeddingBag with sparse=true) on " +
                s->params[i].device().str() + "; herd reduces sparse gradients of CPU parameters only, as PyTorch's "
                "DDP over NCCL takes none. Use sparse=false";
      }
    }
    std::vector<buffer_view> views;  // for the counts and dtypes
    try {
      for (auto& p : s->params) {
        views.push_back({p.data_ptr(), static_cast<std::size_t>(p.numel()), herd::detail::torch_dtype(p),
                         herd::detail::torch_device(p)});
      }
    } catch (const herd::error& e) {
      if (fault.empty()) fault = e.what();
      views.clear();
    }
    herd::detail::require_same_tensors(views, comm, "DistributedDataParallel", "trainable parameter", fault);
    // Counts and dtypes agree: now each parameter's rank, sizes and gradient layout (the strides
    // that place its elements).
    std::vector<std::int64_t> mine, all;
    for (const auto& p : s->params) {
      mine.push_back(p.dim());
      for (const std::int64_t d : p.sizes()) mine.push_back(d);
      for (const std::int64_t d : herd::detail::placing_strides(p.sizes(), herd::detail::gradient_strides(p))) mine.push_back(d);
    }
    for (const char sparse : s->sparse) mine.push_back(sparse);
    const std::vector<std::size_t> counts = allgatherv(mine, all, herd::detail::control_of(comm));
    auto list = [&](std::size_t from, std::int64_t n) {
      std::string text = "[";
      for (std::int64_t k = 0; k < n; ++k) text += (k ? ", " : "") + std::to_string(all[from + static_cast<std::size_t>(k)]);
      return text + "]";
    };
    auto same = [&](std::size_t a, std::size_t b, std::int64_t n) {
      return std::equal(all.begin() + static_cast<std::ptrdiff_t>(a), all.begin() + static_cast<std::ptrdiff_t>(a) + n,
                        all.begin() + static_cast<std::ptrdiff_t>(b));
    };
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); offset += counts[r], ++r) {
      std::size_t here = offset, first = 0;
      for (std::size_t i = 0; i < s->params.size(); ++i) {
        const std::int64_t n = all[first], n_here = all[here];
        const std::string which = "parameter " + s->names[i] + " (trainable parameter " + std::to_string(i) + ")";
        if (n != n_here || !same(first + 1, here + 1, n)) {
          herd::detail::raise({"DistributedDataParallel", comm.rank(), comm.size()},
                              which + " has sizes " + list(here + 1, n_here) + " on rank " + std::to_string(r) + " but " +
                                  list(first + 1, n) + " on rank 0",
                              "Every rank must build the same model: the same parameters in the same order and shapes");
        }
        if (!same(first + 1 + static_cast<std::size_t>(n), here + 1 + static_cast<std::size_t>(n), n)) {
          herd::detail::raise({"DistributedDataParallel", comm.rank(), comm.size()},
                              which + " lies in memory with strides " + list(here + 1 + static_cast<std::size_t>(n), n) +
                                  " on rank " + std::to_string(r) + " but " + list(first + 1 + static_cast<std::size_t>(n), n) +
                                  " on rank 0 (strides of length-1 dimensions shown as 0): its memory format differs, "
                                  "e.g. channels_last on one rank only, and the buckets reduce elements in memory order",
                              "Give the parameter the same memory format on every rank (e.g. "
                              "p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast)) on each) before wrapping the module");
        }
        first += 1 + 2 * static_cast<std::size_t>(n);
        here += 1 + 2 * static_cast<std::size_t>(n_here);
      }
      // Then which of them have sparse gradients: each rank's flags after its records.
      for (std::size_t i = 0; i < s->params.size(); ++i, ++first, ++here) {
        if (all[first] == all[here]) continue;
        auto kind = [](std::int64_t sparse) { return sparse ? "sparse gradients (an Embedding or EmbeddingBag with sparse=true)" : "dense gradients"; };
        herd::detail::raise({"DistributedDataParallel", comm.rank(), comm.size()},
                            "parameter " + s->names[i] + " (trainable parameter " + std::to_string(i) + ") has " +
                                kind(all[here]) + " on rank " + std::to_string(r) + " but " + kind(all[first]) + " on rank 0",
                            "Build the module alike on every rank: the same sparse option of each Embedding and EmbeddingBag");
      }
    }
  }

  // As DDP's at construction and after a join: the root's parameters, and its buffers unless
  // broadcast_buffers is off (as PyTorch 2's DDP; 1.13's broadcast them at construction anyway),
  // element by element whatever each rank's memory layout.
  void sync_module_states(int root) {
    herd::detail::broadcast_module(*module_, *state_->comm, root, state_->broadcast_buffers);
  }

  Module module_;
  std::unique_ptr<state> state_;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_TORCH_DISTRIBUTED_DATA_PARALLEL_HPP
