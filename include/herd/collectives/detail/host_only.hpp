#ifndef HERD_COLLECTIVES_DETAIL_HOST_ONLY_HPP
#define HERD_COLLECTIVES_DETAIL_HOST_ONLY_HPP
// What the collectives that move host memory only (gather, scatter, alltoall(v), reduce) check
// alike: they refuse a communicator with native collectives (nccl_communicator) at compile time,
// and a device tensor, or a list of per-rank counts of the wrong length, with herd::error on every
// rank, through the agreement.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/dispatch.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <span>
#include <string>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <class C> constexpr void require_host_communicator() {
  static_assert(!native_collectives<C>,
                "herd: gather, scatter, reduce and alltoall(v) do not run on a communicator with native collectives "
                "(nccl_communicator) yet. Copy the tensors to the host and call them on an mpi_communicator (an "
                "nccl_communicator's control() is one).");
}

// `operation` names the collective in the advice ("gather").
HERD_SEPARATE void require_host_tensor(call_check& check, const char* role, const const_buffer_view& v,
                                       const char* operation);

// `what` names the list ("per-rank counts", "send splits").
HERD_SEPARATE void require_one_per_rank(call_check& check, const char* what, std::span<const std::size_t> counts,
                                        int p);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void require_host_tensor(call_check& check, const char* role, const const_buffer_view& v,
                                       const char* operation) {
  if (!check.ok() || v.device.is_cpu()) return;
  check.fail(5, std::string("the ") + role + " tensor lives on " + v.device.str() + ", but herd::" + operation +
                    " moves host memory only",
             "Copy the tensor to the host first");
}

HERD_SEPARATE void require_one_per_rank(call_check& check, const char* what, std::span<const std::size_t> counts,
                                        int p) {
  if (!check.ok() || counts.size() == static_cast<std::size_t>(p)) return;
  check.fail(19, std::string("the list of ") + what + " has " + std::to_string(counts.size()) + " entries for " +
                     std::to_string(p) + " ranks",
             "Pass one entry per rank");
}

#endif  // HERD_SEPARATE_DEFINITIONS

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_HOST_ONLY_HPP
