// Synchronized batch normalization: W ranks, each with its own part of a batch (equal parts, and
// uneven ones), compute what one rank computes on the whole batch: outputs, running statistics,
// input gradients, and weight and bias gradients once summed over the ranks (within 1e-5).

#include <herd/herd.hpp>
#include <herd/nn/sync_batch_norm.hpp>

#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr std::size_t channels = 3, spatial = 5;

struct results {
  std::vector<float> y, dx, running_mean, running_var, grad_weight, grad_bias;
};

// One training step forward and backward of samples [begin, end) of x (and dy), then evaluate().
template <class C>
results run_layer(C& comm, const std::vector<float>& x, const std::vector<float>& dy, std::size_t begin, std::size_t end) {
  herd::sync_batch_norm bn(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    bn.weight[c] = 0.5f + static_cast<float>(c);
    bn.bias[c] = -0.25f * static_cast<float>(c);
  }
  const std::size_t per = channels * spatial, n = end - begin;
  results r;
  r.y.resize(n * per);
  r.dx.resize(n * per);
  for (int step = 0; step < 2; ++step) {  // twice, so the running statistics move twice
    bn.forward(x.data() + begin * per, r.y.data(), n, spatial, comm);
    bn.backward(dy.data() + begin * per, r.dx.data(), comm);
  }
  r.running_mean = bn.running_mean;
  r.running_var = bn.running_var;
  r.grad_weight = bn.grad_weight;
  r.grad_bias = bn.grad_bias;
  herd::allreduce(r.grad_weight, comm);  // what the optimizer's reduction (a sum here) would do
  herd::allreduce(r.grad_bias, comm);
  return r;
}

double worst(const std::vector<float>& a, const float* b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::abs(static_cast<double>(a[i]) - b[i]));
  return w;
}

}  // namespace

TEST_CASE("sync_batch_norm over W ranks equals one rank over the whole batch") {
  herd_test::rng g(31);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (bool uneven : {false, true}) {
      // Per-rank batch sizes: 4 each, or 1, 6, 2, 5.
      std::vector<std::size_t> sizes(static_cast<std::size_t>(ranks), 4);
      if (uneven) {
        const std::size_t pattern[] = {1, 6, 2, 5};
        for (int r = 0; r < ranks; ++r) sizes[static_cast<std::size_t>(r)] = pattern[r];
      }
      const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
      std::vector<float> x(total * channels * spatial), dy(x.size());
      for (auto& v : x) v = static_cast<float>(3 * g.unit() - 1);
      for (auto& v : dy) v = static_cast<float>(g.unit() - 0.5);
      results whole;
      herd::local::run(1, [&](herd::local_communicator& one) { whole = run_layer(one, x, dy, 0, total); });
      herd::local::run(ranks, [&](herd::local_communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        const std::size_t begin = std::accumulate(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(r), std::size_t{0});
        const results mine = run_layer(comm, x, dy, begin, begin + sizes[r]);
        const std::size_t per = channels * spatial;
        INFO("ranks ", ranks, uneven ? " uneven" : " even", " rank ", r);
        CHECK(worst(mine.y, whole.y.data() + begin * per) <= 1e-5);
        CHECK(worst(mine.dx, whole.dx.data() + begin * per) <= 1e-5);
        CHECK(worst(mine.running_mean, whole.running_mean.data()) <= 1e-5);
        CHECK(worst(mine.running_var, whole.running_var.data()) <= 1e-5);
        CHECK(worst(mine.grad_weight, whole.grad_weight.data()) <= 1e-5);
        CHECK(worst(mine.grad_bias, whole.grad_bias.data()) <= 1e-5);
      });
    }
  }
}

TEST_CASE("sync_batch_moments: one value per channel over all ranks is an error on every rank") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    const std::vector<double> sum = {1.0, 2.0}, sum_sq = {1.0, 4.0};
    const double count = comm.rank() == 0 ? 1 : 0;  // one sample in all
    CHECK_THROWS_WITH_AS(herd::sync_batch_moments(sum, sum_sq, count, comm), doctest::Contains("1 value(s) per channel"),
                         herd::error);
    const herd::batch_moments m = herd::sync_batch_moments(sum, sum_sq, 2, comm);  // 4 values: mean 1 and 2
    CHECK(m.count == 4);
    CHECK(m.mean[1] == doctest::Approx(1.0));
    CHECK(m.var[1] == doctest::Approx(2.0 - 1.0));
  });
}

// Sums that do not pair up on one rank raise on every rank, the others naming it (they once waited
// in the allreduce for that rank, which had raised alone, and paired it with its next call).
TEST_CASE("sync_batch_moments: sums that do not pair up on one rank raise on every rank") {
  for (const int ranks : {2, 3}) {
    herd::local::run(ranks, [](herd::local_communicator& comm) {
      const std::vector<double> sum = {1.0, 2.0}, sum_sq = {1.0, 4.0}, short_sq = {1.0};
      std::string message;
      try {
        (void)herd::sync_batch_moments(sum, comm.rank() == 1 ? std::span<const double>(short_sq) : sum_sq, 2, comm);
      } catch (const herd::error& e) {
        message = e.what();
      }
      INFO("rank ", comm.rank(), " of ", comm.size(), ": ", message);
      CHECK(message.find(comm.rank() == 1 ? "2 channel sums but 1 sums of squares" : "rank 1 passed a tensor of the wrong size") !=
            std::string::npos);
      const herd::batch_moments m = herd::sync_batch_moments(sum, sum_sq, 2, comm);  // the next call is whole
      CHECK(m.count == 2.0 * comm.size());
      CHECK(m.mean[1] == doctest::Approx(1.0));
    });
  }
}
