// Compiled by nvcc, where GPU tensors are reachable over a host communicator: ranks that pass a
// host tensor and a GPU tensor to one collective would take different algorithms, so the
// cross-rank check stops them first, on every rank (no GPU memory is touched).
#include <herd/herd.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_CASE("host tensors on one rank and GPU tensors on another fail on every rank") {
  std::vector<std::string> messages(2);
  herd::local::run(2, [&](herd::local_communicator& comm) {
    std::vector<float> host(4096);
    herd::buffer_view v{host.data(), host.size(), herd::dtype::f32,
                        comm.rank() == 0 ? herd::device::cpu() : herd::device::cuda(0)};
    try {
      herd::allreduce(v, comm);
    } catch (const herd::error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const auto& m : messages) {
    INFO(m);
    CHECK(m.find("the tensors live on different kinds of device across ranks (rank 0: cpu, rank 1: cuda)") !=
          std::string::npos);
  }
}
