#ifndef HERD_COLLECTIVES_DETAIL_LAUNCH_HPP
#define HERD_COLLECTIVES_DETAIL_LAUNCH_HPP
// How a collective's body runs as an operation of its communicator (comm/detail/operation.hpp):
// now, on the caller's thread, for the blocking forms; queued, for the _async forms, on the
// communicator's progress thread (or inside handle::wait/test without one). On a communicator
// with native collectives (NCCL) an _async operation is stream-ordered instead: it is agreed and
// enqueued now, and its handle completes with the device.
//
// A body takes one argument, `host_sync`: whether it must wait on the host for a native
// communicator's stream before it returns.

#include <herd/collectives/detail/dispatch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/core/detail/function_ref.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <utility>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// The label of a collective on tensor `v` (its size and dtype appear in messages).
inline op_label tensor_label(op_kind kind, const const_buffer_view& v) {
  op_label label{kind};
  if (is_valid(v.type) && v.count <= (std::size_t{1} << 56)) {
    label.count = v.count;
    label.type = v.type;
    label.typed = true;
  }
  return label;
}

// A collective's body, referred to without its type: run_collective is then one function per
// communicator type instead of one per call site, and can be compiled once (separate_compilation.hpp).
using body_ref = function_ref<void(bool)>;

template <communicator C> void run_collective(C& comm, const op_label& label, body_ref body) {
  run_operation(comm, label, [&] { body(true); });
}

template <communicator C, class Body> handle start_collective(C& comm, const op_label& label, Body body) {
  if constexpr (native_collectives<C>) {
    run_operation(comm, label, [&] { body(false); });
    if constexpr (requires { comm.completion(); }) {
      return handle(comm.completion());
    } else {
      comm.synchronize();
      return handle();
    }
  } else {
#if HERD_WITH_CUDA_KERNELS
    // It may run on the progress thread: it follows the stream its caller follows now.
    auto follow_caller = [body = std::move(body), caller = cuda::current_stream()]() mutable {
      const cuda::use_stream on(caller);
      body(true);
    };
    return handle(&comm.operations(), submit_operation(comm, label, std::move(follow_caller)));
#else
    return handle(&comm.operations(),
                  submit_operation(comm, label, [body = std::move(body)]() mutable { body(true); }));
#endif
  }
}

// The data tag of the running operation: its messages can never be matched by another operation's.
template <communicator C> int data_tag_of(C& comm) { return comm.operations().data_tag(); }

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_LAUNCH_HPP
