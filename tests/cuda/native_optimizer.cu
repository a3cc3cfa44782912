// Compiled by nvcc: the distributed optimizer, broadcast_object and metrics on a communicator
// with native collectives (nccl_communicator's shape). Their host-side checks and values travel
// over its control channel; the GPU gradients go to its native allreduce. No GPU is touched:
// with fusion off, each gradient is reduced in place by the (recording) native collective. (avg
// would add herd's division kernel after NCCL's sum here, under nvcc, and that needs a GPU: the
// optimizer sums.)
#include <herd/herd.hpp>

#include "../support/native_stand_in.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_CASE("distributed optimizer, broadcast_object and metrics work over a native communicator's control channel") {
  herd::local::run(2, [](herd::local_communicator& host) {
    herd_test::native_stand_in comm(host);
    float g1[8], g2[3];
    const std::vector<herd::buffer_view> grads = {{g1, 8, herd::dtype::f32, herd::device::cuda(0)},
                                                  {g2, 3, herd::dtype::f32, herd::device::cuda(0)}};
    struct counting {
      int steps = 0;
      void step() { ++steps; }
    } inner;
    herd::distributed_optimizer opt(inner, grads, comm, {.op = herd::reduce_op::sum, .fusion_threshold_bytes = 0});
    CHECK(opt.step());
    CHECK(inner.steps == 1);
    const std::vector<std::string> want = {"allreduce sum", "synchronize", "allreduce sum", "synchronize"};
    CHECK(comm.calls == want);

    int epoch = host.rank() == 1 ? 7 : 0;
    herd::broadcast_object(epoch, comm, 1);
    CHECK(epoch == 7);
    herd::metric m;
    m.add(host.rank());
    CHECK(m.global_mean(comm) == doctest::Approx(0.5));
  });
}
