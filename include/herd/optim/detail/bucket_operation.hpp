#ifndef HERD_OPTIM_DETAIL_BUCKET_OPERATION_HPP
#define HERD_OPTIM_DETAIL_BUCKET_OPERATION_HPP
// One bucket's reduction in a pass of readiness marks (detail/reducer.hpp): how many of its
// gradients are still to come, the problem this rank found with them, and its operation once
// started, on the communicator's progress thread (or, the pass's last, on the caller's), timed
// where it runs for overlap_stats.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/bucket_plan.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// Whether the bucket's gradients were all marked and follow each other in memory in its order
// (a single gradient always does): then the bucket is reduced where they are.
inline bool lives_in_place(const bucket_plan::bucket& plan, const std::vector<char>& marked,
                           const std::vector<buffer_view>& views) {
  const auto* base = static_cast<const std::byte*>(views[plan.members.front()].data);
  for (std::size_t k = 0; k < plan.members.size(); ++k) {
    const std::size_t i = plan.members[k];
    if (!marked[i] || views[i].data != base + plan.offsets[k] * size_of(plan.type)) return false;
  }
  return true;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct bucket_operation {
  buffer_view buffer;             // what its allreduce reduces: the packed bucket, or its gradients in place
  std::size_t waiting = 0;        // gradients not yet ready in this pass
  std::string fault;              // this rank's problem with one of its gradients in this pass
  std::uint32_t fault_code = 14;  // its code for the other ranks (comm/detail/agreement.hpp)
  bool in_place = false;          // buffer is the gradients themselves: nothing to unpack
  std::optional<handle> done;     // its operation, once started
  std::shared_ptr<std::atomic<double>> seconds = std::make_shared<std::atomic<double>>(0.0);

  // A fresh pass, waiting for `members` gradients.
  void reset(std::size_t members) {
    waiting = members;
    fault.clear();
    fault_code = 14;
    in_place = false;
    done.reset();
    seconds->store(0.0);
  }

  // Starts the allreduce of `v`; with a failed `check`, the operation that carries the problem to
  // every rank instead (so that the buckets after it still pair up). `now`: runs it on this thread
  // before returning instead, and `done` stays empty (see begin()).
  template <communicator C> void start(C& comm, call_check check, buffer_view v, reduce_op op, bool now = false) {
    auto call = prepare_allreduce(std::move(check), v, v, comm, op);
    const auto label = call.label();
    begin(comm, label, [&comm, call = std::move(call), spent = seconds](bool sync) {
      const auto start = std::chrono::steady_clock::now();
      run_allreduce(comm, call, sync);
      spent->store(seconds_since(start));
    }, now);
  }

  // Starts the reduction of `parts` through shared memory, straight from and into them.
  template <communicator C>
  void start_in_shared_memory(C& comm, std::vector<buffer_view> parts, reduce_op op, bool now = false) {
    in_place = true;
    buffer = {};
    auto [label, body] = allreduce_in_shared_memory_body(comm, std::move(parts), op);
    begin(comm, label, [body = std::move(body), spent = seconds](bool sync) {
      const auto start = std::chrono::steady_clock::now();
      body(sync);
      spent->store(seconds_since(start));
    }, now);
  }

  // When every rank shares a node and all of the bucket's gradients were marked, its allreduce
  // goes through shared memory straight from and into them (as gradient_as_bucket_view, without
  // asking for a layout): no packing, nothing to unpack. False (nothing started) where that does
  // not apply.
  template <communicator C>
  bool start_from_gradients(C& comm, const bucket_plan::bucket& plan, const std::vector<char>& marked,
                            const std::vector<buffer_view>& views, reduce_op op, bool now = false) {
    std::vector<buffer_view> parts;
    parts.reserve(plan.members.size());
    for (std::size_t i : plan.members) {
      if (!marked[i]) return false;
      parts.push_back(views[i]);
    }
    if (!reduces_in_shared_memory(comm, parts)) return false;
    start_in_shared_memory(comm, std::move(parts), op, now);
    return true;
  }

 private:
  // The operation, queued for the progress thread, or (`now`) run as a blocking collective: the
  // reducer runs a pass's last bucket so, because it waits for it at once. Handing it to the
  // thread would buy no overlap and cost two hand-overs, most where the ranks' threads share the
  // cores (benchmarks/RESULTS.md, "The pass's last bucket on the caller's thread").
  template <communicator C, class Body> void begin(C& comm, const op_label& label, Body body, bool now) {
    if (now) {
      run_collective(comm, label, body);
    } else {
      done.emplace(start_collective(comm, label, std::move(body)));
    }
  }
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_BUCKET_OPERATION_HPP
