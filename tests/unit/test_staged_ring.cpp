// The staged ring allreduce (device memory over a host-memory communicator) with an emulated
// asynchronous device: its copies and reductions run later, on another thread, so every place the
// algorithm must wait for them is exercised. Against the plain reference, every rank bitwise alike.

#include <herd/collectives/detail/staged_ring.hpp>
#include <herd/comm/local.hpp>

#include "../support/emulated_device.hpp"
#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_CASE("staged ring allreduce over an emulated device matches the reference") {
  herd_test::rng g(0x57a9ed);
  int checked = 0;
  for (int c = 0; c < 150; ++c) {
    const herd::dtype type = herd::all_dtypes[g.below(8)];
    std::vector<herd::reduce_op> ops;
    for (auto op : herd::all_reduce_ops)
      if (herd::supports(type, op)) ops.push_back(op);
    const herd::reduce_op op = ops[g.below(ops.size())];
    const int p = g.between(1, 6);
    const std::size_t n = g.below(3) == 0 ? g.below(static_cast<std::uint64_t>(2 * p + 1)) : g.below(5000);
    const std::size_t segment = std::size_t{16} << g.below(8);  // 16 B .. 2 KiB: many segments
    const bool in_place = g.below(2) == 0;
    herd::visit(type, [&](auto element) {
      using T = decltype(element);
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, herd_test::values::exact, op));
      std::vector<std::vector<T>> results(static_cast<std::size_t>(p), std::vector<T>(n));
      herd::local::run(p, [&](herd::local_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        herd_test::emulated_device device(1000 + r);
        std::vector<T> in = inputs[r];
        std::vector<T>& out = in_place ? in : results[r];
        herd::detail::staged_ring_allreduce(comm, device, type, op, reinterpret_cast<const std::byte*>(in.data()),
                                            reinterpret_cast<std::byte*>(out.data()), n, segment);
        if (in_place) results[r] = in;
      });
      const auto want = herd_test::reference_reduce(inputs, op);
      for (std::size_t r = 0; r < results.size(); ++r) {
        const std::string diff = herd_test::compare(results[r], want, inputs, op, herd_test::values::exact);
        INFO(herd::name(type), " ", herd::name(op), " p=", p, " n=", n, " segment ", segment, " rank ", r);
        CHECK_MESSAGE(diff.empty(), diff);
        CHECK(herd_test::same_bytes(results[r].data(), results[0].data(), n * sizeof(T)));
      }
      ++checked;
    });
  }
  CHECK(checked == 150);
}
