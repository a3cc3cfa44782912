// Seeded differential tests: herd's collectives on local_communicator against plain reference
// implementations, over random dtype x op x element count x world size 1..8, with the pipeline
// segment varied so that chunks span one or many segments. Every rank's result is also compared
// byte for byte with rank 0's.

#include <herd/comm/local.hpp>
#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/tensor/std.hpp>

#include "../support/checks.hpp"
#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

using herd_test::ops_for;
using herd_test::outcome;
using herd_test::rng;
using herd_test::values;

namespace {

// The pipeline segment a case runs with: a few elements, a few hundred, or the default, but never
// so small that a chunk needs more than 16 segments (which only slows the test down).
void pick_segment(rng& g, std::size_t bytes, int p) {
  static const std::size_t choices[] = {8, 96, 1000, std::size_t{256} << 10};
  const std::size_t chunk = bytes / static_cast<std::size_t>(p) + 1;
  herd::runtime::defaults().ring_segment_bytes = std::max(choices[g.below(4)], chunk / 16);
}

// Element counts: often below the world size (some chunks empty), often moderate, sometimes large.
std::size_t pick_count(rng& g, int p) {
  switch (g.below(5)) {
    case 0: return g.below(static_cast<std::uint64_t>(2 * p + 1));
    case 1: case 2: return g.below(300);
    case 3: return g.below(3000);
    default: return g.below(40000);
  }
}

std::string describe(const char* what, herd::dtype t, herd::reduce_op op, int p, std::size_t n, bool in_place) {
  return std::string(what) + " dtype=" + std::string(herd::name(t)) + " op=" + std::string(herd::name(op)) +
         " p=" + std::to_string(p) + " count=" + std::to_string(n) + (in_place ? " in place" : " out of place") +
         " segment=" + std::to_string(herd::runtime::defaults().ring_segment_bytes) + ": ";
}

template <class T>
void allreduce_case(rng& g, herd::reduce_op op, int p, std::size_t n, values mode, bool in_place, outcome& out) {
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, mode, op));
  const auto pristine = inputs;
  std::vector<std::vector<T>> results(static_cast<std::size_t>(p), std::vector<T>(n));
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    if (in_place) {
      results[r] = inputs[r];
      herd::allreduce(results[r], comm, op);
    } else {
      const std::vector<T>& in = inputs[r];
      herd::allreduce(in, results[r], comm, op);
    }
  });
  const std::string where = describe("allreduce", herd::dtype_of_v<T>, op, p, n, in_place);
  const auto want = herd_test::reference_reduce(pristine, op);
  for (std::size_t r = 0; r < results.size(); ++r) {
    const std::string diff = herd_test::compare(results[r], want, pristine, op, mode);
    if (!diff.empty()) out.fail(where + "rank " + std::to_string(r) + " " + diff);
    if (!herd_test::same_bytes(results[r].data(), results[0].data(), n * sizeof(T)))
      out.fail(where + "rank " + std::to_string(r) + " differs bitwise from rank 0");
    if (!in_place && !herd_test::same_bytes(inputs[r].data(), pristine[r].data(), n * sizeof(T)))
      out.fail(where + "rank " + std::to_string(r) + " input was modified");
  }
}

template <class T>
void reduce_scatter_case(rng& g, herd::reduce_op op, int p, std::size_t block, outcome& out) {
  const std::size_t n = block * static_cast<std::size_t>(p);
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, values::exact, op));
  std::vector<std::vector<T>> results(static_cast<std::size_t>(p), std::vector<T>(block));
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const std::vector<T>& in = inputs[r];
    herd::reduce_scatter(in, results[r], comm, op);
  });
  const auto full = herd_test::reference_reduce(inputs, op);
  const std::string where = describe("reduce_scatter", herd::dtype_of_v<T>, op, p, n, false);
  for (std::size_t r = 0; r < results.size(); ++r) {
    const std::vector<T> want(full.begin() + static_cast<std::ptrdiff_t>(r * block),
                              full.begin() + static_cast<std::ptrdiff_t>((r + 1) * block));
    const std::string diff = herd_test::compare(results[r], want, inputs, op, values::exact);
    if (!diff.empty()) out.fail(where + "rank " + std::to_string(r) + " " + diff);
  }
}

template <class T> void gather_and_broadcast_case(rng& g, int p, outcome& out) {
  // allgatherv with random per-rank counts (some zero), allgather, and broadcast from a random root.
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(g.below(4) == 0 ? 0 : g.below(700));
  std::vector<std::vector<T>> inputs;
  std::vector<T> concatenated;
  for (int r = 0; r < p; ++r) {
    inputs.push_back(herd_test::draw_vector<T>(g, counts[static_cast<std::size_t>(r)], values::exact, herd::reduce_op::sum));
    concatenated.insert(concatenated.end(), inputs.back().begin(), inputs.back().end());
  }
  const std::size_t same = g.below(500);
  std::vector<std::vector<T>> equal_inputs;
  std::vector<T> equal_concatenated;
  for (int r = 0; r < p; ++r) {
    equal_inputs.push_back(herd_test::draw_vector<T>(g, same, values::exact, herd::reduce_op::sum));
    equal_concatenated.insert(equal_concatenated.end(), equal_inputs.back().begin(), equal_inputs.back().end());
  }
  const int root = g.between(0, p - 1);
  const std::size_t broadcast_count = g.below(3) == 0 ? g.below(40000) : g.below(200);
  std::vector<std::vector<T>> broadcast_data;
  for (int r = 0; r < p; ++r) broadcast_data.push_back(herd_test::draw_vector<T>(g, broadcast_count, values::exact, herd::reduce_op::sum));
  const std::vector<T> broadcast_want = broadcast_data[static_cast<std::size_t>(root)];
  const bool in_place = g.below(2) == 0;

  std::vector<std::vector<T>> gathered_v(static_cast<std::size_t>(p));
  std::vector<std::vector<T>> gathered(static_cast<std::size_t>(p), std::vector<T>(same * static_cast<std::size_t>(p)));
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const std::vector<T>& mine = inputs[r];
    const auto learned = herd::allgatherv(mine, gathered_v[r], comm);
    if (learned != counts) throw herd::error("allgatherv learned the wrong counts");
    if (in_place) {
      std::copy(equal_inputs[r].begin(), equal_inputs[r].end(), gathered[r].begin() + static_cast<std::ptrdiff_t>(r * same));
      herd::allgather(herd::const_buffer_view(gathered[r].data() + r * same, same, herd::dtype_of_v<T>), gathered[r], comm);
    } else {
      const std::vector<T>& equal_mine = equal_inputs[r];
      herd::allgather(equal_mine, gathered[r], comm);
    }
    herd::broadcast(broadcast_data[r], comm, root);
  });
  const std::string where = "dtype=" + std::string(herd::name(herd::dtype_of_v<T>)) + " p=" + std::to_string(p) + ": ";
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    if (!herd_test::same_bytes(gathered_v[r].data(), concatenated.data(), concatenated.size() * sizeof(T)) ||
        gathered_v[r].size() != concatenated.size())
      out.fail(where + "allgatherv wrong on rank " + std::to_string(r));
    if (!herd_test::same_bytes(gathered[r].data(), equal_concatenated.data(), equal_concatenated.size() * sizeof(T)))
      out.fail(where + "allgather wrong on rank " + std::to_string(r) + (in_place ? " (in place)" : ""));
    if (!herd_test::same_bytes(broadcast_data[r].data(), broadcast_want.data(), broadcast_count * sizeof(T)))
      out.fail(where + "broadcast from root " + std::to_string(root) + " wrong on rank " + std::to_string(r));
  }
}

struct segment_restore {
  ~segment_restore() { herd::runtime::defaults().ring_segment_bytes = herd::runtime::read_settings().ring_segment_bytes; }
};

}  // namespace

TEST_CASE("allreduce matches the reference for random dtype x op x count x world size") {
  segment_restore restore;
  rng g(0x5eed0001);
  outcome out;
  std::array<std::array<int, 8>, 8> covered{};
  constexpr int cases = 3000;
  for (int c = 0; c < cases; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const auto ops = ops_for(t);
    const herd::reduce_op op = ops[g.below(ops.size())];
    const int p = g.between(1, 8);
    const std::size_t n = pick_count(g, p);
    const bool arithmetic = op == herd::reduce_op::sum || op == herd::reduce_op::avg || op == herd::reduce_op::prod;
    const values mode = herd::is_floating_point(t) && arithmetic && g.below(4) == 0 ? values::rough : values::exact;
    const bool in_place = g.below(2) == 0;
    pick_segment(g, n * herd::size_of(t), p);
    herd::visit(t, [&](auto element) { allreduce_case<decltype(element)>(g, op, p, n, mode, in_place, out); });
    ++covered[static_cast<std::size_t>(t)][static_cast<std::size_t>(op)];
  }
  out.report();
  for (auto t : herd::all_dtypes) {
    for (auto op : herd::all_reduce_ops) {
      if (!herd::supports(t, op)) continue;
      INFO("dtype ", herd::name(t), " op ", herd::name(op));
      CHECK(covered[static_cast<std::size_t>(t)][static_cast<std::size_t>(op)] >= 20);
    }
  }
}

TEST_CASE("reduce_scatter matches the reference for random dtype x op x block x world size") {
  segment_restore restore;
  rng g(0x5eed0002);
  outcome out;
  for (int c = 0; c < 800; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const auto ops = ops_for(t);
    const herd::reduce_op op = ops[g.below(ops.size())];
    const int p = g.between(1, 8);
    const std::size_t block = g.below(3) == 0 ? g.below(3) : g.below(2000);
    pick_segment(g, block * static_cast<std::size_t>(p) * herd::size_of(t), p);
    herd::visit(t, [&](auto element) { reduce_scatter_case<decltype(element)>(g, op, p, block, out); });
  }
  out.report();
}

TEST_CASE("allgather, allgatherv and broadcast deliver every rank's bytes for random dtype x count x world size") {
  segment_restore restore;
  rng g(0x5eed0003);
  outcome out;
  for (int c = 0; c < 600; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const int p = g.between(1, 8);
    pick_segment(g, 40000 * herd::size_of(t), p);
    herd::visit(t, [&](auto element) { gather_and_broadcast_case<decltype(element)>(g, p, out); });
  }
  out.report();
}
