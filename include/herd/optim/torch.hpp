#ifndef HERD_OPTIM_TORCH_HPP
#define HERD_OPTIM_TORCH_HPP
// Moved to herd/torch/: torch_gradients to herd/torch/gradients.hpp, broadcast_parameters and
// broadcast_optimizer_state for libtorch to herd/torch/broadcast.hpp. This path keeps working for
// programs that include it, and still gives both.

#include <herd/torch/broadcast.hpp>
#include <herd/torch/gradients.hpp>

#endif  // HERD_OPTIM_TORCH_HPP
