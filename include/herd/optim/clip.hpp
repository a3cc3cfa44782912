#ifndef HERD_OPTIM_CLIP_HPP
#define HERD_OPTIM_CLIP_HPP
// herd::clip_grad_norm: gradient clipping by the global 2-norm, as torch.nn.utils.clip_grad_norm_:
//
//   total = sqrt(sum of every gradient element squared)
//   every gradient *= min(1, max_norm / (total + 1e-6))
//
// and the total is returned. Call it on gradients every rank holds whole and equal (after the
// distributed optimizer's synchronize(), or mixed_precision's unscale()): each rank then computes
// the same norm with no communication. Where each rank holds a different part (zero_optimizer's
// shards), pass the communicator: the squared norms of the parts are summed across the ranks
// with one scalar allreduce (as DeepSpeed does), so every rank clips by the norm of the whole.
// The squares are summed in double; a norm that is inf or NaN (an overflow) is returned as it is
// and the gradients scale by NaN or 0, as torch's do, for the step to be skipped.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {
namespace detail {

// The sum of the squares of every element (of gradients checked already).
HERD_SEPARATE double squared_norm(const std::vector<buffer_view>& grads);

// Scales by torch's clip coefficient, rounded to f32 as torch's is (it is an f32 tensor there);
// f64 gradients get it in double.
HERD_SEPARATE double clip_by(const std::vector<buffer_view>& grads, double max_norm, double total);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE double squared_norm(const std::vector<buffer_view>& grads) {
  double sum = 0;
  for (const buffer_view& g : grads) {
    visit(g.type, [&](auto element) {
      using T = decltype(element);
      const auto* p = static_cast<const T*>(g.data);
      for (std::size_t i = 0; i < g.count; ++i) sum += to_double(p[i]) * to_double(p[i]);
    });
  }
  return sum;
}

HERD_SEPARATE double clip_by(const std::vector<buffer_view>& grads, double max_norm, double total) {
  const double coefficient = std::min(max_norm / (total + 1e-6), 1.0);
  for (const buffer_view& g : grads) {
    visit(g.type, [&](auto element) {
      using T = decltype(element);
      if constexpr (!std::is_integral_v<T>) {
        auto* p = static_cast<T*>(g.data);
        if constexpr (std::is_same_v<T, double>) {
          for (std::size_t i = 0; i < g.count; ++i) p[i] *= coefficient;
        } else {
          const auto c = static_cast<float>(coefficient);
          for (std::size_t i = 0; i < g.count; ++i) p[i] = static_cast<T>(static_cast<float>(p[i]) * c);
        }
      }
    });
  }
  return total;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail

// Clips gradients every rank holds whole; returns their total norm.
inline double clip_grad_norm(const std::vector<buffer_view>& grads, double max_norm) {
  detail::require_host_tensors(grads, "clip_grad_norm", "gradient");
  return detail::clip_by(grads, max_norm, std::sqrt(detail::squared_norm(grads)));
}

namespace detail {
HERD_CONFIG_NAMESPACE_BEGIN
// The squared norm of gradients that the ranks of `comm` hold in parts: each rank's, summed with
// one scalar allreduce, the same on every rank (inf or NaN on every rank if any part overflowed).
// clip_grad_norm's and zero_optimizer's, whose shards are such parts.
// A rank whose gradients it cannot read (a null pointer, device memory) says so in the allreduce's
// agreement, so that every rank raises it, naming that rank, instead of waiting for it there.
template <communicator C> double global_squared_norm(const std::vector<buffer_view>& grads, C& comm) {
  call_check check(op_kind::allreduce, comm.rank(), comm.size());
  double squares = 0;
  if (host_tensors_fault fault = find_host_tensors_fault(grads, "gradient"); !fault.what.empty()) {
    check.fail(fault.code, "clip_grad_norm: " + fault.what, fault.todo);
  } else {
    squares = squared_norm(grads);
  }
  allreduce_checked(std::move(check), buffer_view{&squares, 1, dtype::f64, device::cpu()}, comm, reduce_op::sum);
  return squares;
}
HERD_CONFIG_NAMESPACE_END
}  // namespace detail

HERD_CONFIG_NAMESPACE_BEGIN
// Clips gradients that the ranks of `comm` hold in parts (each rank its own); returns the norm of
// the whole, the same on every rank. A collective: every rank calls it.
template <communicator C> double clip_grad_norm(const std::vector<buffer_view>& grads, double max_norm, C& comm) {
  return detail::clip_by(grads, max_norm, std::sqrt(detail::global_squared_norm(grads, comm)));
}
HERD_CONFIG_NAMESPACE_END

}  // namespace herd

#endif  // HERD_OPTIM_CLIP_HPP
