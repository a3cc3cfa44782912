#ifndef HERD_OPTIM_TORCH_DDP_HPP
#define HERD_OPTIM_TORCH_DDP_HPP
// Moved: herd::torch::DistributedDataParallel is in herd/torch/distributed_data_parallel.hpp. This
// path keeps working for programs that include it, and still gives what it gave beside the
// wrapper (herd/torch/gradients.hpp and herd/torch/broadcast.hpp).

#include <herd/torch/broadcast.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/gradients.hpp>

#endif  // HERD_OPTIM_TORCH_DDP_HPP
