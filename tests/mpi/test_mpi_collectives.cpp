// herd's collectives on real MPI ranks, checked against references every rank computes for itself
// (each rank can draw every other rank's input from the shared seed), and checked for bitwise
// agreement across ranks with a hash compared through plain MPI.

#include <herd/herd.hpp>

#include "../support/mpi_test.hpp"
#include "../support/reference.hpp"
#include "../support/mpi_world.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace {

using herd_test::rng;
using herd_test::values;
using herd_test::world;

// Inputs of every rank for one case; rank r's input is inputs[r].
template <class T>
std::vector<std::vector<T>> inputs_of_all_ranks(std::uint64_t seed, int p, std::size_t n, herd::reduce_op op, values mode) {
  rng g(seed);
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, mode, op));
  return inputs;
}

std::uint64_t hash_bytes(const void* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// True when every rank holds the same bytes.
bool identical_on_all_ranks(const void* data, std::size_t n) {
  // One MPI_Allreduce gives both max(h) and max(~h) = ~min(h).
  const auto h = static_cast<unsigned long long>(hash_bytes(data, n));
  const unsigned long long mine[2] = {h, ~h};
  unsigned long long most[2] = {0, 0};
  MPI_Allreduce(mine, most, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return most[0] == ~most[1];
}

// Counts that matter at this world size: none, fewer than the ranks, about the ranks, a few
// segments' worth (with the default 1 MiB segment and the small one set below).
std::vector<std::size_t> interesting_counts(int p) {
  const auto q = static_cast<std::size_t>(p);
  return {0, 1, q - 1 == 0 ? 2 : q - 1, q, q + 1, 1000, 70001};
}

template <class T> void check_allreduce(world& w, herd::reduce_op op, std::size_t n, bool in_place, values mode) {
  const std::uint64_t seed = 977 * n + 31 * static_cast<std::uint64_t>(op) + static_cast<std::uint64_t>(herd::dtype_of_v<T>);
  const auto inputs = inputs_of_all_ranks<T>(seed, w.size, n, op, mode);
  const auto& mine = inputs[static_cast<std::size_t>(w.rank)];
  std::vector<T> result(n);
  if (in_place) {
    result = mine;
    herd::allreduce(result, w.comm, op);
  } else {
    herd::allreduce(mine, result, w.comm, op);
  }
  INFO("dtype ", herd::name(herd::dtype_of_v<T>), " op ", herd::name(op), " count ", n, in_place ? " in place" : "");
  const std::string diff = herd_test::compare(result, herd_test::reference_reduce(inputs, op), inputs, op, mode);
  CHECK_MESSAGE(diff.empty(), diff);
  CHECK(identical_on_all_ranks(result.data(), n * sizeof(T)));
}

}  // namespace

HERD_MPI_TEST_CASE("mpi_communicator satisfies the communicator concept and duplicates its MPI_Comm", 1) {
  static_assert(herd::communicator<herd::mpi_communicator>);
  world w;
  int compare = MPI_UNEQUAL;
  MPI_Comm_compare(w.comm.native(), MPI_COMM_WORLD, &compare);
  CHECK(compare == MPI_CONGRUENT);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  CHECK(w.rank == world_rank);
}

HERD_MPI_TEST_CASE("allreduce: every dtype x op, in and out of place, every interesting count", 1) {
  world w;
  for (auto t : herd::all_dtypes) {
    for (auto op : herd::all_reduce_ops) {
      if (!herd::supports(t, op)) continue;
      for (std::size_t n : interesting_counts(w.size)) {
        herd::visit(t, [&](auto e) {
          using T = decltype(e);
          check_allreduce<T>(w, op, n, n % 2 == 0, values::exact);
        });
      }
    }
  }
}

HERD_MPI_TEST_CASE("allreduce: arbitrary floats agree with the reference within rounding", 1) {
  world w;
  for (auto op : {herd::reduce_op::sum, herd::reduce_op::avg, herd::reduce_op::prod}) {
    check_allreduce<float>(w, op, 12345, false, values::rough);
    check_allreduce<double>(w, op, 777, true, values::rough);
    check_allreduce<herd::half>(w, op, 3001, false, values::rough);
    check_allreduce<herd::bfloat16>(w, op, 4099, true, values::rough);
  }
}

HERD_MPI_TEST_CASE("allreduce with many small pipeline segments", 2) {
  world w;
  auto& settings = herd::runtime::defaults();
  const auto saved = settings.ring_segment_bytes;
  settings.ring_segment_bytes = 100;
  for (std::size_t n : {std::size_t{3}, std::size_t{999}, std::size_t{10007}}) {
    check_allreduce<float>(w, herd::reduce_op::sum, n, true, values::exact);
    check_allreduce<std::int64_t>(w, herd::reduce_op::max, n, false, values::exact);
    check_allreduce<herd::half>(w, herd::reduce_op::avg, n, false, values::exact);
  }
  settings.ring_segment_bytes = saved;
}

HERD_MPI_TEST_CASE("broadcast from every root, small and large", 1) {
  world w;
  for (int root = 0; root < w.size; ++root) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5000}, std::size_t{300000}}) {
      rng g(static_cast<std::uint64_t>(root) * 1000 + n);
      const auto expected = herd_test::draw_vector<double>(g, n, values::exact, herd::reduce_op::sum);
      std::vector<double> v = w.rank == root ? expected : std::vector<double>(n, -1.0);
      herd::broadcast(v, w.comm, root);
      INFO("root ", root, " count ", n);
      CHECK(herd_test::same_bytes(v.data(), expected.data(), n * sizeof(double)));
    }
  }
}

HERD_MPI_TEST_CASE("allgather, allgatherv and reduce_scatter", 1) {
  world w;
  const auto p = static_cast<std::size_t>(w.size);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{50000}}) {
    std::vector<std::int32_t> mine(n);
    for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<std::int32_t>(1000 * w.rank + static_cast<int>(i));
    std::vector<std::int32_t> all(n * p);
    herd::allgather(mine, all, w.comm);
    bool ok = true;
    for (std::size_t r = 0; r < p; ++r)
      for (std::size_t i = 0; i < n; ++i) ok = ok && all[r * n + i] == static_cast<std::int32_t>(1000 * r + i);
    CHECK(ok);
  }
  // allgatherv: rank r contributes r + 2 elements, rank 0 none when more than one rank.
  std::vector<float> mine(w.size > 1 && w.rank == 0 ? 0 : static_cast<std::size_t>(w.rank + 2), static_cast<float>(w.rank));
  std::vector<float> all;
  const auto counts = herd::allgatherv(mine, all, w.comm);
  std::size_t at = 0;
  for (std::size_t r = 0; r < p; ++r) {
    CHECK(counts[r] == (p > 1 && r == 0 ? 0 : r + 2));
    for (std::size_t i = 0; i < counts[r]; ++i) CHECK(all[at++] == static_cast<float>(r));
  }
  // reduce_scatter: block b of the sum lands on rank b.
  for (std::size_t block : {std::size_t{1}, std::size_t{1000}, std::size_t{70000}}) {
    std::vector<double> in(block * p);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<double>(i % 17) + w.rank;
    std::vector<double> out(block);
    herd::reduce_scatter(in, out, w.comm, herd::reduce_op::sum);
    bool ok = true;
    const double rank_sum = static_cast<double>(p * (p - 1) / 2);
    for (std::size_t i = 0; i < block; ++i) {
      const std::size_t global = static_cast<std::size_t>(w.rank) * block + i;
      ok = ok && out[i] == static_cast<double>(p) * static_cast<double>(global % 17) + rank_sum;
    }
    CHECK(ok);
  }
}

HERD_MPI_TEST_CASE("split: sub-communicators run their own collectives", 2) {
  world w;
  auto half = w.comm.split(w.rank % 2, w.rank);
  CHECK(half.size() == (w.size + 1 - w.rank % 2) / 2);
  std::vector<int> v{1};
  herd::allreduce(v, half);
  CHECK(v[0] == half.size());
  herd::barrier(w.comm);
}

HERD_MPI_TEST_CASE("point to point: isend, irecv, test, wait and sendrecv around the ring", 2) {
  world w;
  const int right = (w.rank + 1) % w.size;
  const int left = (w.rank - 1 + w.size) % w.size;
  int got = -1;
  w.comm.sendrecv(&w.rank, sizeof(int), right, &got, sizeof(int), left, 3);
  CHECK(got == left);
  std::vector<double> out(1000, w.rank), in(1000, -1);
  auto r = w.comm.irecv(in.data(), in.size() * sizeof(double), left, 4);
  auto s = w.comm.isend(out.data(), out.size() * sizeof(double), right, 4);
  while (!w.comm.test(r)) {
  }
  w.comm.wait(s);
  CHECK(in[999] == left);
}
