#ifndef HERD_TORCH_DETAIL_OPTIMIZER_STATE_HPP
#define HERD_TORCH_DETAIL_OPTIMIZER_STATE_HPP
// The state and hyperparameters of libtorch's SGD, Adam and AdamW, as broadcast_optimizer_state
// (torch/broadcast.hpp) moves them.

#include <herd/core/error.hpp>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {
namespace detail {

// libtorch keys optimizer state by the parameter's TensorImpl address: as a string up to 2.1, as
// the address itself (void*) from 2.2. The key type is read off the optimizer's own state map, so
// the right one is chosen for whichever libtorch this file is compiled against.
using torch_state_key_type = typename std::decay_t<decltype(std::declval<::torch::optim::Optimizer&>().state())>::key_type;

template <class Key = torch_state_key_type>  // a template, so that only the branch of this libtorch compiles
Key torch_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // the form libtorch 1.x writes (c10::guts::to_string of the pointer)
    key << p.unsafeGetTensorImpl();
    return key.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

// Makes sure `opt` holds state for every parameter (libtorch creates it lazily at the first step),
// filled as a first step would start from: zeros and step 0. Returns the step counters and the
// state tensors, in parameter order.
inline void torch_state(::torch::optim::Optimizer& opt, std::vector<std::int64_t*>& steps, std::vector<at::Tensor*>& tensors) {
  auto& state = opt.state();
  for (auto& group : opt.param_groups()) {
    for (auto& p : group.params()) {
      const torch_state_key_type key = torch_state_key(p);
      auto zeros = [&] { return ::torch::zeros_like(p, at::MemoryFormat::Contiguous); };
      if (auto* sgd = dynamic_cast<::torch::optim::SGD*>(&opt)) {
        (void)sgd;
        if (static_cast<::torch::optim::SGDOptions&>(group.options()).momentum() == 0) continue;
        if (!state.count(key)) {
          auto s = std::make_unique<::torch::optim::SGDParamState>();
          s->momentum_buffer(zeros());
          state[key] = std::move(s);
        }
        tensors.push_back(&static_cast<::torch::optim::SGDParamState&>(*state[key]).momentum_buffer());
      } else if (dynamic_cast<::torch::optim::Adam*>(&opt) || dynamic_cast<::torch::optim::AdamW*>(&opt)) {
        const bool is_adam = dynamic_cast<::torch::optim::Adam*>(&opt) != nullptr;
        const bool amsgrad = is_adam ? static_cast<::torch::optim::AdamOptions&>(group.options()).amsgrad()
                                     : static_cast<::torch::optim::AdamWOptions&>(group.options()).amsgrad();
        auto fill = [&](auto& s) {
          if (!s.exp_avg().defined()) {
            s.step(0);
            s.exp_avg(zeros());
            s.exp_avg_sq(zeros());
            if (amsgrad) s.max_exp_avg_sq(zeros());
          }
          steps.push_back(&s.step());
          tensors.push_back(&s.exp_avg());
          tensors.push_back(&s.exp_avg_sq());
          if (amsgrad) tensors.push_back(&s.max_exp_avg_sq());
        };
        if (is_adam) {
          if (!state.count(key)) state[key] = std::make_unique<::torch::optim::AdamParamState>();
          fill(static_cast<::torch::optim::AdamParamState&>(*state[key]));
        } else {
          if (!state.count(key)) state[key] = std::make_unique<::torch::optim::AdamWParamState>();
          fill(static_cast<::torch::optim::AdamWParamState&>(*state[key]));
        }
      } else {
        raise({"broadcast_optimizer_state"}, "herd knows the state of libtorch's SGD, Adam and AdamW only",
              "For another optimizer, broadcast its state tensors with herd::broadcast, or save it with torch::save "
              "on rank 0 and load it on every rank");
      }
    }
  }
}

// f(value) for each hyperparameter of `group` (a double& or bool&): all of SGD's, Adam's and
// AdamW's options; the learning rate alone for another optimizer.
template <class F> void visit_hyperparameters(::torch::optim::Optimizer& opt, ::torch::optim::OptimizerParamGroup& group, F&& f) {
  auto& o = group.options();
  const auto adam_like = [&](auto& a) {
    f(a.lr()), f(std::get<0>(a.betas())), f(std::get<1>(a.betas())), f(a.eps()), f(a.weight_decay()), f(a.amsgrad());
  };
  if (dynamic_cast<::torch::optim::SGD*>(&opt)) {
    auto& s = static_cast<::torch::optim::SGDOptions&>(o);
    f(s.lr()), f(s.momentum()), f(s.dampening()), f(s.weight_decay()), f(s.nesterov());
  } else if (dynamic_cast<::torch::optim::Adam*>(&opt)) {
    adam_like(static_cast<::torch::optim::AdamOptions&>(o));
  } else if (dynamic_cast<::torch::optim::AdamW*>(&opt)) {
    adam_like(static_cast<::torch::optim::AdamWOptions&>(o));
  } else {
    double lr = o.get_lr();
    f(lr);
    o.set_lr(lr);
  }
}

}  // namespace detail
}  // namespace herd

#endif  // HERD_TORCH_DETAIL_OPTIMIZER_STATE_HPP
