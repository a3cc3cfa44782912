// gather(v), scatter(v), reduce and alltoall(v) on local_communicator: seeded random cases at 1-5
// ranks against plain references (every dtype, empty counts, in place, async forms, both sides of
// the tree and one-shot thresholds), reduce's bits against allreduce's, and bad or differing
// arguments raising herd::error on every rank with the communicator usable afterwards.

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/alltoall.hpp>
#include <herd/collectives/gather.hpp>
#include <herd/collectives/reduce.hpp>
#include <herd/collectives/scatter.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include "../support/checks.hpp"
#include "../support/local_errors.hpp"
#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

using herd_test::check_all;
using herd_test::has;
using herd_test::ops_for;
using herd_test::outcome;
using herd_test::rng;
using herd_test::values;

namespace {

// Per-rank element counts: some zero, some small, some large enough for the direct paths.
std::vector<std::size_t> draw_counts(rng& g, int p, bool equal) {
  const std::size_t limit = g.below(3) == 0 ? 30000 : g.below(2) == 0 ? 600 : 5;
  std::vector<std::size_t> counts(static_cast<std::size_t>(p), g.below(limit));
  if (!equal)
    for (auto& c : counts) c = g.below(4) == 0 ? 0 : g.below(limit);
  return counts;
}

std::string where(const char* what, herd::dtype t, int p, int root, bool flag, const char* flag_name) {
  return std::string(what) + " dtype=" + std::string(herd::name(t)) + " p=" + std::to_string(p) +
         " root=" + std::to_string(root) + (flag ? std::string(" ") + flag_name : std::string()) + ": ";
}

template <class T> void gather_case(rng& g, int p, outcome& out) {
  const bool equal = g.below(2) == 0;
  const bool in_place = g.below(3) == 0;
  const bool async = g.below(3) == 0;
  const int root = g.between(0, p - 1);
  const std::vector<std::size_t> counts = draw_counts(g, p, equal);
  std::vector<std::vector<T>> inputs;
  std::vector<T> want;
  for (int r = 0; r < p; ++r) {
    inputs.push_back(herd_test::draw_vector<T>(g, counts[static_cast<std::size_t>(r)], values::exact, herd::reduce_op::sum));
    want.insert(want.end(), inputs.back().begin(), inputs.back().end());
  }
  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(p));
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<T>& output = outputs[r];
    if (comm.rank() == root) output.assign(want.size(), T{});  // the others pass an empty vector
    const std::size_t before = std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::size_t{0});
    if (in_place && comm.rank() == root) std::copy(inputs[r].begin(), inputs[r].end(), output.begin() + static_cast<std::ptrdiff_t>(before));
    const herd::const_buffer_view in =
        in_place && comm.rank() == root ? herd::const_buffer_view(output.data() + before, counts[r], herd::dtype_of_v<T>)
                                        : herd::const_view_of(inputs[r]);
    if (equal && async) herd::gather_async(in, output, comm, root).wait();
    else if (equal) herd::gather(in, output, comm, root);
    else if (async) herd::gatherv_async(in, output, counts, comm, root).wait();
    else herd::gatherv(in, output, counts, comm, root);
  });
  const std::string at = where(equal ? "gather" : "gatherv", herd::dtype_of_v<T>, p, root, in_place, "in place");
  const auto& got = outputs[static_cast<std::size_t>(root)];
  if (got.size() != want.size() || !herd_test::same_bytes(got.data(), want.data(), want.size() * sizeof(T))) out.fail(at + "wrong at the root");
  for (int r = 0; r < p; ++r)
    if (r != root && !outputs[static_cast<std::size_t>(r)].empty()) out.fail(at + "a non-root output was written");
}

template <class T> void scatter_case(rng& g, int p, outcome& out) {
  const bool equal = g.below(2) == 0;
  const bool in_place = g.below(3) == 0;
  const bool async = g.below(3) == 0;
  const int root = g.between(0, p - 1);
  const std::vector<std::size_t> counts = draw_counts(g, p, equal);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const std::vector<T> all = herd_test::draw_vector<T>(g, total, values::exact, herd::reduce_op::sum);
  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(p));
  std::vector<T> root_input;
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const std::size_t before = std::accumulate(counts.begin(), counts.begin() + comm.rank(), std::size_t{0});
    std::vector<T> none;
    std::vector<T>& input = comm.rank() == root ? root_input : none;  // the others pass an empty vector
    if (comm.rank() == root) input = all;
    outputs[r].assign(counts[r], T{});
    herd::buffer_view output = in_place && comm.rank() == root
                                   ? herd::buffer_view{input.data() + before, counts[r], herd::dtype_of_v<T>}
                                   : herd::view_of(outputs[r]);
    if (equal && async) herd::scatter_async(input, output, comm, root).wait();
    else if (equal) herd::scatter(input, output, comm, root);
    else if (async) herd::scatterv_async(input, output, counts, comm, root).wait();
    else herd::scatterv(input, output, counts, comm, root);
    if (in_place && comm.rank() == root) {
      std::copy(input.begin() + static_cast<std::ptrdiff_t>(before),
                input.begin() + static_cast<std::ptrdiff_t>(before + counts[r]), outputs[r].begin());
    }
  });
  const std::string at = where(equal ? "scatter" : "scatterv", herd::dtype_of_v<T>, p, root, in_place, "in place");
  std::size_t offset = 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    if (!herd_test::same_bytes(outputs[r].data(), all.data() + offset, counts[r] * sizeof(T)))
      out.fail(at + "wrong on rank " + std::to_string(r));
    offset += counts[r];
  }
  if (!herd_test::same_bytes(root_input.data(), all.data(), total * sizeof(T))) out.fail(at + "the root's input changed");
}

template <class T> void reduce_case(rng& g, herd::reduce_op op, int p, outcome& out) {
  const int root = g.between(0, p - 1);
  const std::size_t n = g.below(3) == 0 ? g.below(20000) : g.below(3) == 0 ? g.below(4) : g.below(2000);
  const bool arithmetic = op == herd::reduce_op::sum || op == herd::reduce_op::avg || op == herd::reduce_op::prod;
  const values mode = !std::is_integral_v<T> && arithmetic && g.below(2) == 0 ? values::rough : values::exact;
  const bool in_place = g.below(3) == 0;
  const bool async = g.below(3) == 0;
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, mode, op));
  std::vector<T> reduced(n);
  std::vector<T> allreduced(n);
  std::vector<int> untouched(static_cast<std::size_t>(p), 1);
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<T> mine = inputs[r];
    std::vector<T> none;
    std::vector<T>& output = comm.rank() == root ? (in_place ? mine : reduced) : none;
    if (async) herd::reduce_async(mine, output, comm, op, root).wait();
    else herd::reduce(mine, output, comm, op, root);
    if (comm.rank() == root && in_place) reduced = mine;
    if (comm.rank() != root) untouched[r] = none.empty() && herd_test::same_bytes(mine.data(), inputs[r].data(), n * sizeof(T));
    std::vector<T> all = inputs[r];
    herd::allreduce(all, comm, op);
    if (comm.rank() == root) allreduced = all;
  });
  const std::string at = where("reduce", herd::dtype_of_v<T>, p, root, in_place, "in place") + "op=" +
                         std::string(herd::name(op)) + " count=" + std::to_string(n) + ": ";
  const std::string diff = herd_test::compare(reduced, herd_test::reference_reduce(inputs, op), inputs, op, mode);
  if (!diff.empty()) out.fail(at + diff);
  if (!herd_test::same_bytes(reduced.data(), allreduced.data(), n * sizeof(T))) out.fail(at + "differs bitwise from allreduce");
  for (int r = 0; r < p; ++r)
    if (!untouched[static_cast<std::size_t>(r)]) out.fail(at + "rank " + std::to_string(r) + "'s input or output changed");
}

template <class T> void alltoall_case(rng& g, int p, outcome& out) {
  // 0: alltoall, 1: alltoallv with both splits, 2: alltoallv learning the receive splits.
  const int form = static_cast<int>(g.below(3));
  const bool async = form != 2 && g.below(3) == 0;
  const std::size_t limit = g.below(3) == 0 ? 8000 : g.below(2) == 0 ? 300 : 3;
  const std::size_t block = g.below(limit);
  std::vector<std::vector<std::size_t>> splits(static_cast<std::size_t>(p), std::vector<std::size_t>(static_cast<std::size_t>(p)));
  for (auto& row : splits)
    for (auto& s : row) s = form == 0 ? block : g.below(4) == 0 ? 0 : g.below(limit);
  std::vector<std::vector<T>> inputs;
  for (const auto& row : splits) {
    inputs.push_back(herd_test::draw_vector<T>(g, std::accumulate(row.begin(), row.end(), std::size_t{0}), values::exact,
                                               herd::reduce_op::sum));
  }
  // Rank r's expected output: rank q's block for r, for q in order.
  std::vector<std::vector<T>> want(static_cast<std::size_t>(p));
  for (std::size_t q = 0; q < static_cast<std::size_t>(p); ++q) {
    std::size_t at = 0;
    for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
      want[r].insert(want[r].end(), inputs[q].begin() + static_cast<std::ptrdiff_t>(at),
                     inputs[q].begin() + static_cast<std::ptrdiff_t>(at + splits[q][r]));
      at += splits[q][r];
    }
  }
  std::vector<std::vector<T>> outputs(static_cast<std::size_t>(p));
  std::vector<int> learnt_right(static_cast<std::size_t>(p), 1);
  herd::local::run(p, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    const std::vector<T>& in = inputs[r];
    std::vector<std::size_t> receive;
    for (std::size_t q = 0; q < static_cast<std::size_t>(p); ++q) receive.push_back(splits[q][r]);
    if (form == 2) {
      outputs[r].assign(3, T{});  // resized by the call
      learnt_right[r] = herd::alltoallv(in, outputs[r], splits[r], comm) == receive;
      return;
    }
    outputs[r].assign(want[r].size(), T{});
    if (form == 0 && async) herd::alltoall_async(in, outputs[r], comm).wait();
    else if (form == 0) herd::alltoall(in, outputs[r], comm);
    else if (async) herd::alltoallv_async(in, outputs[r], splits[r], receive, comm).wait();
    else herd::alltoallv(in, outputs[r], splits[r], receive, comm);
  });
  const std::string at = std::string(form == 0 ? "alltoall" : form == 1 ? "alltoallv" : "alltoallv (learning)") +
                         " dtype=" + std::string(herd::name(herd::dtype_of_v<T>)) + " p=" + std::to_string(p) +
                         (async ? " async" : "") + ": ";
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    if (outputs[r].size() != want[r].size() || !herd_test::same_bytes(outputs[r].data(), want[r].data(), want[r].size() * sizeof(T)))
      out.fail(at + "wrong on rank " + std::to_string(r));
    if (!learnt_right[r]) out.fail(at + "wrong receive splits returned on rank " + std::to_string(r));
  }
}

// Errors an agreement raises, after which the communicator still reduces.
template <class Fn> std::vector<std::string> errors_then_usable(int p, Fn fn) {
  return herd_test::agreed_errors_per_rank(p, fn, {.names_the_rank = false, .then_usable = true});
}

struct splits_limit {
  explicit splits_limit(int ranks) { herd::detail::alltoallv_splits_max_ranks() = ranks; }
  ~splits_limit() { herd::detail::alltoallv_splits_max_ranks() = std::numeric_limits<int>::max(); }
};

}  // namespace

TEST_CASE("gather and gatherv match the reference for random dtype x counts x root x world size") {
  rng g(0x5eed0101);
  outcome out;
  for (int c = 0; c < 300; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const int p = g.between(1, 5);
    herd::visit(t, [&](auto e) { gather_case<decltype(e)>(g, p, out); });
  }
  out.report();
}

TEST_CASE("scatter and scatterv match the reference for random dtype x counts x root x world size") {
  rng g(0x5eed0102);
  outcome out;
  for (int c = 0; c < 300; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const int p = g.between(1, 5);
    herd::visit(t, [&](auto e) { scatter_case<decltype(e)>(g, p, out); });
  }
  out.report();
}

TEST_CASE("reduce matches the reference and allreduce's bits for random dtype x op x count x root x world size") {
  rng g(0x5eed0103);
  outcome out;
  for (int c = 0; c < 400; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const auto ops = ops_for(t);
    const herd::reduce_op op = ops[g.below(ops.size())];
    const int p = g.between(1, 5);
    herd::visit(t, [&](auto e) { reduce_case<decltype(e)>(g, op, p, out); });
  }
  out.report();
}

TEST_CASE("alltoall and alltoallv match the reference for random dtype x splits x world size") {
  rng g(0x5eed0104);
  outcome out;
  for (int c = 0; c < 300; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const int p = g.between(1, 5);
    herd::visit(t, [&](auto e) { alltoall_case<decltype(e)>(g, p, out); });
  }
  out.report();
}

TEST_CASE("alltoallv with the splits exchanged pairwise, as beyond the ranks the agreement holds splits for") {
  const splits_limit pairwise(0);
  rng g(0x5eed0105);
  outcome out;
  for (int c = 0; c < 60; ++c) {
    const herd::dtype t = herd::all_dtypes[g.below(8)];
    const int p = g.between(2, 5);
    herd::visit(t, [&](auto e) { alltoall_case<decltype(e)>(g, p, out); });
  }
  out.report();
}

TEST_CASE("gather, scatter and reduce: roots, counts and dtypes that differ across ranks") {
  check_all(errors_then_usable(3,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(2), all(6);
                              herd::gather(in, all, comm, comm.rank() == 2 ? 1 : 0);
                            }),
            {"herd::gather", "the root differs across ranks (rank 0: 0, rank 1: 0, rank 2: 1)"});
  check_all(errors_then_usable(3,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(comm.rank() == 1 ? 3 : 2), all(6);
                              herd::gather(in, all, comm, 0);
                            }),
            {"the element count differs across ranks (rank 0: 2, rank 1: 3, rank 2: 2)"});
  check_all(errors_then_usable(2,
                            [](herd::local_communicator& comm) {
                              const std::vector<std::size_t> counts =
                                  comm.rank() == 0 ? std::vector<std::size_t>{1, 2} : std::vector<std::size_t>{2, 1};
                              std::vector<int> in(counts[static_cast<std::size_t>(comm.rank())]), all(3);
                              herd::gatherv(in, all, counts, comm, 1);
                            }),
            {"herd::gatherv", "the per-rank counts differ across ranks"});
  check_all(errors_then_usable(2,
                            [](herd::local_communicator& comm) {
                              std::vector<double> all(4);
                              if (comm.rank() == 1) {
                                std::vector<float> mine(2);
                                herd::scatter(all, mine, comm, 0);
                              } else {
                                std::vector<double> mine(2);
                                herd::scatter(all, mine, comm, 0);
                              }
                            }),
            {"herd::scatter", "the dtype differs across ranks (rank 0: f64, rank 1: f32)"});
  check_all(errors_then_usable(3,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(4), sum(4);
                              herd::reduce(v, sum, comm, comm.rank() == 0 ? herd::reduce_op::sum : herd::reduce_op::max, 0);
                            }),
            {"herd::reduce", "the reduce_op differs across ranks (rank 0: sum, rank 1: max, rank 2: max)"});
}

TEST_CASE("gather, scatter and reduce: a bad argument on one rank") {
  const auto out_of_range = errors_then_usable(3, [](herd::local_communicator& comm) {
    std::vector<int> all(6), mine(2);
    herd::scatter(all, mine, comm, comm.rank() == 1 ? 3 : 0);
  });
  CHECK(has(out_of_range[1], "herd::scatter on rank 1 of 3: root 3 is out of range"));
  CHECK(has(out_of_range[0], "rank 1 passed a root out of range"));
  CHECK(has(out_of_range[2], "rank 1 passed a root out of range"));

  const auto short_output = errors_then_usable(3, [](herd::local_communicator& comm) {
    std::vector<float> in(2), all(5);
    herd::gather(in, all, comm, 2);
  });
  CHECK(has(short_output[2], "the output tensor has 5 elements but 6 are needed (the input's elements times the ranks)"));
  CHECK(has(short_output[0], "rank 2 passed a tensor of the wrong size"));

  const auto wrong_list = errors_then_usable(3, [](herd::local_communicator& comm) {
    std::vector<float> in(1), all(3);
    const std::vector<std::size_t> counts(comm.rank() == 0 ? 2 : 3, 1);
    herd::gatherv(in, all, counts, comm, 1);
  });
  CHECK(has(wrong_list[0], "the list of per-rank counts has 2 entries for 3 ranks"));
  CHECK(has(wrong_list[1], "rank 0 passed a list of per-rank counts (splits) with one entry too many or too few"));

  const auto device = errors_then_usable(2, [](herd::local_communicator& comm) {
    std::vector<float> v(4), sum(4);
    const herd::const_buffer_view in(v.data(), 4, herd::dtype::f32, comm.rank() == 1 ? herd::device::cuda(0) : herd::device::cpu());
    herd::reduce(in, sum, comm, herd::reduce_op::sum, 0);
  });
  CHECK(has(device[1], "the input tensor lives on cuda:0, but herd::reduce moves host memory only"));
  CHECK(has(device[0], "rank 1 passed a tensor on a device the communicator cannot reach"));

  check_all(errors_then_usable(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(4), sum(4);
                              herd::reduce(v, sum, comm, herd::reduce_op::bor, 1);
                            }),
            {"reduce_op::bor is not defined on dtype f32"});
  // The output is the root's only: elsewhere nothing about it is checked.
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> v(4, 1.0f);
    std::vector<double> wrong;
    if (comm.rank() == 0) {
      std::vector<float> sum(4);
      herd::reduce(v, sum, comm);
      CHECK(sum[3] == 2.0f);
    } else {
      herd::reduce(v, wrong, comm);
    }
  });
}

TEST_CASE("alltoall(v): splits that do not add up or match, and blocks that do not divide") {
  for (int limit : {std::numeric_limits<int>::max(), 0}) {
    const splits_limit path(limit);
    INFO("splits pairwise: ", limit == 0);
    const auto mismatch = errors_then_usable(3, [](herd::local_communicator& comm) {
      // Every rank sends one element to every rank, but rank 1 expects two from rank 2.
      std::vector<int> in(3), out(comm.rank() == 1 ? 4 : 3);
      const std::vector<std::size_t> send(3, 1);
      const std::vector<std::size_t> receive = comm.rank() == 1 ? std::vector<std::size_t>{1, 1, 2} : send;
      herd::alltoallv(in, out, send, receive, comm);
    });
    for (const auto& m : mismatch) {
      INFO(m);
      CHECK(has(m, "herd::alltoallv"));
      if (limit != 0) CHECK(has(m, "the receive splits of rank 1 differ from what the ranks send it (1, 1, 1 elements"));
    }
    if (limit == 0) {
      CHECK(has(mismatch[1], "the receive split for rank 2 is 2, but that rank sends 1 elements"));
      CHECK(has(mismatch[0], "rank 1 passed receive splits that differ from what the other ranks send it"));
    }
  }
  const auto short_list = errors_then_usable(3, [](herd::local_communicator& comm) {
    std::vector<int> in(3), out(3);
    const std::vector<std::size_t> send(comm.rank() == 2 ? 4 : 3, 1);
    herd::alltoallv(in, out, send, std::vector<std::size_t>(3, 1), comm);
  });
  CHECK(has(short_list[2], "the list of send splits has 4 entries for 3 ranks"));
  CHECK(has(short_list[0], "rank 2 passed a list of per-rank counts (splits) with one entry too many or too few"));
  const auto sum = errors_then_usable(2, [](herd::local_communicator& comm) {
    std::vector<int> in(3), out(4);
    const std::vector<std::size_t> splits{2, 2};
    herd::alltoallv(in, out, splits, splits, comm);
  });
  CHECK(has(sum[0], "the input tensor has 3 elements but 4 are needed (the sum of the send splits)"));
  const auto uneven = errors_then_usable(2, [](herd::local_communicator& comm) {
    std::vector<float> in(5), out(5);
    herd::alltoall(in, out, comm);
  });
  CHECK(has(uneven[1], "the input's 5 elements do not split into 2 equal blocks"));
  const auto overlap = errors_then_usable(2, [](herd::local_communicator& comm) {
    std::vector<float> v(4);
    herd::alltoall(v, v, comm);
  });
  CHECK(has(overlap[0], "the input and output buffers overlap"));
  // One rank: its receive split from itself must be its send split.
  herd::local::run(1, [](herd::local_communicator& comm) {
    std::vector<int> in(2), out(3);
    CHECK_THROWS_WITH_AS(herd::alltoallv(in, out, std::vector<std::size_t>{2}, std::vector<std::size_t>{3}, comm),
                         doctest::Contains("the receive split 3 differs from the send split 2"), herd::error);
  });
}
