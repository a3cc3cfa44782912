#ifndef HERD_TORCH_HPP
#define HERD_TORCH_HPP
// herd for libtorch, all of it: include it after <torch/torch.h> (herd/herd.hpp does not, so that
// programs without libtorch never see it). Each part alone:
//
//   herd/torch/tensor_traits.hpp             torch::Tensor as a herd tensor (collectives on it)
//   herd/torch/gradients.hpp                 torch_gradients: a libtorch optimizer's gradients for
//                                            herd::distributed_optimizer
//   herd/torch/broadcast.hpp                 broadcast_parameters of a module, broadcast_optimizer_state
//                                            of libtorch's SGD, Adam and AdamW
//   herd/torch/distributed_data_parallel.hpp herd::torch::DistributedDataParallel, PyTorch's DDP
//   herd/torch/sync_batch_norm.hpp           herd::torch::SyncBatchNorm, convert_sync_batchnorm

#include <herd/torch/broadcast.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/gradients.hpp>
#include <herd/torch/sync_batch_norm.hpp>
#include <herd/torch/tensor_traits.hpp>

#endif  // HERD_TORCH_HPP
