#ifndef HERD_OPTIM_MIXED_PRECISION_HPP
#define HERD_OPTIM_MIXED_PRECISION_HPP
// Mixed precision as apex and torch.cuda.amp users know it: a dynamic loss scaler, and f32 master
// weights for f16/bf16 parameters.
//
//   herd::loss_scaler scaler;                               // 2^16, x2 after 2000 clean steps, x0.5 on overflow
//   herd::mixed_precision amp(params16, grads16, scaler, [](auto master_params, auto master_grads) {
//     return herd::adamw(std::move(master_params), std::move(master_grads));   // steps the f32 masters
//   });
//   herd::distributed_optimizer opt(amp, grads16, comm);   // reduces the f16 gradients, then amp.step()
//   ...forward in f16; backward from loss * scaler.scale()...
//   opt.step();                                            // skipped on every rank when any overflowed
//
// To clip, as torch.cuda.amp's scaler.unscale_(opt) then clip_grad_norm_ then scaler.step(opt):
//   opt.synchronize();                                     // the reduced gradients
//   amp.unscale();                                         // into the f32 master gradients
//   herd::clip_grad_norm(amp.master_grads(), 1.0);         // optim/clip.hpp
//   opt.step();                                            // does not reduce or unscale again
//
// mixed_precision::step() reads the gradients after the reduction, unscales them into f32 master
// gradients and checks them for inf and NaN: an overflow on any rank reaches every rank's reduced
// gradients (inf + x = inf, inf - inf = NaN), and herd's reductions give every rank the same bits,
// so every rank sees the same overflow and skips the same step, with no collective of its own.
// Without one, the wrapped optimizer steps the f32 masters, which are copied back (rounded) into
// the f16/bf16 parameters. f32 and f64 parameters are their own masters (their gradients are
// unscaled in place).
//
// A master belongs to its parameter while the parameter holds the master rounded: where a step
// finds a parameter that no longer does (broadcast_parameters after construction, as Horovod's
// order has it, or parameters loaded alone), the master is read again from the parameter, so
// every rank steps from what the parameters hold. Masters restored with their parameters (a
// checkpoint, broadcast_optimizer_state) round to them and are kept with their extra bits.
//
// It is for the distributed optimizer, which hands it gradients that are the same on every rank,
// and it keeps every parameter's master on every rank. For fp16 ZeRO (DeepSpeed's fp16 ZeRO-1),
// use zero_optimizer alone: it takes the scaler itself (zero_options::scaler), agrees on
// overflows across its shards, and keeps the f32 masters of its rank's shard only
// (zero_options::master_weights, on by default for f16/bf16 parameters). The two do not nest.

#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/detail/master_weights.hpp>
#include <herd/optim/detail/unscale.hpp>
#include <herd/optim/loss_scaler.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {

template <class Inner> class mixed_precision {
 public:
  template <class Make>
  mixed_precision(std::vector<buffer_view> params, std::vector<buffer_view> grads, loss_scaler& scaler, Make make)
      : params_(std::move(params)), grads_(std::move(grads)), scaler_(&scaler) {
    detail::require_parameter_pairs(params_, grads_, "mixed_precision");
    std::vector<buffer_view> master_params, master_grads;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const buffer_view& p = params_[i];
      if (detail::has_master_weights(p.type)) {
        master_.emplace_back(dtype::f32, p.count);
        master_grads_.emplace_back(dtype::f32, p.count);
        detail::read_masters(static_cast<float*>(master_.back().data()), p.data, p.type, p.count);  // read again if p changes
        master_params.push_back(master_.back().view());
        master_grads.push_back(master_grads_.back().view());
      } else {
        master_.emplace_back();
        master_grads_.emplace_back();
        master_params.push_back(p);
        master_grads.push_back(grads_[i]);
      }
    }
    masters_ = master_params;
    master_grad_views_ = master_grads;
    inner_.emplace(make(std::move(master_params), std::move(master_grads)));
  }

  // Unscales the gradients into the master gradients and checks them for inf and NaN; returns
  // whether it found any. Once per step: the next step() uses these master gradients as they are
  // then (clipped, say) instead of unscaling again.
  bool unscale() {
    if (unscaled_) return overflow_;
    const double unscale = 1.0 / scaler_->scale();
    overflow_ = false;
    for (std::size_t i = 0; i < grads_.size(); ++i) {
      overflow_ = detail::unscale(master_grad_views_[i], grads_[i], unscale, !overflow_) || overflow_;
    }
    unscaled_ = true;
    return overflow_;
  }

  // Unscales (unless unscale() did), then steps the wrapped optimizer and copies the masters back,
  // or skips the step on an overflow. Either way the scaler learns of it.
  void step() {
    const bool overflow = unscale();
    unscaled_ = false;
    skipped_ = overflow;
    scaler_->update(overflow);
    if (overflow) return;
    refresh_masters();
    inner_->step();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (master_[i].count() != 0) {
        detail::write_masters(params_[i].data, params_[i].type, static_cast<const float*>(master_[i].data()), params_[i].count);
      }
    }
  }

  // The gradients the wrapped optimizer steps with: f32 masters' (the gradients themselves where
  // the parameters are f32/f64). Unscaled after unscale().
  const std::vector<buffer_view>& master_grads() const noexcept { return master_grad_views_; }

  // Whether the last step was skipped for an overflow.
  bool last_step_skipped() const noexcept { return skipped_; }
  Inner& inner() noexcept { return *inner_; }
  // The f32 weights the wrapped optimizer steps (the parameters themselves where they are f32/f64).
  const std::vector<buffer_view>& master_params() const noexcept { return masters_; }

  // The masters, the wrapped optimizer's state and the scaler's: what a checkpoint needs to resume.
  template <class F> void visit_state(F&& f) {
    for (std::size_t i = 0; i < master_.size(); ++i) {
      if (master_[i].count() != 0) f("master." + std::to_string(i), master_[i].view());
    }
    visit_optimizer_state(*inner_, [&](const auto& name, buffer_view v) { f("inner." + std::string(name), v); });
    scaler_->visit_state([&](const auto& name, buffer_view v) { f("scaler." + std::string(name), v); });
  }

 private:
  // Reads again each master whose parameter no longer holds it rounded (see the top).
  void refresh_masters() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (master_[i].count() != 0) {
        detail::refresh_masters(static_cast<float*>(master_[i].data()), params_[i].data, params_[i].type, params_[i].count);
      }
    }
  }

  std::vector<buffer_view> params_, grads_;
  loss_scaler* scaler_;
  std::vector<host_tensor> master_, master_grads_;  // empty where the parameter is its own master
  std::vector<buffer_view> masters_, master_grad_views_;
  std::optional<Inner> inner_;
  bool skipped_ = false;
  bool unscaled_ = false;  // unscale() ran since the last step()
  bool overflow_ = false;  // what it found
};

template <class Make>
mixed_precision(std::vector<buffer_view>, std::vector<buffer_view>, loss_scaler&, Make)
    -> mixed_precision<std::invoke_result_t<Make, std::vector<buffer_view>, std::vector<buffer_view>>>;

}  // namespace herd

#endif  // HERD_OPTIM_MIXED_PRECISION_HPP
