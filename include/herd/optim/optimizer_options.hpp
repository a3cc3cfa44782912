#ifndef HERD_OPTIM_OPTIMIZER_OPTIONS_HPP
#define HERD_OPTIM_OPTIMIZER_OPTIONS_HPP
// The options of herd::distributed_optimizer and herd::torch::DistributedDataParallel, the bucket
// layout they reduce in (for gradients that live inside their buckets), and where the time of the
// overlapped reductions went. optim/distributed_optimizer.hpp describes what each option does.

#include <herd/core/device.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/detail/bucket_plan.hpp>
#include <herd/runtime/env.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace herd {

// How the backward passes of a round (backward_passes_per_step, no_sync) add up before its
// reduction.
enum class accumulation : std::uint8_t {
  // PyTorch's way: each backward pass adds its gradients into the gradient tensors (as autograd
  // does into .grad), which the caller zeroes once per optimizer step; the passes held back leave
  // them alone, and the round's last step() reduces them as they are.
  in_gradients,
  // Each backward pass overwrites the gradients (tensor libraries without autograd): herd keeps
  // the running sum of the passes held back (in f32 for 16-bit gradients) and adds it to the last
  // pass's gradients before the reduction.
  by_copy,
};

struct optimizer_options {
  reduce_op op = reduce_op::avg;  // avg or sum over ranks
  double gradient_predivide_factor = 1.0;
  int backward_passes_per_step = 1;
  herd::accumulation accumulate = herd::accumulation::in_gradients;
  std::size_t fusion_threshold_bytes = runtime::defaults().fusion_threshold_bytes;
  herd::compression compression = herd::compression::none;
  // Buckets, with mark_ready (DDP's bucket_cap_mb and first bucket).
  std::size_t bucket_bytes = runtime::defaults().bucket_bytes;
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // Gradients not marked ready in a pass are reduced as zeros instead of being an error.
  bool find_unused_parameters = false;
  // The gradients were laid out by bucket_layout(): keep the buckets as they are (no rebuild in
  // the ready order), so that each bucket's gradients stay back to back and reduce in place.
  bool gradient_as_bucket_view = false;
  // herd::torch::DistributedDataParallel only (DDP's broadcast_buffers): rank 0's buffers (BatchNorm's
  // running statistics) are broadcast at each forward, as DDP does, so that every rank keeps the same.
  bool broadcast_buffers = true;
  // herd::torch::DistributedDataParallel only (DDP's static_graph): the graph is the same at every
  // iteration, so the parameters no rank used in the first synchronized pass are those of every
  // pass (no allreduce of used flags after it), with or without find_unused_parameters.
  bool static_graph = false;
  // Ranks may run out of batches at different steps (DDP's Join, Horovod's join()): a rank with
  // none left calls join(), and every reducing step (in step(), or at a pass's first mark_ready)
  // first agrees on which ranks are still training (one byte per rank). avg divides by the world
  // size, the joined ranks adding zeros (DDP's default), or, with divide_by_active_ranks, by the
  // ranks still training.
  bool uneven_inputs = false;
  bool divide_by_active_ranks = false;
};

// Bucket b of the distributed optimizer's buckets, in launch order: `count` elements of `type`,
// gradient members[k] at element offsets[k].
using gradient_bucket = detail::bucket_plan::bucket;

// Where to put the gradients so that they live inside their buckets (gradient_as_bucket_view):
// `shapes[i]` = (elements, dtype) of gradient i, in the order the optimizer is given them. Allocate
// one buffer of `count` elements per bucket and make gradient members[k] the view at offsets[k].
// `where`: the gradients' device (on a GPU, members start 16 bytes aligned).
inline std::vector<gradient_bucket> bucket_layout(const std::vector<std::pair<std::size_t, dtype>>& shapes,
                                                  const optimizer_options& options = {}, device where = device::cpu()) {
  return detail::bucket_plan::make(shapes, detail::bucket_plan::reverse_order(shapes.size()),
                                   options.first_bucket_bytes, options.bucket_bytes,
                                   detail::member_alignment(where))
      .buckets;
}

// Where the time of the overlapped reductions went, summed over steps (seconds): `communication`,
// each bucket's operation from its start to its end on the communicator (on its progress thread,
// while the caller goes on with its backward pass; a host communicator's last bucket of a pass on
// the caller's thread, in step()); `exposed`, the caller's own time in them: packing at
// mark_ready, and in step() starting what was left, waiting, unpacking; `waiting`, the part of
// `exposed` spent waiting for buckets to finish, and packing and reducing the last one.
// communication - waiting is what the backward pass hid (less the last bucket's packing, so it
// can be below zero where everything fits one bucket). `packed_bytes`: gradient bytes copied into
// buckets (and back out after the reduction); none for buckets whose gradients live in them.
struct overlap_stats {
  double communication = 0;
  double exposed = 0;
  double waiting = 0;
  std::size_t steps = 0;
  std::size_t packed_bytes = 0;
};

}  // namespace herd

#endif  // HERD_OPTIM_OPTIMIZER_OPTIONS_HPP
