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
//     sgd.step();                                                // the gradients are averaged already
//   }
//
// As DDP's Reducer: a hook on each parameter's gradient accumulator tells herd's distributed
// optimizer (optim/distributed_optimizer.hpp) that the gradient is final (mark_ready); buckets
// of gradients start their allreduce as soon as they are complete, in bucket order on every rank,
// while backward goes on; a callback queued on the autograd engine at the first hook waits for
// the buckets at the end of backward and writes the averaged gradients back into param.grad(),
// so that the optimizer's step needs no call of herd's. Errors (a parameter without a gradient,
// unless find_unused_parameters; a rank whose gradients changed) raise from backward() on every
// rank. no_sync() skips the reduction while its guard lives: libtorch sums the gradients of
// those passes in param.grad(), and the first backward after it reduces the sum.
//
// With options.gradient_as_bucket_view (DDP's), each param.grad() is made, at construction, a
// tensor inside its bucket's storage (laid out by herd::bucket_layout, kept for the wrapper's
// life): buckets reduce in place, without the copies in and out. As with DDP, keep those tensors:
// zero them (libtorch's zero_grad() does), do not set them to undefined or replace them (herd then
// packs again, correctly but with the copies).
//
// On GPU tensors, give it a nccl_communicator: buckets are packed on the device and reduced
// stream-ordered, with no host copy of the gradients.

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/distributed_optimizer.hpp>
#include <herd/optim/torch.hpp>
#include <herd/tensor/torch.hpp>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/utils.h>

#include <cstdint>
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
    if (options.backward_passes_per_step != 1) {
      detail::raise({"DistributedDataParallel", comm.rank(), comm.size()},
                    "backward_passes_per_step is for herd::distributed_optimizer",
                    "Accumulate passes as with PyTorch's DDP: run them under no_sync(); libtorch sums their gradients");
    }
    // Every rank has the same parameters and buffers, then rank 0's values.
    broadcast_parameters(*module_, comm, 0);
    for (auto& p : module_->parameters()) {
      if (p.requires_grad()) state_->params.push_back(p);
    }
    if (options.gradient_as_bucket_view) state_->place_gradients_in_buckets(options);
    state* s = state_.get();
    for (std::size_t i = 0; i < s->params.size(); ++i) {
      std::shared_ptr<::torch::autograd::Node> accumulator = ::torch::autograd::impl::grad_accumulator(s->params[i]);
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

  Module& module() noexcept { return module_; }
  auto operator->() { return &*module_; }
  template <class... Args> auto forward(Args&&... args) { return module_->forward(std::forward<Args>(args)...); }

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
  std::vector<std::vector<std::size_t>> buckets() const { return state_->opt.buckets(); }
  const overlap_stats& overlap() const noexcept { return state_->opt.overlap(); }

 private:
  // What the hooks point to: it stays where it is when the DDP object moves.
  struct state {
    struct nothing_to_step {
      void step() {}
    };

    state(C& comm, const optimizer_options& options)
        : opt(inner, gradient_source(), comm, options) {}

    // The gradients as the optimizer reads those it was not told of (unused parameters): zeros
    // for a parameter that got none, as PyTorch's DDP reduces them.
    typename distributed_optimizer<nothing_to_step, C>::gradient_source gradient_source() {
      return [this] {
        std::vector<buffer_view> views;
        for (auto& p : params) {
          if (!p.grad().defined()) p.mutable_grad() = ::torch::zeros_like(p);
          views.push_back(view_of(p.mutable_grad()));
        }
        return views;
      };
    }

    // Makes every gradient a tensor inside its bucket's storage (its current values kept). Not a
    // view in autograd's sense (zero_grad() detaches gradients in place, which views refuse): a
    // tensor on the bucket's storage at the gradient's offset.
    void place_gradients_in_buckets(const optimizer_options& options) {
      ::torch::NoGradGuard no_grad;
      std::vector<std::pair<std::size_t, dtype>> shapes;
      for (auto& p : params) shapes.emplace_back(static_cast<std::size_t>(p.numel()), detail::torch_dtype(p));
      for (const gradient_bucket& b : bucket_layout(shapes, options)) {
        const at::Tensor& first = params[b.members.front()];
        at::Tensor storage = ::torch::zeros({static_cast<std::int64_t>(b.count)}, first.options());
        for (std::size_t k = 0; k < b.members.size(); ++k) {
          at::Tensor& p = params[b.members[k]];
          at::Tensor g = ::torch::empty({0}, first.options());
          g.set_(storage.storage(), static_cast<std::int64_t>(b.offsets[k]), p.sizes());
          if (p.grad().defined()) g.copy_(p.grad());
          p.mutable_grad() = g;
        }
      }
    }

    // The hook of parameter i's gradient accumulator: its gradient is final for this pass.
    void ready(std::size_t i) {
      std::lock_guard lock(mutex);
      if (no_sync) return;
      if (!queued) {
        queued = true;
        ::torch::autograd::Engine::get_default_engine().queue_callback([this] { finish(); });
      }
      try {
        opt.mark_ready(i, view_of(params[i].mutable_grad()));
      } catch (...) {
        queued = false;
        throw;
      }
    }

    // At the end of backward: waits for the buckets and writes the averages into the gradients.
    void finish() {
      std::lock_guard lock(mutex);
      queued = false;
      opt.step();
    }

    std::vector<at::Tensor> params;
    nothing_to_step inner;
    distributed_optimizer<nothing_to_step, C> opt;
    std::vector<std::pair<std::shared_ptr<::torch::autograd::Node>, std::uintptr_t>> hooks;
    std::mutex mutex;
    bool queued = false;
    bool no_sync = false;
  };

  Module module_;
  std::unique_ptr<state> state_;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::torch

#endif  // HERD_OPTIM_TORCH_DDP_HPP
