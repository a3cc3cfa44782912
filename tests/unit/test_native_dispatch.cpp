// How collectives treat a communicator with native collectives (nccl_communicator's shape),
// checked without a GPU through a stand-in: tensors it cannot reach get herd::error on every rank
// with the right advice, and reachable ones go to its native calls after the cross-rank check.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include "../support/checks.hpp"
#include "../support/native_stand_in.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using herd_test::native_stand_in;

using herd_test::has;

namespace {

static_assert(herd::communicator<native_stand_in>);
static_assert(herd::detail::native_collectives<native_stand_in>);

std::vector<std::string> errors(auto body) {
  std::vector<std::string> messages(2);
  herd::local::run(2, [&](herd::local_communicator& host) {
    native_stand_in comm(host);
    try {
      body(comm);
    } catch (const herd::error& e) {
      messages[static_cast<std::size_t>(host.rank())] = e.what();
    }
  });
  return messages;
}

}  // namespace

TEST_CASE("a host tensor handed to a communicator of GPU memory fails on every rank") {
  for (const auto& m : errors([](native_stand_in& comm) {
         std::vector<float> v(8);
         herd::allreduce(v, comm);
       })) {
    INFO(m);
    CHECK(has(m, "lives on cpu, which this communicator cannot reach"));
    CHECK(has(m, "mpi_communicator for host tensors"));
  }
}

TEST_CASE("a tensor on another GPU than the communicator's fails on every rank") {
  const auto messages = errors([](native_stand_in& comm) {
    float dummy[4];
    herd::buffer_view v{dummy, 4, herd::dtype::f32, herd::device::cuda(comm.rank() == 1 ? 1 : 0)};
    herd::broadcast(v, comm, 0);
  });
  CHECK(has(messages[1], "lives on cuda:1, which this communicator cannot reach"));
  CHECK(has(messages[1], "Move the tensor to this communicator's GPU"));
  CHECK(has(messages[0], "rank 1 passed a tensor on a device the communicator cannot reach"));
}

TEST_CASE("reductions NCCL lacks are refused before anything runs") {
  for (const auto& m : errors([](native_stand_in& comm) {
         std::int32_t dummy[4];
         herd::buffer_view v{dummy, 4, herd::dtype::i32, herd::device::cuda(0)};
         herd::allreduce(v, comm, herd::reduce_op::band);
       })) {
    CHECK(has(m, "NCCL has no bitwise reductions"));
  }
#if !HERD_WITH_CUDA_KERNELS
  for (const auto& m : errors([](native_stand_in& comm) {
         std::int32_t dummy[4];
         herd::buffer_view v{dummy, 4, herd::dtype::i32, herd::device::cuda(0)};
         herd::allreduce(v, comm, herd::reduce_op::avg);
       })) {
    CHECK(has(m, "avg on integer tensors over NCCL needs herd's division kernel"));
  }
#endif
}

TEST_CASE("reachable tensors go to the native collectives after the cross-rank check") {
  herd::local::run(2, [](herd::local_communicator& host) {
    native_stand_in comm(host);
    float a[6];
    float b[12];
    herd::buffer_view v{a, 6, herd::dtype::f32, herd::device::cuda(0)};
    herd::buffer_view all{b, 12, herd::dtype::f32, herd::device::cuda(0)};
    herd::allreduce(v, comm, herd::reduce_op::avg);
    herd::broadcast(v, comm, 1);
    herd::allgather(herd::const_buffer_view(v), all, comm);
    const std::vector<std::string> want = {"allreduce avg", "synchronize", "broadcast 1", "synchronize", "allgather",
                                           "synchronize"};
    CHECK(comm.calls == want);
  });
}
