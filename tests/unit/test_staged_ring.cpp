// herd's staged collectives (device memory over a host-memory communicator) with an emulated
// asynchronous device: its copies and reductions run later, on another thread, so every place the
// algorithms must wait for them is exercised. Against the plain reference, every rank bitwise
// alike, with staging memory bounded by the window whatever the tensor's size.

#include <herd/collectives/detail/staged_ring.hpp>
#include <herd/comm/local.hpp>

#include "../support/emulated_device.hpp"
#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

struct staged_case {
  herd::dtype type;
  herd::reduce_op op;
  int p;
  std::size_t n;
  std::size_t segment;
};

staged_case draw_case(herd_test::rng& g) {
  const herd::dtype type = herd::all_dtypes[g.below(8)];
  std::vector<herd::reduce_op> ops;
  for (auto op : herd::all_reduce_ops)
    if (herd::supports(type, op)) ops.push_back(op);
  const herd::reduce_op op = ops[g.below(ops.size())];
  const int p = g.between(1, 5);
  const std::size_t n = g.below(3) == 0 ? g.below(static_cast<std::uint64_t>(2 * p + 1)) : g.below(5000);
  const std::size_t segment = std::size_t{16} << g.below(8);  // 16 B .. 2 KiB: many segments
  return {type, op, p, n, segment};
}

// The staged collectives run inside an operation of their communicator, whose data tag (in herd's
// reserved range, which isend/irecv refuse outside operations) they send on.
template <class F> void as_operation(herd::local_communicator& comm, F&& body) {
  herd::detail::run_operation(comm, {herd::detail::op_kind::allreduce}, body);
}

// What the staged collectives may hold: the window's slots of one segment, whatever the tensor.
void check_bounded(const herd_test::emulated_device& device, std::size_t segment) {
  CHECK(device.host_bytes() <= herd::detail::staged_host_bytes(segment));
  CHECK(device.device_bytes() <= herd::detail::staged_window * segment);
}

}  // namespace

TEST_CASE("staged ring allreduce over an emulated device matches the reference") {
  herd_test::rng g(0x57a9ed);
  int checked = 0;
  for (int c = 0; c < 100; ++c) {
    const auto [type, op, p, n, segment] = draw_case(g);
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
        as_operation(comm, [&] {
          herd::detail::staged_ring_allreduce(comm, device, type, op, reinterpret_cast<const std::byte*>(in.data()),
                                              reinterpret_cast<std::byte*>(out.data()), n, segment);
        });
        if (in_place) results[r] = in;
        check_bounded(device, segment);
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
  CHECK(checked == 100);
}

TEST_CASE("staged ring reduce_scatter over an emulated device matches the reference") {
  herd_test::rng g(0x57a9ee);
  for (int c = 0; c < 60; ++c) {
    const auto [type, op, p, n, segment] = draw_case(g);
    herd::visit(type, [&](auto element) {
      using T = decltype(element);
      const std::size_t per_rank = n / static_cast<std::size_t>(p);
      const std::size_t total = per_rank * static_cast<std::size_t>(p);
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, total, herd_test::values::exact, op));
      std::vector<std::vector<T>> results(static_cast<std::size_t>(p), std::vector<T>(per_rank));
      herd::local::run(p, [&](herd::local_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        herd_test::emulated_device device(2000 + r);
        as_operation(comm, [&] {
          herd::detail::staged_ring_reduce_scatter(comm, device, type, op,
                                                   reinterpret_cast<const std::byte*>(inputs[r].data()),
                                                   reinterpret_cast<std::byte*>(results[r].data()), per_rank, segment);
        });
        check_bounded(device, segment);
      });
      const auto full = herd_test::reference_reduce(inputs, op);
      for (std::size_t r = 0; r < results.size(); ++r) {
        const std::vector<T> want(full.begin() + static_cast<std::ptrdiff_t>(r * per_rank),
                                  full.begin() + static_cast<std::ptrdiff_t>((r + 1) * per_rank));
        std::vector<std::vector<T>> parts;
        for (const auto& in : inputs)
          parts.emplace_back(in.begin() + static_cast<std::ptrdiff_t>(r * per_rank),
                             in.begin() + static_cast<std::ptrdiff_t>((r + 1) * per_rank));
        const std::string diff = herd_test::compare(results[r], want, parts, op, herd_test::values::exact);
        INFO(herd::name(type), " ", herd::name(op), " p=", p, " per rank ", per_rank, " segment ", segment, " rank ", r);
        CHECK_MESSAGE(diff.empty(), diff);
      }
    });
  }
}

TEST_CASE("staged ring allgatherv and chain broadcast over an emulated device deliver every byte") {
  herd_test::rng g(0x57a9ef);
  for (int c = 0; c < 60; ++c) {
    const int p = g.between(1, 5);
    const std::size_t segment = std::size_t{8} << g.below(8);
    std::vector<std::size_t> counts;
    for (int r = 0; r < p; ++r) counts.push_back(g.below(4) == 0 ? 0 : g.below(3000));
    const herd::detail::chunk_layout chunks = herd::detail::chunk_layout::of_counts(counts);
    std::size_t total = 0;
    for (auto k : counts) total += k;
    std::vector<std::uint8_t> whole(total);
    for (auto& b : whole) b = static_cast<std::uint8_t>(g.next());
    const int root = g.between(0, p - 1);
    const std::size_t broadcast_bytes = g.below(3) == 0 ? g.below(40) : g.below(20000);
    std::vector<std::uint8_t> message(broadcast_bytes);
    for (auto& b : message) b = static_cast<std::uint8_t>(g.next());
    std::vector<std::vector<std::uint8_t>> gathered(static_cast<std::size_t>(p)), received(static_cast<std::size_t>(p));
    herd::local::run(p, [&](herd::local_communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      herd_test::emulated_device device(3000 + r);
      std::vector<std::uint8_t> out(total, 0xee);
      const std::vector<std::uint8_t> mine(whole.begin() + static_cast<std::ptrdiff_t>(chunks.offset[r]),
                                           whole.begin() + static_cast<std::ptrdiff_t>(chunks.offset[r] + counts[r]));
      as_operation(comm, [&] {
        // This rank's chunk put in place on the device's inbound queue, as an out-of-place
        // allgather does (collectives/detail/dispatch.hpp): the first ways out must wait for it.
        if (counts[r] != 0) device.copy(out.data() + chunks.offset[r], mine.data(), counts[r]);
        herd::detail::staged_ring_allgather(comm, device, reinterpret_cast<std::byte*>(out.data()), 1, chunks, segment);
      });
      gathered[r] = out;
      std::vector<std::uint8_t> data = static_cast<int>(r) == root ? message : std::vector<std::uint8_t>(broadcast_bytes, 0xee);
      as_operation(comm, [&] {
        herd::detail::staged_chain_broadcast(comm, device, reinterpret_cast<std::byte*>(data.data()), data.size(), root,
                                             segment);
      });
      received[r] = data;
      check_bounded(device, segment);
    });
    for (int r = 0; r < p; ++r) {
      INFO("p=", p, " segment ", segment, " rank ", r, " root ", root, " bytes ", broadcast_bytes);
      CHECK(gathered[static_cast<std::size_t>(r)] == whole);
      CHECK(received[static_cast<std::size_t>(r)] == message);
    }
  }
}

// A collective that goes on making progress is not a stall, however long it lasts in all: the
// watchdog counts the time since the last progress. Here every device operation takes 2 ms, so
// the allreduce lasts well over the 0.2 s shutdown time while no wait lasts more than a few ms.
TEST_CASE("a staged allreduce that progresses for longer than the shutdown time is not called stalled") {
  herd::comm_options options;
  options.stall_shutdown_seconds = 0.2;
  options.stall_check_seconds = 0;
  const std::size_t n = 4096, segment = 256;  // 2 ranks: 32 segments a chunk, 64 items each way
  std::vector<std::vector<float>> results(2);
  std::vector<std::string> errors(2);
  herd::local::run(
      2,
      [&](herd::local_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        std::vector<float> data(n);  // before the device: outlives the work still queued on it
        for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 97) + static_cast<float>(r);
        herd_test::emulated_device device(4000 + r, std::chrono::milliseconds(2));
        const auto start = std::chrono::steady_clock::now();
        try {
          as_operation(comm, [&] {
            herd::detail::staged_ring_allreduce(comm, device, herd::dtype::f32, herd::reduce_op::sum,
                                                reinterpret_cast<const std::byte*>(data.data()),
                                                reinterpret_cast<std::byte*>(data.data()), n, segment);
          });
        } catch (const herd::error& e) {
          errors[r] = e.what();
          device.finish();
        }
        results[r] = data;
        if (r == 0) CHECK(std::chrono::steady_clock::now() - start > std::chrono::milliseconds(250));
      },
      options);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank ", r);
    CHECK_MESSAGE(errors[r].empty(), errors[r]);
    bool right = true;
    for (std::size_t i = 0; i < n; ++i) right = right && results[r][i] == static_cast<float>(2 * (i % 97) + 1);
    CHECK(right);
  }
}
