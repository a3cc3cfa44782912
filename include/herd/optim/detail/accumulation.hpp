#ifndef HERD_OPTIM_DETAIL_ACCUMULATION_HPP
#define HERD_OPTIM_DETAIL_ACCUMULATION_HPP
// Local accumulation of backward passes between reductions (backward_passes_per_step, no_sync):
// which passes reduce, and how the others add up. With accumulation::in_gradients the gradient
// tensors hold the sum themselves (the caller's backward adds into them): passes are only counted.
// With accumulation::by_copy the passes held back are copied into accumulators of
// accumulation_dtype (f32 for 16-bit gradients), and the reduction folds the sum into the
// gradients (or, for a gradient unused in the reducing pass, packs the sum itself).

#include <herd/core/dtype.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <vector>

namespace herd::detail {

class local_accumulation {
 public:
  local_accumulation(int passes_per_step, herd::accumulation how) : passes_per_step_(passes_per_step), how_(how) {}

  // Whether the coming pass only accumulates (no_sync, or not yet the round's last pass).
  bool holds_back() const noexcept { return no_sync_ || passes_ + 1 < passes_per_step_; }
  // Passes accumulated since the last reduction.
  int passes() const noexcept { return passes_; }
  // Whether the passes held back are copied here (accumulation::by_copy).
  bool copies() const noexcept { return how_ == herd::accumulation::by_copy; }
  // Whether the gradients must be added to a sum held here before they are reduced.
  bool holds_sums() const noexcept { return copies() && passes_ > 0; }
  // Whether the gradient tensors hold the sum of passes held back (in_gradients): a gradient the
  // reducing pass did not produce still carries the earlier passes' part.
  bool sums_in_gradients() const noexcept { return !copies() && passes_ > 0; }
  // A pass held back whose gradients are not copied (they hold the sum themselves, or had a
  // problem that the round's reduction raises): it still counts.
  void count_pass() noexcept { ++passes_; }
  // The round ends (reduced, or abandoned).
  void reset() noexcept { passes_ = 0; }

  bool no_sync() const noexcept { return no_sync_; }
  void set_no_sync(bool on) noexcept { no_sync_ = on; }

  // Adds this pass's gradients to the sum (the first pass of a round starts it).
  template <class Mover> void add(const std::vector<buffer_view>& grads, Mover& mover) {
    const bool first = passes_ == 0;
    mover.begin();
    if (first) sums_.clear();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (first) sums_.push_back(mover.accumulator(i, accumulation_dtype(grads[i].type), grads[i].count));
      mover.accumulate(sums_[i], grads[i], first);
    }
    mover.finish();
    ++passes_;
  }

  // grads = the sum of the accumulated passes and the current one; the round's sum is spent.
  template <class Mover> void fold(const std::vector<buffer_view>& grads, Mover& mover) {
    if (!holds_sums()) return;
    mover.begin();
    for (std::size_t i = 0; i < grads.size(); ++i) mover.fold(grads[i], sums_[i]);
    mover.finish();
    passes_ = 0;
  }

  // Gradient i's sum over the accumulated passes (while holds_sums()).
  const buffer_view& sum(std::size_t i) const { return sums_[i]; }

 private:
  int passes_per_step_;
  herd::accumulation how_;
  int passes_ = 0;
  bool no_sync_ = false;
  std::vector<buffer_view> sums_;
};

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_ACCUMULATION_HPP
