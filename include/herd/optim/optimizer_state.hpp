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

#include <herd/tensor/buffer_view.hpp>

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

}  // namespace herd

#endif  // HERD_OPTIM_OPTIMIZER_STATE_HPP
