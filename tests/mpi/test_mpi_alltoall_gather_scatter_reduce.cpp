// gather(v), scatter(v), alltoall(v) and reduce on real MPI ranks against MPI's own collectives on
// MPI_COMM_WORLD with the same seeded data (integers compared exactly, floats within rounding and
// against herd's allreduce bit for bit), objects, process sets, and bad arguments on one rank.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"
#include "../support/reference.hpp"
#include "../support/mpi_world.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace {

using herd_test::has;
using herd_test::rng;
using herd_test::values;
using herd_test::world;

std::vector<int> as_int(const std::vector<std::size_t>& v) { return {v.begin(), v.end()}; }
std::vector<int> displacements(const std::vector<std::size_t>& counts) {
  std::vector<int> at(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) at[i] = at[i - 1] + static_cast<int>(counts[i - 1]);
  return at;
}

// Counts of every rank for a case (every rank draws the same); small, or past the tree's 64 KiB.
std::vector<std::size_t> counts_of(std::uint64_t seed, int p, std::size_t limit) {
  rng g(seed);
  std::vector<std::size_t> counts(static_cast<std::size_t>(p));
  for (auto& c : counts) c = g.below(4) == 0 ? 0 : g.below(limit);
  return counts;
}

}  // namespace

HERD_MPI_TEST_CASE("gatherv and scatterv match MPI_Gatherv and MPI_Scatterv", 1) {
  world w;
  for (std::size_t limit : {std::size_t{5}, std::size_t{30000}}) {
    for (int root = 0; root < w.size; ++root) {
      const std::uint64_t seed = 17 * limit + static_cast<std::uint64_t>(root);
      const auto counts = counts_of(seed, w.size, limit);
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      rng g(seed + static_cast<std::uint64_t>(w.rank) * 1000003);
      const auto mine = herd_test::draw_vector<std::int32_t>(g, counts[static_cast<std::size_t>(w.rank)], values::exact,
                                                             herd::reduce_op::sum);
      const bool at_root = w.rank == root;
      std::vector<std::int32_t> ours(at_root ? total : 0), theirs(at_root ? total : 0);
      herd::gatherv(mine, ours, counts, w.comm, root);
      MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_INT32_T, theirs.data(), as_int(counts).data(),
                  displacements(counts).data(), MPI_INT32_T, root, MPI_COMM_WORLD);
      INFO("gatherv root ", root, " limit ", limit);
      CHECK(ours == theirs);

      const auto all = herd_test::draw_vector<double>(g, at_root ? total : 0, values::exact, herd::reduce_op::sum);
      std::vector<double> part(counts[static_cast<std::size_t>(w.rank)]), reference(part.size());
      herd::scatterv(all, part, counts, w.comm, root);
      MPI_Scatterv(all.data(), as_int(counts).data(), displacements(counts).data(), MPI_DOUBLE, reference.data(),
                   static_cast<int>(reference.size()), MPI_DOUBLE, root, MPI_COMM_WORLD);
      CHECK(herd_test::same_bytes(part.data(), reference.data(), part.size() * sizeof(double)));
    }
  }
}

HERD_MPI_TEST_CASE("alltoallv, with either form, and alltoall match MPI_Alltoallv and MPI_Alltoall", 1) {
  world w;
  const auto p = static_cast<std::size_t>(w.size);
  for (std::size_t limit : {std::size_t{4}, std::size_t{20000}}) {
    // Every rank draws the whole matrix of splits: row q is what rank q sends.
    std::vector<std::vector<std::size_t>> splits;
    for (std::size_t q = 0; q < p; ++q) splits.push_back(counts_of(977 * limit + q, w.size, limit));
    const auto& send = splits[static_cast<std::size_t>(w.rank)];
    std::vector<std::size_t> receive;
    for (std::size_t q = 0; q < p; ++q) receive.push_back(splits[q][static_cast<std::size_t>(w.rank)]);
    rng g(limit + static_cast<std::uint64_t>(w.rank));
    const auto in = herd_test::draw_vector<std::int64_t>(g, std::accumulate(send.begin(), send.end(), std::size_t{0}),
                                                         values::exact, herd::reduce_op::sum);
    const std::size_t total = std::accumulate(receive.begin(), receive.end(), std::size_t{0});
    std::vector<std::int64_t> theirs(total), given(total), learnt;
    MPI_Alltoallv(in.data(), as_int(send).data(), displacements(send).data(), MPI_INT64_T, theirs.data(),
                  as_int(receive).data(), displacements(receive).data(), MPI_INT64_T, MPI_COMM_WORLD);
    herd::alltoallv(in, given, send, receive, w.comm);
    CHECK(herd::alltoallv(in, learnt, send, w.comm) == receive);
    INFO("limit ", limit);
    CHECK(given == theirs);
    CHECK(learnt == theirs);

    const auto blocks = herd_test::draw_vector<float>(g, limit * p, values::exact, herd::reduce_op::sum);
    std::vector<float> ours(blocks.size()), reference(blocks.size());
    herd::alltoall(blocks, ours, w.comm);
    MPI_Alltoall(blocks.data(), static_cast<int>(limit), MPI_FLOAT, reference.data(), static_cast<int>(limit), MPI_FLOAT,
                 MPI_COMM_WORLD);
    CHECK(ours == reference);
  }
}

HERD_MPI_TEST_CASE("reduce matches MPI_Reduce, and herd's allreduce bit for bit, through shared memory and the ring", 1) {
  world w;
  herd::comm_options ring_only;
  ring_only.allreduce_algorithm = herd::algorithm::ring;
  herd::mpi_communicator ring(MPI_COMM_WORLD, ring_only);
  for (herd::mpi_communicator* comm : {&w.comm, &ring}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{70001}}) {
      const int root = static_cast<int>(n % static_cast<std::size_t>(w.size));
      rng g(n + static_cast<std::uint64_t>(w.rank) * 7919);
      const auto ints = herd_test::draw_vector<std::int32_t>(g, n, values::exact, herd::reduce_op::sum);
      std::vector<std::int32_t> ours(w.rank == root ? n : 0), theirs(n);
      herd::reduce(ints, ours, *comm, herd::reduce_op::sum, root);
      MPI_Reduce(ints.data(), theirs.data(), static_cast<int>(n), MPI_INT32_T, MPI_SUM, root, MPI_COMM_WORLD);
      if (w.rank == root) CHECK(ours == theirs);
      std::vector<std::int32_t> largest(w.rank == root ? n : 0);
      herd::reduce(ints, largest, *comm, herd::reduce_op::max, root);
      MPI_Reduce(ints.data(), theirs.data(), static_cast<int>(n), MPI_INT32_T, MPI_MAX, root, MPI_COMM_WORLD);
      if (w.rank == root) CHECK(largest == theirs);

      const auto floats = herd_test::draw_vector<float>(g, n, values::rough, herd::reduce_op::sum);
      std::vector<float> sum(w.rank == root ? n : 0), mpi_sum(n), all = floats;
      herd::reduce(floats, sum, *comm, herd::reduce_op::avg, root);
      MPI_Reduce(floats.data(), mpi_sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
      herd::allreduce(all, *comm, herd::reduce_op::avg);
      if (w.rank == root) {
        INFO("count ", n, std::string(comm == &ring ? " (ring)" : " (shared memory)"));
        CHECK(herd_test::same_bytes(sum.data(), all.data(), n * sizeof(float)));
        bool close = true;
        for (std::size_t i = 0; i < n; ++i) {
          close = close && std::abs(sum[i] - mpi_sum[i] / static_cast<float>(w.size)) <= 1e-4f * (1 + std::abs(mpi_sum[i]));
        }
        CHECK(close);
      }
    }
  }
}

HERD_MPI_TEST_CASE("objects: allgather_object and broadcast_object", 1) {
  world w;
  const auto names = herd::allgather_object(std::string("rank ") + std::to_string(w.rank), w.comm);
  REQUIRE(names.size() == static_cast<std::size_t>(w.size));
  for (int q = 0; q < w.size; ++q) CHECK(names[static_cast<std::size_t>(q)] == "rank " + std::to_string(q));
  std::vector<double> table = w.rank == w.size - 1 ? std::vector<double>{1.5, 2.5} : std::vector<double>{};
  herd::broadcast_object(table, w.comm, w.size - 1);
  CHECK(table == std::vector<double>{1.5, 2.5});
}

HERD_MPI_TEST_CASE("process sets: split with no_color and subset; a left-out rank's communicator refuses", 2) {
  world w;
  herd::mpi_communicator odd = w.comm.split(w.rank % 2 == 1 ? 0 : herd::no_color, w.rank);
  CHECK(odd.is_member() == (w.rank % 2 == 1));
  if (odd.is_member()) {
    std::vector<int> v{1};
    herd::allreduce(v, odd);
    CHECK(v[0] == w.size / 2);
  } else {
    CHECK(odd.rank() == -1);
    CHECK(odd.size() == 0);
    CHECK(odd.native() == MPI_COMM_NULL);
    std::vector<int> v{1};
    CHECK_THROWS_WITH_AS(herd::allreduce(v, odd), doctest::Contains("this rank is not a member of this communicator"),
                         herd::error);
    CHECK_THROWS_WITH_AS(herd::barrier(odd), doctest::Contains("not a member"), herd::error);
    CHECK_THROWS_WITH_AS((void)odd.renew(), doctest::Contains("not a member"), herd::error);
    CHECK_THROWS_WITH_AS((void)odd.isend(v.data(), 4, 0, 1), doctest::Contains("not a member"), herd::error);
  }
  // Rank 0 alone is left out, and the last rank leads.
  std::vector<int> listed;
  for (int q = w.size - 1; q >= 1; --q) listed.push_back(q);
  herd::mpi_communicator set = w.comm.subset(listed);
  CHECK(set.is_member() == (w.rank != 0));
  if (set.is_member()) {
    CHECK(set.rank() == w.size - 1 - w.rank);
    const auto ranks = herd::allgather_object(w.rank, set);
    CHECK(ranks == listed);
  }
  herd::barrier(w.comm);
}

HERD_MPI_TEST_CASE("a bad argument on one rank raises on every rank within seconds", 2) {
  world w;
  const bool last = w.rank == w.size - 1;
  auto error_of = [](auto fn) {
    const auto start = std::chrono::steady_clock::now();
    std::string message = "(no error)";
    try {
      fn();
    } catch (const herd::error& e) {
      message = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    return message;
  };
  const std::string counts = error_of([&] {
    std::vector<std::size_t> c(static_cast<std::size_t>(w.size), 2);
    if (last) c[0] = 3;
    std::vector<float> in(2), all(2 * static_cast<std::size_t>(w.size));
    herd::gatherv(in, all, c, w.comm, 0);
  });
  INFO(counts);
  CHECK(has(counts, "herd::gatherv on rank " + std::to_string(w.rank)));
  CHECK(has(counts, "the element count differs across ranks"));  // the totals differ before the lists
  const std::string splits = error_of([&] {
    const std::vector<std::size_t> send(static_cast<std::size_t>(w.size), 1);
    std::vector<std::size_t> receive = send;
    if (last) receive[0] = 2;
    std::vector<int> in(send.size()), out(std::accumulate(receive.begin(), receive.end(), std::size_t{0}));
    herd::alltoallv(in, out, send, receive, w.comm);
  });
  INFO(splits);
  CHECK(has(splits, "the receive splits of rank " + std::to_string(w.size - 1) + " differ from what the ranks send it"));
  const std::string root = error_of([&] {
    std::vector<double> v(3), sum(3);
    herd::reduce(v, sum, w.comm, herd::reduce_op::sum, last ? w.size : 0);
  });
  INFO(root);
  CHECK(has(root, last ? "root " + std::to_string(w.size) + " is out of range" : "passed a root out of range"));
  // The communicator goes on.
  std::vector<int> one{1};
  herd::allreduce(one, w.comm);
  CHECK(one[0] == w.size);
}
