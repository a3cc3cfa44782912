#ifndef HERD_OPTIM_OPTIMIZER_STATE_HPP
#define HERD_OPTIM_OPTIMIZER_STATE_HPP
// How herd reaches an optimizer's state (momentum buffers, moment estimates, step counts), for
// broadcast_optimizer_state and checkpoints. An optimizer either has a member
//
//   template <class F> void visit_state(F&& f);   // calls f(name, herd::buffer_view tensor), name a std::string
//
// or a specialization of herd::optimizer_state_traits<Optimizer> with a static visit(opt, f).
// The state must exist before the first step (allocate it in the constructor), so that a freshly
// built optimizer can receive state from another rank or from a checkpoint.
//
// An optimizer whose state is split over the ranks (zero_optimizer) may also have
//
//   template <class F> void visit_sharded_state(F&& f);   // calls f(name, herd::sharded_view part)
//
// naming each tensor as the unsharded optimizer of the same kind would, with this rank's part of
// it. A checkpoint saves such state whole, in one file, and each rank loads back its part, so the
// file loads at any world size and into the unsharded optimizer too.

#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <string_view>
#include <utility>

namespace herd {

template <class Optimizer> struct optimizer_state_traits {
  template <class F> static void visit(Optimizer& opt, F&& f) {
    static_assert(requires { opt.visit_state(std::forward<F>(f)); },
                  "herd: this optimizer does not expose its state. Give it a member template "
                  "visit_state(F&& f) calling f(name, herd::buffer_view) for each state tensor, or specialize "
                  "herd::optimizer_state_traits<YourOptimizer>.");
    opt.visit_state(std::forward<F>(f));
  }
};

// Calls f(name, view) for every state tensor of `opt`.
template <class Optimizer, class F> void visit_optimizer_state(Optimizer& opt, F&& f) {
  optimizer_state_traits<Optimizer>::visit(opt, std::forward<F>(f));
}

// This rank's part of a state tensor split over the ranks: elements [offset, offset + part.count)
// of a tensor of `count` elements of part.type. The ranks' parts, taken in rank order, follow one
// another from element 0 to the last (an empty part where a rank holds none). A tensor every rank
// holds whole and alike (a step count) is `replicated`: part is all of it, saved from one rank.
struct sharded_view {
  buffer_view part;
  std::size_t offset = 0;
  std::size_t count = 0;
  bool replicated = false;
};

template <class Optimizer>
concept sharded_optimizer_state = requires(Optimizer& opt) {
  opt.visit_sharded_state([](const auto&, const sharded_view&) {});
};

}  // namespace herd

#endif  // HERD_OPTIM_OPTIMIZER_STATE_HPP
