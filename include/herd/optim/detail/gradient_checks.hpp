#ifndef HERD_OPTIM_DETAIL_GRADIENT_CHECKS_HPP
#define HERD_OPTIM_DETAIL_GRADIENT_CHECKS_HPP
// The first-step agreement of a gradient reduction: the first check compares every rank's
// gradients (count, sizes, dtypes) and options, and raises herd::error on every rank if they
// differ; it records the gradients' shapes and device. Later checks look at this rank's gradients
// alone and return what is wrong, for the next reduction to raise on every rank (a problem found
// in a pass that only accumulates waits here, pending, for the round's reduction).

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/detail/same_tensors.hpp>
#include <herd/optim/optimizer_options.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// The options a reduction refuses (on this rank, before any collective).
HERD_SEPARATE void validate(const optimizer_options& options, const error_site& site);

template <communicator C> class gradient_checks {
 public:
  gradient_checks(C& comm, const optimizer_options& options) : comm_(comm), options_(options) {}

  // The first call checks the gradients on every rank together (and raises on every rank); later
  // calls check this rank's own and return what is wrong ("" when nothing is). `read_fault`: what
  // went wrong reading them on this rank (grads then empty), a fault like any other.
  std::string check(const std::vector<buffer_view>& grads, const std::string& read_fault = {});

  // check(), then the problem a pass that only accumulated found, if check() found none.
  std::string check_with_pending(const std::vector<buffer_view>& grads, const std::string& read_fault = {}) {
    std::string fault = check(grads, read_fault);
    if (fault.empty()) fault = std::exchange(pending_, {});
    return fault;
  }
  // A pass that only accumulates found `fault` (or an earlier one did): the round's reduction
  // raises the first. Returns whether there is one.
  bool defer(const std::string& fault) {
    if (pending_.empty()) pending_ = fault;
    return !pending_.empty();
  }
  // The deferred problem, taken (for a pass of marks to raise on every rank).
  std::string take_pending() { return std::exchange(pending_, {}); }

  // What is wrong with gradient i's view in a pass of marks ("" when nothing is).
  std::string marked_fault(std::size_t i, const buffer_view& v) const {
    if (v.count != shapes_[i].first || v.type != shapes_[i].second) {
      return "gradient " + std::to_string(i) + " changed since the first step (" + std::to_string(v.count) + " " +
             std::string(name(v.type)) + " instead of " + std::to_string(shapes_[i].first) + " " +
             std::string(name(shapes_[i].second)) + ")";
    }
    if (v.data == nullptr && v.count != 0) return "gradient " + std::to_string(i) + " has a null data pointer";
    if (v.device != device_) {
      return "gradient " + std::to_string(i) + " lives on " + v.device.str() + " but the first one on " + device_.str() +
             " (keep all gradients of one distributed optimizer on one device)";
    }
    return {};
  }

  bool checked() const noexcept { return checked_; }
  // As the first check found them: (elements, dtype) of each gradient, and their device.
  const std::vector<std::pair<std::size_t, dtype>>& shapes() const noexcept { return shapes_; }
  device where() const noexcept { return device_; }

  // Raises `fault` on every rank: it travels in the agreement of the reduction the other ranks
  // start now (with argument checks off, it aborts the communicator, which tells them). Where the
  // first step found no gradients the others start none, and this rank raises it alone.
  [[noreturn]] void raise_everywhere(const std::string& fault) {
    if (comm_.size() == 1 || (checked_ && shapes_.empty())) raise_alone(fault);
    call_check failed(op_kind::allreduce, comm_.rank(), comm_.size());
    failed.fail(14, fault, "Hand the distributed optimizer the same gradient tensors, on one device, at every step");
    allreduce_checked(std::move(failed), buffer_view{}, comm_, reduce_op::sum);
    raise_alone(fault);  // not reached: the agreement raised
  }

  [[noreturn]] void raise_alone(const std::string& fault) const {
    raise({"distributed_optimizer", comm_.rank(), comm_.size()}, fault,
          "Hand the distributed optimizer the same gradient tensors, on one device, at every step");
  }

 private:
  void require_same_options();

  // What is wrong with this rank's gradients on their own ("" when nothing is): every one in host
  // memory, or every one on the same GPU.
  static std::string local_fault(const std::vector<buffer_view>& grads) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const auto& g = grads[i];
      if (!is_valid(g.type)) return "gradient " + std::to_string(i) + " has an invalid dtype (check its tensor_traits::dtype)";
      if (g.data == nullptr && g.count != 0) {
        return "gradient " + std::to_string(i) + " has a null data pointer and " + std::to_string(g.count) + " elements";
      }
      if (g.device != grads[0].device) {
        return "gradient " + std::to_string(i) + " lives on " + g.device.str() + " but gradient 0 on " +
               grads[0].device.str() + " (keep all gradients of one distributed optimizer on one device)";
      }
    }
#if !HERD_WITH_CUDA_KERNELS && !defined(HERD_WITH_NCCL)
    if (!grads.empty() && grads[0].device.is_cuda()) {
      return "the gradients live on " + grads[0].device.str() +
             " but this file was compiled without CUDA (compile it with nvcc, or link herd::nccl and use a "
             "nccl_communicator)";
    }
#endif
    return {};
  }

  C& comm_;
  optimizer_options options_;
  bool checked_ = false;
  std::string pending_;
  std::vector<std::pair<std::size_t, dtype>> shapes_;
  device device_ = device::cpu();
};

// Defined out of the class, so not inline: with HERD_SEPARATE_COMPILATION a file compiles neither
// for mpi_communicator (an extern template there, collectives/separate_compilation.hpp).

template <communicator C>
std::string gradient_checks<C>::check(const std::vector<buffer_view>& grads, const std::string& read_fault) {
  std::string fault = read_fault.empty() ? local_fault(grads) : read_fault;
  if (!checked_) {
    require_same_tensors(grads, comm_, "distributed_optimizer", "gradient", fault);
    require_same_options();
    shapes_.clear();
    for (const auto& g : grads) shapes_.emplace_back(g.count, g.type);
    device_ = grads.empty() ? device::cpu() : grads[0].device;
    checked_ = true;
    return {};
  }
  bool same = grads.size() == shapes_.size();
  for (std::size_t i = 0; same && i < grads.size(); ++i) same = shapes_[i] == std::make_pair(grads[i].count, grads[i].type);
  if (fault.empty() && !same) fault = "the gradients changed since the first step (their number, sizes or dtypes)";
  return fault;
}

template <communicator C> void gradient_checks<C>::require_same_options() {
  const std::vector<std::int64_t> mine = {
      static_cast<std::int64_t>(options_.op), static_cast<std::int64_t>(options_.compression),
      static_cast<std::int64_t>(options_.fusion_threshold_bytes), options_.backward_passes_per_step,
      std::bit_cast<std::int64_t>(options_.gradient_predivide_factor), static_cast<std::int64_t>(options_.bucket_bytes),
      static_cast<std::int64_t>(options_.first_bucket_bytes), options_.find_unused_parameters ? 1 : 0,
      options_.gradient_as_bucket_view ? 1 : 0, options_.uneven_inputs ? 1 : 0, options_.divide_by_active_ranks ? 1 : 0,
      static_cast<std::int64_t>(options_.accumulate), options_.static_graph ? 1 : 0};
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm_.size()));
  herd::allgather(mine, all, control_of(comm_));
  static const char* const names[] = {"op",
                                      "compression",
                                      "fusion_threshold_bytes",
                                      "backward_passes_per_step",
                                      "gradient_predivide_factor",
                                      "bucket_bytes",
                                      "first_bucket_bytes",
                                      "find_unused_parameters",
                                      "gradient_as_bucket_view",
                                      "uneven_inputs",
                                      "divide_by_active_ranks",
                                      "accumulate",
                                      "static_graph"};
  for (std::size_t r = 1; r < static_cast<std::size_t>(comm_.size()); ++r) {
    for (std::size_t k = 0; k < mine.size(); ++k) {
      if (all[r * mine.size() + k] != all[k]) {
        raise_agreed({"distributed_optimizer", comm_.rank(), comm_.size()},
                     std::string("option ") + names[k] + " differs between rank 0 and rank " + std::to_string(r),
                     "Give every rank the same optimizer_options (and the same HERD_FUSION_THRESHOLD and HERD_BUCKET_BYTES)");
      }
    }
  }
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void validate(const optimizer_options& options, const error_site& site) {
  if (options.op != reduce_op::avg && options.op != reduce_op::sum)
    raise(site, "op " + std::string(name(options.op)) + " cannot combine gradients",
          "Use reduce_op::avg or reduce_op::sum");
  if (!(options.gradient_predivide_factor > 0))
    raise(site, "gradient_predivide_factor must be positive", "Pass 1.0 to turn predivision off");
  if (options.gradient_predivide_factor != 1.0 && options.op != reduce_op::avg)
    raise(site, "gradient_predivide_factor applies to op avg only", "Use reduce_op::avg, or a factor of 1.0");
  if (options.backward_passes_per_step < 1)
    raise(site, "backward_passes_per_step must be at least 1", "Pass 1 to reduce after every backward pass");
  if (options.bucket_bytes == 0 || options.first_bucket_bytes == 0)
    raise(site, "bucket_bytes and first_bucket_bytes must be positive", "Keep the defaults (25 MiB, 1 MiB)");
}

#endif  // HERD_SEPARATE_DEFINITIONS

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_GRADIENT_CHECKS_HPP
