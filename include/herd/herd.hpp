#ifndef HERD_HERD_HPP
#define HERD_HERD_HPP
// herd: data-parallel training for C++ tensor libraries. This header brings in everything that
// needs nothing beyond the C++ standard library and MPI. Define HERD_NO_MPI before including it
// to leave MPI out (local_communicator still works).

#include <herd/core/config.hpp>
#include <herd/core/device.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/half.hpp>
#include <herd/core/reduce_op.hpp>

#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/dlpack.hpp>
#include <herd/tensor/host_tensor.hpp>
#include <herd/tensor/std.hpp>
#include <herd/tensor/traits.hpp>

#include <herd/comm/communicator.hpp>
#include <herd/comm/local.hpp>
#include <herd/comm/nccl.hpp>
#if !defined(HERD_NO_MPI)
#include <herd/comm/mpi.hpp>
#endif

#include <herd/checkpoint/checkpoint.hpp>

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/alltoall.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/gather.hpp>
#include <herd/collectives/object.hpp>
#include <herd/collectives/reduce.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/collectives/scatter.hpp>
#include <herd/collectives/separate_compilation.hpp>

#include <herd/data/distributed_sampler.hpp>

#include <herd/nn/sync_batch_norm.hpp>

#include <herd/optim/adamw.hpp>
#include <herd/optim/broadcast.hpp>
#include <herd/optim/clip.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/distributed_optimizer.hpp>
#include <herd/optim/loss_scaler.hpp>
#include <herd/optim/lr_schedule.hpp>
#include <herd/optim/metrics.hpp>
#include <herd/optim/mixed_precision.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/optim/parameters.hpp>
#include <herd/optim/sgd.hpp>
#include <herd/optim/zero.hpp>

#include <herd/runtime/elastic.hpp>
#include <herd/runtime/env.hpp>
#include <herd/runtime/timeline.hpp>

#endif  // HERD_HERD_HPP
