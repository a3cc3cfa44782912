#ifndef HERD_TORCH_GRADIENTS_HPP
#define HERD_TORCH_GRADIENTS_HPP
// The gradients of a libtorch optimizer's parameters as herd reduces them: hand them to
// herd::distributed_optimizer. Opt-in: include it after <torch/torch.h>.
//
//   torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
//   herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm);
//   for (auto& batch : loader) { sgd.zero_grad(); loss(batch).backward(); opt.step(); }

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/torch/detail/device_arithmetic.hpp>
#include <herd/torch/detail/missing_gradient.hpp>
#include <herd/torch/tensor_traits.hpp>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <vector>

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// What torch_gradients returns: called, the gradient of every parameter of the optimizer, read
// afresh (libtorch may replace a gradient tensor between steps: zero_grad with set_to_none). A
// parameter without one (unused in this rank's passes) gets zeros, so that every rank reduces the
// same list; once the gradients are reduced (after_reduction, which distributed_optimizer calls),
// those no rank produced are undefined again, as they are in PyTorch, whose optimizers then leave
// the parameter alone: neither momentum nor weight decay moves it. Copies share what they record.
class torch_gradient_source {
 public:
  explicit torch_gradient_source(::torch::optim::Optimizer& opt) : record_(std::make_shared<record>()) {
    record_->opt = &opt;
  }

  std::vector<buffer_view> operator()() const {
    std::vector<buffer_view> views;
    std::size_t i = 0;
    for (auto& group : record_->opt->param_groups()) {
      for (auto& p : group.params()) {
        if (record_->filled.size() <= i) record_->filled.resize(i + 1);
        if (detail::fill_missing_gradient(p)) record_->filled[i] = {p.grad().unsafeGetTensorImpl(), p.grad()._version()};
        require_row_major(p.grad(), i);
        views.push_back(view_of(p.mutable_grad()));
        ++i;
      }
    }
    return views;
  }

  // Every rank, after each reduction: one allreduce of a flag per parameter finds those that no
  // rank produced a gradient for in the passes since the last reduction, whose gradients go back
  // to undefined. The flags are host memory: over an nccl_communicator they travel on its control().
  template <communicator C> void after_reduction(C& comm) const {
    if constexpr (requires { comm.control(); }) {
      after_reduction(comm.control());
    } else {
      std::vector<std::int32_t> produced;
      std::vector<at::Tensor*> params;
      for (auto& group : record_->opt->param_groups()) {
        for (auto& p : group.params()) {
          params.push_back(&p);
          produced.push_back(zeros_of_ours(p, produced.size()) ? 0 : 1);
        }
      }
      herd::allreduce(produced, comm, reduce_op::max);
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (produced[i] == 0) params[i]->mutable_grad() = at::Tensor();
      }
      record_->filled.assign(params.size(), {});
    }
  }

 private:
  struct fill {
    const void* tensor = nullptr;  // the zeros given to the parameter (its TensorImpl)
    std::int64_t version = 0;      // their version then: a later pass that adds into them changes it
  };
  struct record {
    ::torch::optim::Optimizer* opt = nullptr;
    std::vector<fill> filled;  // per parameter, since the last reduction
  };

  // distributed_optimizer reads each gradient as one row-major block; the ranks' layouts are not
  // compared here, so another layout (a channels_last weight's gradient) is refused, saying where
  // it is taken.
  static void require_row_major(const at::Tensor& grad, std::size_t i) {
    if (!grad.defined() || grad.layout() != at::kStrided || grad.is_contiguous()) return;  // the adapter says the rest
    std::ostringstream text;
    text << "herd::torch_gradients: the gradient of the optimizer's parameter " << i << " is not row-major (sizes "
         << grad.sizes() << ", strides " << grad.strides()
         << ": a channels_last or transposed parameter's). distributed_optimizer reads each gradient as one row-major "
            "block. Wrap the module in herd::torch::DistributedDataParallel, which takes parameters in any layout, or "
            "make the parameter row-major before training (p.set_data(p.contiguous())).";
    throw error(text.str());
  }

  // Whether parameter i's gradient is still the zeros this source gave it, untouched by backward.
  bool zeros_of_ours(const at::Tensor& p, std::size_t i) const {
    if (i >= record_->filled.size() || record_->filled[i].tensor == nullptr || !p.grad().defined()) return false;
    return p.grad().unsafeGetTensorImpl() == record_->filled[i].tensor && p.grad()._version() == record_->filled[i].version;
  }

  std::shared_ptr<record> record_;
};

// The gradients of every parameter of `opt`, for herd::distributed_optimizer (see
// torch_gradient_source). CUDA gradients are packed by herd's kernels under nvcc, by libtorch's in
// a host-compiled file (link herd::nccl and reduce over a nccl_communicator): no copy through host
// memory.
inline torch_gradient_source torch_gradients(::torch::optim::Optimizer& opt) {
  detail::lend_torch_device_arithmetic();
  return torch_gradient_source(opt);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_TORCH_GRADIENTS_HPP
