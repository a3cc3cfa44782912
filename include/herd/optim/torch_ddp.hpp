#ifndef HERD_OPTIM_TORCH_DDP_HPP
#define HERD_OPTIM_TORCH_DDP_HPP
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
// rank. no_sync() skips the reduction while its guard lives: libtorch sums the gradients of
// those passes in param.grad(), and the first backward after it reduces the sum.
//
// As DDP (each checked against it by tests/parity, parity_ddp):
// - forward() first broadcasts rank 0's buffers (BatchNorm's running statistics) when the last
//   forward was a synchronized one with autograd on (options.broadcast_buffers, default on).
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

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/detail/reducer.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/optim/torch.hpp>
#include <herd/tensor/torch.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace herd::torch {
HERD_CONFIG_NAMESPACE_BEGIN

template <class Module, communicator C> class DistributedDataParallel {
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
    // Every rank has the same parameters and buffers, then rank 0's values.
    broadcast_parameters(*module_, comm, 0);
    for (auto& p : module_->parameters()) {
      if (p.requires_grad()) state_->params.push_back(p);
    }
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
    }
  }

  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;
  DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept = default;
  ~DistributedDataParallel() {
    if (!state_) return;
    for (auto& [accumulator, key] : state_->hooks) accumulator->del_post_hook(key);
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
    return module_->forward(std::forward<Args>(args)...);
  }

  // This rank has no batches left (options.uneven_inputs, DDP's Join([ddp])): until every rank has
  // joined, it runs what each forward and backward of the others needs of it (the buffer broadcast,
  // the buckets' allreduces with zeros, the used flags), without touching its own gradients. Then,
  // as DDP's join hook, every rank takes the parameters and buffers of the last rank to join
  // (the highest, if several), which it returns. Every rank calls it once out of batches.
  int join() {
    state* s = state_.get();
    if (!s->uneven) {
      herd::detail::raise({"DistributedDataParallel", s->comm->rank(), s->comm->size()},
                          "join() needs optimizer_options::uneven_inputs, so that each forward agrees on who still trains",
                          "Pass uneven_inputs = true to DistributedDataParallel on every rank");
    }
    herd::detail::join_hook* const hooks[] = {s};
    int last = s->reducer.roster().join(*s->comm, hooks);
    if (last < 0) last = s->comm->size() - 1;  // no rank trained since the start: DDP takes the highest
    broadcast_parameters(*module_, *s->comm, last);
    return last;
  }

  // While the guard lives, backward passes do not reduce (their gradients add up in param.grad()).
  class no_sync_guard {
   public:
    explicit no_sync_guard(DistributedDataParallel& d) : owner_(&d) { owner_->state_->no_sync = true; }
    no_sync_guard(no_sync_guard&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;
    no_sync_guard& operator=(no_sync_guard&&) = delete;
    ~no_sync_guard() {
      if (owner_) owner_->state_->no_sync = false;
    }

   private:
    DistributedDataParallel* owner_;
  };
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  // The buckets (indices into the parameters that require a gradient) and the time their
  // reductions took, hidden and not (optim/distributed_optimizer.hpp).
  std::vector<std::vector<std::size_t>> buckets() const { return state_->reducer.buckets(); }
  const overlap_stats& overlap() const noexcept { return state_->reducer.overlap(); }

 private:
  // A gradient accumulator as libtorch hands it out: std::shared_ptr, c10::intrusive_ptr in newer releases.
  using accumulator_ptr = decltype(::torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

  // What the hooks point to: it stays where it is when the DDP object moves.
  struct state final : herd::detail::join_hook {
    // No local accumulation: under no_sync() libtorch adds the passes up in param.grad() itself.
    // static_graph, as DDP's, allows unused parameters without find_unused_parameters.
    state(C& c, optimizer_options options)
        : reducer(c, gradient_source(), with_unused(options), nullptr),
          comm(&c),
          broadcast_buffers(options.broadcast_buffers),
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
      const ::torch::NoGradGuard no_grad;
      for (auto& b : buffers()) broadcast(b, *comm, root);
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
            for (auto& p : params) shadow_grads.push_back(::torch::zeros_like(p, ::torch::MemoryFormat::Contiguous));
          }
          for (auto& g : shadow_grads) views.push_back(view_of(g));
          return views;
        }
        for (std::size_t i = 0; i < params.size(); ++i) {
          at::Tensor& p = params[i];
          if (!p.grad().defined()) {
            const ::torch::NoGradGuard no_grad;
            p.mutable_grad() = in_bucket.empty() ? ::torch::zeros_like(p) : in_bucket[i].zero_();
            if (!created.empty()) created[i] = 1;
          }
          views.push_back(view_of(p.mutable_grad()));
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
      for (auto& p : params) shapes.emplace_back(static_cast<std::size_t>(p.numel()), herd::detail::torch_dtype(p));
      for (const gradient_bucket& b : bucket_layout(shapes, options, tensor_traits<at::Tensor>::device(params.front()))) {
        const at::Tensor& first = params[b.members.front()];
        at::Tensor storage = ::torch::zeros({static_cast<std::int64_t>(b.count)}, first.options());
        for (std::size_t k = 0; k < b.members.size(); ++k) {
          at::Tensor& p = params[b.members[k]];
          at::Tensor g = ::torch::empty({0}, first.options());
          g.set_(storage.storage(), static_cast<std::int64_t>(b.offsets[k]), p.sizes());
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

    // The hook of parameter i's gradient accumulator: its gradient is final for this pass. A hook
    // may fire with no gradient (a backward function that gives its input none): as DDP's, that
    // parameter was not used here, and is reduced as zeros (find_unused_parameters: from what it
    // holds, at the end of the pass).
    void ready(std::size_t i) {
      std::lock_guard lock(mutex);
      if (no_sync) {
        if (find_unused) used_unsynced[i] = 1;  // used at the next reduction, as DDP's from PyTorch 2.4
        return;
      }
      if (!queued) {
        queued = true;
        ::torch::autograd::Engine::get_default_engine().queue_callback([this] { finish(); });
      }
      if (!params[i].grad().defined()) {
        if (find_unused) return;
        const ::torch::NoGradGuard no_grad;
        if (in_bucket.empty()) params[i].mutable_grad() = ::torch::zeros_like(params[i]);
      } else {
        used[i] = 1;
      }
      try {
        repoint(i);
        const buffer_view grad = view_of(params[i].mutable_grad());
        reducer.mark(i, &grad);
      } catch (...) {
        queued = false;
        throw;
      }
    }

    // At the end of backward: waits for the buckets and writes the averages into the gradients.
    void finish() {
      std::lock_guard lock(mutex);
      queued = false;
      if (!find_unused) {
        reducer.synchronize();
        std::fill(created.begin(), created.end(), 0);
        return;
      }
      // The gradients this rank did not produce, as they were before the pass (undefined where the
      // reduction had to create them), for those that no rank produced.
      std::vector<std::pair<std::size_t, at::Tensor>> kept;
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (used[i]) continue;
        const at::Tensor& g = params[i].grad();
        kept.emplace_back(i, g.defined() && !created[i] ? g.detach().clone() : at::Tensor());
      }
      // As DDP's: one this pass did not use is reduced from the gradient it holds (the sum of
      // no_sync() passes, say), zeros where it holds none.
      for (auto& [i, g] : kept) {
        if (!g.defined()) continue;
        repoint(i);
        const buffer_view grad = view_of(params[i].mutable_grad());
        reducer.mark(i, &grad);
      }
      reducer.synchronize();
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
    herd::detail::reducer<C> reducer;
    std::vector<std::pair<accumulator_ptr, std::uintptr_t>> hooks;
    std::vector<at::Tensor> in_bucket;  // gradient_as_bucket_view: each gradient's place in its bucket
    std::vector<char> used;              // find_unused_parameters: produced by this rank in this pass
    std::vector<char> used_unsynced;     // ... or in a no_sync() pass since the last reduction
    std::vector<char> created;           // undefined until the reduction of this pass zero-filled it
    std::vector<std::int32_t> anywhere;  // per parameter: some rank used it (in the first pass, with static_graph)
    std::vector<at::Tensor> shadow_grads;  // what a joined rank's rounds reduce
    std::function<std::vector<at::Tensor>()> buffers;  // the module's, as they are now
    C* comm = nullptr;
    std::mutex mutex;
    bool queued = false;
    bool no_sync = false;
    bool broadcast_buffers = true;
    bool find_unused = false;
    bool static_graph = false;
    bool uneven = false;
    bool used_known = false;  // static_graph: anywhere holds the first pass's
    bool shadowing = false;   // in a joined rank's round: the gradients are shadow_grads
    bool sync_buffers_next = true;
  };

  Module module_;
  std::unique_ptr<state> state_;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_OPTIM_TORCH_DDP_HPP
