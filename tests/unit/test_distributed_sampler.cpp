// herd::random_engine, herd::permutation and herd::distributed_sampler: the PRNG stream pinned to
// literal values, unbiased bounded draws, and the sampler against a line-by-line transcription of
// PyTorch's DistributedSampler over every case of its size formula.

#include <herd/collectives/allgather.hpp>
#include <herd/comm/local.hpp>
#include <herd/core/random.hpp>
#include <herd/data/distributed_sampler.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include "../support/checks.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <numeric>
#include <ranges>
#include <set>
#include <string>
#include <vector>

using herd_test::error_of;
using herd_test::has;

namespace {

using index_list = std::vector<std::size_t>;

std::size_t to_size(long long v) { return static_cast<std::size_t>(v); }

index_list iota(std::size_t n) {
  index_list v(n);
  std::iota(v.begin(), v.end(), std::size_t{0});
  return v;
}

// torch/utils/data/distributed.py, __init__ and __iter__, line by line, with `order` standing for
// torch.randperm(...) or list(range(len(dataset))). Signed arithmetic and float ceil as in Python.
index_list torch_reference(const index_list& order, long long num_replicas, long long rank, bool drop_last) {
  const auto len = static_cast<long long>(order.size());
  long long num_samples = 0;
  if (drop_last && len % num_replicas != 0) {
    num_samples = static_cast<long long>(
        std::ceil(static_cast<double>(len - num_replicas) / static_cast<double>(num_replicas)));
  } else {
    num_samples = static_cast<long long>(std::ceil(static_cast<double>(len) / static_cast<double>(num_replicas)));
  }
  const long long total_size = num_samples * num_replicas;

  index_list indices = order;
  if (!drop_last) {
    const long long padding_size = total_size - len;
    if (padding_size <= len) {
      indices.insert(indices.end(), order.begin(), order.begin() + padding_size);
    } else {
      // (indices * math.ceil(padding_size / len(indices)))[:padding_size]
      const auto copies = static_cast<long long>(std::ceil(static_cast<double>(padding_size) / static_cast<double>(len)));
      index_list repeated;
      for (long long c = 0; c < copies; ++c) repeated.insert(repeated.end(), order.begin(), order.end());
      indices.insert(indices.end(), repeated.begin(), repeated.begin() + padding_size);
    }
  } else {
    indices.resize(to_size(total_size));
  }
  REQUIRE(indices.size() == to_size(total_size));

  index_list mine;  // indices[rank:total_size:num_replicas]
  for (long long i = rank; i < total_size; i += num_replicas) mine.push_back(indices[to_size(i)]);
  REQUIRE(mine.size() == to_size(num_samples));
  return mine;
}

// The formula as PEERS.md states it, on unsigned values.
std::size_t expected_num_samples(std::size_t n, std::size_t w, bool drop_last) {
  if (drop_last && n % w != 0) return n < w ? 0 : (n - w + w - 1) / w;
  return (n + w - 1) / w;
}

// Pearson's chi-square of observed counts against equal expected counts.
double chi_square(const std::vector<std::size_t>& counts) {
  const double total = static_cast<double>(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  const double expected = total / static_cast<double>(counts.size());
  double chi = 0;
  for (std::size_t c : counts) chi += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
  return chi;
}
constexpr double chi_square_5_dof_p001 = 20.515;  // the 0.1% critical value for 6 buckets

}  // namespace

// Pinned constants: computed once from the algorithms documented in random.hpp (and checked against
// an independent transcription), so any change to the stream fails here.
static_assert(herd::random_engine(0).next() == 0x99ec5f36cb75f2b4u, "the stream is usable at compile time");

TEST_CASE("random_engine: the first outputs for seeds 0 and 42 are pinned") {
  const std::array<std::uint64_t, 5> seed0 = {0x99ec5f36cb75f2b4u, 0xbf6e1f784956452au, 0x1a5f849d4933e6e0u,
                                              0x6aa594f1262d2d2cu, 0xbba5ad4a1f842e59u};
  const std::array<std::uint64_t, 5> seed42 = {0x15780b2e0c2ec716u, 0x6104d9866d113a7eu, 0xae17533239e499a1u,
                                               0xecb8ad4703b360a1u, 0xfde6dc7fe2ec5e64u};
  herd::random_engine a(0);
  herd::random_engine b(42);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(a.next() == seed0[i]);
    CHECK(b.next() == seed42[i]);
  }
  // splitmix64's first output from 0, as in its reference implementation.
  std::uint64_t x = 0;
  CHECK(herd::detail::splitmix64(x) == 0xe220a8397b1dcdafu);

  // Default seed is 0; seed() restarts; operator() is next().
  herd::random_engine c;
  CHECK(c() == seed0[0]);
  c.seed(42);
  CHECK(c.next() == seed42[0]);
  c.seed(42);
  CHECK(c == herd::random_engine(42));
}

TEST_CASE("random_engine: uniform_below draws are pinned and stay in range") {
  herd::random_engine e(42);
  const std::array<std::uint64_t, 8> bounds = {1, 2, 3, 6, 10, 1000, (std::uint64_t{1} << 63) + 1, std::uint64_t{3} << 62};
  const std::array<std::uint64_t, 8> expected = {0, 0, 2, 5, 9, 769, 6633989454467100377u, 11759916168988360805u};
  for (std::size_t i = 0; i < bounds.size(); ++i) CHECK(e.uniform_below(bounds[i]) == expected[i]);

  herd::random_engine f(7);
  for (int i = 0; i < 1000; ++i) {
    CHECK(f.uniform_below(1) == 0);
    const std::uint64_t n = 1 + f.next() % 1000;
    CHECK(f.uniform_below(n) < n);
  }
  CHECK(has(error_of([&] { f.uniform_below(0); }), "Pass n >= 1"));
}

TEST_CASE("random_engine: the portable 128-bit product matches the native one") {
  herd::random_engine e(3);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> pairs = {
      {0, 0}, {1, ~std::uint64_t{0}}, {~std::uint64_t{0}, ~std::uint64_t{0}}, {0xffffffffu, 0x100000001u}};
  for (int i = 0; i < 200; ++i) pairs.emplace_back(e.next(), e.next());
  for (const auto& [a, b] : pairs) {
    const auto native = herd::detail::multiply_wide(a, b);
    const auto portable = herd::detail::multiply_wide_portable(a, b);
    CHECK(native.high == portable.high);
    CHECK(native.low == portable.low);
    CHECK(native.low == a * b);
  }
}

TEST_CASE("random_engine: uniform_below is unbiased") {
  // Six buckets: chi-square with 5 degrees of freedom, fixed seed, so the outcome is fixed too.
  herd::random_engine e(2024);
  std::vector<std::size_t> counts(6, 0);
  for (int i = 0; i < 60000; ++i) ++counts[e.uniform_below(6)];
  CHECK(chi_square(counts) < chi_square_5_dof_p001);

  // n = 3 * 2^62: a plain next() % n would land below 2^62 half the time instead of a third.
  const std::uint64_t n = std::uint64_t{3} << 62;
  int low = 0;
  constexpr int draws = 30000;
  for (int i = 0; i < draws; ++i) low += e.uniform_below(n) < (std::uint64_t{1} << 62) ? 1 : 0;
  CHECK(std::abs(static_cast<double>(low) / draws - 1.0 / 3.0) < 0.015);
}

TEST_CASE("permutation: Fisher-Yates from the last element down, pinned and uniform") {
  CHECK(herd::permutation(0, 0).empty());
  CHECK(herd::permutation(1, 5) == index_list{0});
  CHECK(herd::permutation(10, 0) == index_list{7, 8, 3, 1, 5, 4, 2, 0, 9, 6});
  CHECK(herd::permutation(10, 7) == index_list{1, 8, 3, 0, 4, 5, 9, 6, 2, 7});
  CHECK(herd::permutation(100, 9) == herd::permutation(100, 9));
  CHECK(herd::permutation(100, 9) != herd::permutation(100, 10));
  for (std::size_t n : {2u, 3u, 17u, 1000u}) {
    index_list p = herd::permutation(n, n);
    std::sort(p.begin(), p.end());
    CHECK(p == iota(n));
  }
  // All 6 orders of 3 elements equally often (an off-by-one in j would only give the 2 cycles).
  std::map<index_list, std::size_t> seen;
  for (std::uint64_t seed = 0; seed < 6000; ++seed) ++seen[herd::permutation(3, seed)];
  REQUIRE(seen.size() == 6);
  std::vector<std::size_t> counts;
  for (const auto& entry : seen) counts.push_back(entry.second);
  CHECK(chi_square(counts) < chi_square_5_dof_p001);
}

TEST_CASE("distributed_sampler: every case of the size formula matches PyTorch's rules") {
  const std::size_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 10, 13, 31, 100};
  const int worlds[] = {1, 2, 3, 4, 5, 7, 8, 16};
  for (std::size_t n : sizes) {
    for (int w : worlds) {
      const auto uw = static_cast<std::size_t>(w);
      for (int flags = 0; flags < 8; ++flags) {
        herd::sampler_options options;
        options.shuffle = (flags & 1) != 0;
        options.drop_last = (flags & 2) != 0;
        options.pad = (flags & 4) == 0;
        options.seed = 11;
        const bool equal_shares = options.drop_last || options.pad;
        const std::size_t num_samples = expected_num_samples(n, uw, options.drop_last);
        for (std::uint64_t epoch : {0u, 3u}) {
          CAPTURE(n);
          CAPTURE(w);
          CAPTURE(flags);
          CAPTURE(epoch);
          const index_list order = options.shuffle ? herd::permutation(n, options.seed + epoch) : iota(n);
          std::vector<std::size_t> uses(n, 0);
          std::size_t taken = 0;
          std::size_t smallest = n + 1;
          std::size_t largest = 0;
          index_list interleaved(equal_shares ? num_samples * uw : 0);
          for (int r = 0; r < w; ++r) {
            herd::distributed_sampler sampler(n, w, r, options);
            sampler.set_epoch(epoch);
            const index_list mine = sampler.indices();
            CHECK(sampler.size() == mine.size());
            CHECK(sampler.total_size() == (equal_shares ? num_samples * uw : n));
            if (equal_shares) {
              CHECK(sampler.size() == num_samples);
              CHECK(mine == torch_reference(order, w, r, options.drop_last));
              for (std::size_t k = 0; k < mine.size(); ++k) interleaved[static_cast<std::size_t>(r) + k * uw] = mine[k];
            } else {
              index_list strided;  // order[r], order[r + W], ... below N
              for (std::size_t i = static_cast<std::size_t>(r); i < n; i += uw) strided.push_back(order[i]);
              CHECK(mine == strided);
            }
            for (std::size_t i : mine) {
              REQUIRE(i < n);
              ++uses[i];
            }
            taken += mine.size();
            smallest = std::min(smallest, mine.size());
            largest = std::max(largest, mine.size());
          }
          CHECK(taken == (equal_shares ? num_samples * uw : n));
          const auto distinct = static_cast<std::size_t>(std::count_if(uses.begin(), uses.end(), [](std::size_t u) { return u > 0; }));
          if (options.drop_last) {
            // Exactly `total` distinct indices, none twice, the first `total` of the order.
            CHECK(distinct == taken);
            CHECK(interleaved == index_list(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(taken)));
          } else {
            // Every index at least once; the extra uses are exactly the padding, taken from the
            // start of the order, cyclically.
            CHECK(distinct == n);
            if (equal_shares) {
              index_list padded;
              for (std::size_t p = 0; p < taken; ++p) padded.push_back(order[p % n]);
              CHECK(interleaved == padded);
              for (std::size_t p = 0; p < n; ++p) CHECK(uses[order[p]] == taken / n + (p < taken % n ? 1 : 0));
            } else {
              CHECK(std::all_of(uses.begin(), uses.end(), [](std::size_t u) { return u == 1; }));
              if (n > 0) CHECK(largest - smallest <= 1);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("distributed_sampler: the formula and the padding, case by case") {
  struct formula_case {
    std::size_t n;
    int w;
    bool drop_last;
    std::size_t num_samples;
  };
  const formula_case cases[] = {
      {12, 4, false, 3}, {12, 4, true, 3},  // divisible
      {10, 4, false, 3}, {10, 4, true, 2},  // not divisible: pad up or drop the tail
      {3, 5, false, 1},  {3, 5, true, 0},   // more ranks than samples: ceil((3 - 5) / 5) = 0
      {0, 3, false, 0},  {0, 3, true, 0},   // empty dataset
      {7, 1, false, 7},  {7, 1, true, 7},   // one rank takes everything
  };
  for (const auto& c : cases) {
    CAPTURE(c.n);
    CAPTURE(c.w);
    CAPTURE(c.drop_last);
    herd::sampler_options options;
    options.drop_last = c.drop_last;
    for (int r = 0; r < c.w; ++r) {
      const herd::distributed_sampler sampler(c.n, c.w, r, options);
      CHECK(sampler.size() == c.num_samples);
      CHECK(sampler.total_size() == c.num_samples * static_cast<std::size_t>(c.w));
      CHECK(sampler.indices().size() == c.num_samples);
    }
  }

  // In order: 10 samples on 4 ranks pad with 0 and 1; 2 samples on 5 ranks repeat the list.
  herd::sampler_options ordered;
  ordered.shuffle = false;
  const index_list ten[] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) CHECK(herd::distributed_sampler(10, 4, r, ordered).indices() == ten[r]);
  const index_list two[] = {{0}, {1}, {0}, {1}, {0}};
  for (int r = 0; r < 5; ++r) CHECK(herd::distributed_sampler(2, 5, r, ordered).indices() == two[r]);
  ordered.drop_last = true;
  const index_list dropped[] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; ++r) CHECK(herd::distributed_sampler(10, 4, r, ordered).indices() == dropped[r]);

  const herd::distributed_sampler empty(0, 2, 1);
  CHECK(empty.indices().empty());
  CHECK(empty.batches(4).empty());
  CHECK(empty.batch_count(4) == 0);
  CHECK(empty.dataset_size() == 0);
  CHECK(empty.world_size() == 2);
  CHECK(empty.rank() == 1);
}

TEST_CASE("distributed_sampler: each epoch has its own order, and forgetting set_epoch repeats one") {
  herd::distributed_sampler sampler(100, 4, 1);
  const index_list first = sampler.indices();
  CHECK(sampler.indices() == first);  // set_epoch never called: the same order again
  std::set<index_list> orders{first};
  for (std::uint64_t epoch = 1; epoch < 6; ++epoch) {
    sampler.set_epoch(epoch);
    CHECK(sampler.epoch() == epoch);
    orders.insert(sampler.indices());
  }
  CHECK(orders.size() == 6);
  sampler.set_epoch(0);
  CHECK(sampler.indices() == first);

  // The seed moves the order; seed + epoch is what counts.
  herd::sampler_options other;
  other.seed = 1;
  CHECK(herd::distributed_sampler(100, 4, 1, other).indices() != first);
  sampler.set_epoch(1);
  CHECK(herd::distributed_sampler(100, 4, 1, other).indices() == sampler.indices());
}

TEST_CASE("distributed_sampler: every rank of a job derives the same order") {
  constexpr std::size_t n = 37;
  constexpr int w = 4;
  herd::sampler_options options;
  options.seed = 99;
  std::vector<std::vector<std::int64_t>> gathered(w);
  herd::local::run(w, [&](herd::local_communicator& comm) {
    herd::distributed_sampler sampler(n, comm, options);
    sampler.set_epoch(5);
    std::vector<std::int64_t> mine;
    for (std::size_t i : sampler.indices()) mine.push_back(static_cast<std::int64_t>(i));
    std::vector<std::int64_t> all(mine.size() * w);
    herd::allgather(mine, all, comm);
    gathered[static_cast<std::size_t>(comm.rank())] = all;
  });
  // Rank r's k-th index sits at all[r * size + k]; interleaved they must be the padded order.
  const index_list order = herd::permutation(n, 99 + 5);
  const std::size_t per_rank = (n + w - 1) / w;
  for (const auto& all : gathered) {
    CHECK(all == gathered[0]);
    REQUIRE(all.size() == per_rank * w);
    for (std::size_t r = 0; r < w; ++r)
      for (std::size_t k = 0; k < per_rank; ++k) CHECK(static_cast<std::size_t>(all[r * per_rank + k]) == order[(r + k * w) % n]);
  }
}

TEST_CASE("distributed_sampler: resuming inside an epoch continues the same sequence, also in batches") {
  static_assert(std::ranges::forward_range<herd::batch_range>);
  static_assert(std::ranges::sized_range<herd::batch_range>);
  static_assert(std::same_as<std::ranges::range_value_t<herd::batch_range>, std::span<const std::size_t>>);

  herd::sampler_options options;
  options.seed = 3;
  for (bool drop_last : {false, true}) {
    options.drop_last = drop_last;
    herd::distributed_sampler sampler(103, 3, 2, options);
    sampler.set_epoch(7);
    const index_list full = sampler.indices();
    REQUIRE(full.size() == sampler.size());
    for (std::size_t k = 0; k <= full.size(); ++k) {
      CAPTURE(k);
      sampler.set_epoch(7, k);
      CHECK(sampler.start() == k);
      const index_list rest(full.begin() + static_cast<std::ptrdiff_t>(k), full.end());
      CHECK(sampler.indices() == rest);
      for (std::size_t b : {1u, 4u, 5u, 64u}) {
        for (bool drop_batch : {false, true}) {
          const herd::batch_range batches = sampler.batches(b, drop_batch);
          index_list joined;
          std::size_t count = 0;
          for (std::span<const std::size_t> batch : batches) {
            const bool last = count + 1 == batches.size();
            CHECK((batch.size() == b || (last && !drop_batch && batch.size() < b && !batch.empty())));
            CHECK(std::ranges::equal(batch, batches[count]));
            joined.insert(joined.end(), batch.begin(), batch.end());
            ++count;
          }
          CHECK(count == sampler.batch_count(b, drop_batch));
          CHECK(count == batches.size());
          CHECK(static_cast<std::size_t>(std::ranges::distance(batches)) == count);  // a second pass, as a forward range may
          const std::size_t kept = drop_batch ? rest.size() / b * b : rest.size();
          CHECK(joined == index_list(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(kept)));
        }
      }
    }
  }
}

TEST_CASE("distributed_sampler: for_evaluation counts every sample exactly once") {
  for (std::size_t n : {0u, 1u, 5u, 10u, 11u, 12u}) {
    for (int w : {1, 3, 4, 7}) {
      CAPTURE(n);
      CAPTURE(w);
      std::vector<int> uses(n, 0);
      std::size_t smallest = n + 1;
      std::size_t largest = 0;
      for (int r = 0; r < w; ++r) {
        herd::distributed_sampler sampler = herd::distributed_sampler::for_evaluation(n, w, r);
        sampler.set_epoch(4);  // no shuffle: the epoch changes nothing
        CHECK(sampler.total_size() == n);
        const index_list mine = sampler.indices();
        CHECK(mine.size() == sampler.size());
        for (std::size_t k = 0; k < mine.size(); ++k) {
          CHECK(mine[k] == static_cast<std::size_t>(r) + k * static_cast<std::size_t>(w));
          ++uses[mine[k]];
        }
        smallest = std::min(smallest, mine.size());
        largest = std::max(largest, mine.size());
      }
      CHECK(std::all_of(uses.begin(), uses.end(), [](int u) { return u == 1; }));
      CHECK(largest - smallest <= 1);
    }
  }

  // From a communicator: sizes 3, 3, 2, 2 for 10 samples on 4 ranks.
  std::vector<std::size_t> sizes(4);
  herd::local::run(4, [&](herd::local_communicator& comm) {
    const auto sampler = herd::distributed_sampler::for_evaluation(10, comm);
    sizes[static_cast<std::size_t>(comm.rank())] = sampler.size();
  });
  CHECK(sizes == std::vector<std::size_t>{3, 3, 2, 2});
}

TEST_CASE("distributed_sampler: bad input is a herd::error that says what to do") {
  CHECK(has(error_of([] { herd::distributed_sampler(10, 0, 0); }), "the world size is 0"));
  CHECK(has(error_of([] { herd::distributed_sampler(10, -2, 0); }), "at least 1"));
  const std::string high = error_of([] { herd::distributed_sampler(10, 4, 4); });
  CHECK(has(high, "rank 4 is outside [0, 4)"));
  CHECK(has(high, "comm.rank()"));
  CHECK(has(error_of([] { herd::distributed_sampler(10, 4, -1); }), "rank -1 is outside"));
  CHECK(has(error_of([] { herd::distributed_sampler::for_evaluation(10, 2, 2); }), "outside [0, 2)"));

  herd::distributed_sampler sampler(10, 4, 1);
  const std::string batch = error_of([&] { (void)sampler.batches(0); });
  CHECK(has(batch, "herd::distributed_sampler::batches on rank 1 of 4: the batch size is 0"));
  CHECK(has(error_of([&] { (void)sampler.batch_count(0, true); }), "batch size of at least 1"));
  CHECK(has(error_of([] { herd::batch_range(index_list{1, 2}, 0); }), "the batch size is 0"));

  sampler.set_epoch(2, 3);  // all three of this rank's samples consumed: allowed, and empty
  CHECK(sampler.indices().empty());
  CHECK(sampler.batch_count(2) == 0);
  const std::string beyond = error_of([&] { sampler.set_epoch(2, 4); });
  CHECK(has(beyond, "start 4 is beyond the 3 samples this rank has per epoch"));
  CHECK(sampler.start() == 3);  // a rejected call changes nothing
}
