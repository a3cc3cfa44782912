#ifndef HERD_OPTIM_PARAMETERS_HPP
#define HERD_OPTIM_PARAMETERS_HPP
// herd::parameters: a model's parameters and their gradients, listed once and handed to every part
// of the training layer that needs them, instead of the same herd::views(...) written out for each:
//
//   herd::parameters params{herd::views(w, b), herd::views(grad_w, grad_b)};
//   herd::sgd sgd(params, {.lr = 0.01, .momentum = 0.9});
//   herd::distributed_optimizer opt(sgd, params, comm);   // reduces params.gradients
//   herd::broadcast_parameters(params, comm, 0);          // sends params.values
//
// Both lists are views: the tensors stay the caller's, and must outlive the objects given them.
// Where gradients move between steps (libtorch's zero_grad, a reallocating library), pass the
// distributed optimizer a gradient_source instead.

#include <herd/tensor/buffer_view.hpp>

#include <vector>

namespace herd {

struct parameters {
  std::vector<buffer_view> values;     // what the optimizer updates
  std::vector<buffer_view> gradients;  // their gradients, in the same order
};

}  // namespace herd

#endif  // HERD_OPTIM_PARAMETERS_HPP
