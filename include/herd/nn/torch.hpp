#ifndef HERD_NN_TORCH_HPP
#define HERD_NN_TORCH_HPP
// Moved: herd::torch::SyncBatchNorm and convert_sync_batchnorm are in herd/torch/sync_batch_norm.hpp.
// This path keeps working for programs that include it.

#include <herd/torch/sync_batch_norm.hpp>

#endif  // HERD_NN_TORCH_HPP
