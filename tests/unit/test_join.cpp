// join() for uneven inputs (uneven_inputs): ranks with different numbers of batches, one of them
// with none, finish without waiting forever, reducing in step() or in mark_ready's buckets, and
// their parameters equal one rank's that saw the same samples with the same averaging rule (the
// world size, or the ranks still training), within 1e-5; join() returns the last rank to join.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/reference.hpp"
#include "../support/tiny_mlp.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <atomic>
#include <string>
#include <vector>

namespace {

// Rank r trains on batches[r] batches, then joins. In round k the ranks still training are a
// prefix 0..a-1 (the counts fall with the rank), and rank r's batch is samples
// [k*W*b + r*b, +b), so the reference's batch of round k is the one range [k*W*b, k*W*b + a*b).
// With passes = 2 each batch is two backward passes over its halves (backward_passes_per_step,
// accumulated by copy): the sum of their means is twice the batch's mean. The first pass is held
// back, so a rank with no batches has joined before the others make the first check.
void check_join(const std::vector<int>& batches, bool divide_by_active, bool buckets, int passes = 1) {
  const int ranks = static_cast<int>(batches.size());
  const std::size_t b = 4, w = batches.size();
  const int rounds = *std::max_element(batches.begin(), batches.end());
  const herd_test::regression_data data(static_cast<std::size_t>(rounds) * w * b, 5, 2, 17);
  auto make = [](herd_test::tiny_mlp& m) { return herd::sgd(m.params(), m.grads(), {.lr = 0.1, .momentum = 0.9}); };

  herd_test::tiny_mlp alone(5, 7, 2, 3);
  auto reference = make(alone);
  for (int k = 0; k < rounds; ++k) {
    const auto active = static_cast<std::size_t>(std::count_if(batches.begin(), batches.end(), [&](int c) { return c > k; }));
    const std::size_t at = static_cast<std::size_t>(k) * w * b;
    alone.forward_backward(data, at, at + active * b);  // the mean over the active ranks' samples
    const double scale = passes * (divide_by_active ? 1.0 : static_cast<double>(active) / static_cast<double>(w));
    for (auto g : alone.grads())
      for (std::size_t i = 0; i < g.count; ++i) static_cast<float*>(g.data)[i] *= static_cast<float>(scale);
    reference.step();
  }
  int expected_last = 0;
  for (int r = 0; r < ranks; ++r)
    if (batches[static_cast<std::size_t>(r)] == rounds) expected_last = r;

  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    herd_test::tiny_mlp model(5, 7, 2, 3);
    auto sgd = make(model);
    herd::optimizer_options options{.backward_passes_per_step = passes,
                                    .accumulate = herd::accumulation::by_copy,
                                    .uneven_inputs = true,
                                    .divide_by_active_ranks = divide_by_active};
    options.bucket_bytes = 100;  // several buckets of this small model
    options.first_bucket_bytes = 60;
    herd::distributed_optimizer opt(sgd, model.grads(), comm, options);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int k = 0; k < batches[r]; ++k) {
      const std::size_t at = static_cast<std::size_t>(k) * w * b + r * b;
      const std::size_t part = b / static_cast<std::size_t>(passes);
      for (int p = 0; p < passes; ++p) {
        const std::size_t from = at + static_cast<std::size_t>(p) * part;
        model.forward_backward(data, from, from + part);
        if (buckets)
          for (std::size_t i = 4; i-- > 0;) opt.mark_ready(i);  // as a backward pass would, last layer first
        CHECK(opt.step() == (p == passes - 1));
      }
    }
    const int last = opt.join();
    const std::string how = std::string(divide_by_active ? "divide by active" : "divide by world") + (buckets ? ", buckets" : "");
    INFO("batches per rank ", batches[0], " ", batches[w - 1], ", rank ", r, ", ", how, ", passes per step ", passes);
    CHECK(last == expected_last);
    // The ranks that trained to the end hold the reference's parameters; the others stopped early.
    if (batches[r] == rounds) CHECK(herd_test::relative_difference(model, alone) <= 1e-5);
  });
}

}  // namespace

TEST_CASE("join: uneven batch counts, one rank without any, finish and match one rank's training") {
  for (bool buckets : {false, true}) {
    for (bool divide_by_active : {false, true}) {
      check_join({4, 1}, divide_by_active, buckets);
      check_join({3, 0}, divide_by_active, buckets);
      check_join({5, 3, 0}, divide_by_active, buckets);
      check_join({2, 2, 1}, divide_by_active, buckets);
    }
  }
}

// The first pass held back (backward_passes_per_step = 2) makes the first check of the gradients,
// which a rank that joined with no batches makes with it (it once met that rank's agreement on who
// trains: every rank raised "the dtype differs across ranks (i64/u8)").
TEST_CASE("join: with backward passes held back, a rank without batches joins before the first check") {
  for (bool buckets : {false, true}) {
    for (bool divide_by_active : {false, true}) {
      check_join({3, 0}, divide_by_active, buckets, 2);
      check_join({4, 2, 0}, divide_by_active, buckets, 2);
      check_join({2, 2, 1}, divide_by_active, buckets, 2);
    }
  }
}

TEST_CASE("join: needs uneven_inputs") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    herd_test::tiny_mlp model(5, 7, 2, 3);
    auto sgd = herd::sgd(model.params(), model.grads(), {.lr = 0.1});
    herd::distributed_optimizer plain(sgd, model.grads(), comm);
    CHECK_THROWS_WITH_AS(plain.join(), doctest::Contains("needs optimizer_options::uneven_inputs"), herd::error);
  });
}

// A rank that joined and cannot read its gradients (its source raises) in a round the others reduce
// in buckets: every rank raises, the others naming it; in the first round its first check carries
// it, later its buckets do. The joined rank once finished a pass it had not opened, with the last
// one's state, and its buckets went out of step with the others'.
TEST_CASE("join: a joined rank whose gradients cannot be read raises on every rank, with buckets") {
  for (const int fail_from : {0, 1}) {
    std::atomic<int> round{0};
    herd::local::run(3, [&](herd::local_communicator& comm) {
      herd_test::tiny_mlp model(5, 7, 2, 3);
      auto sgd = herd::sgd(model.params(), model.grads(), {.lr = 0.1});
      const bool joined = comm.rank() == 2;
      auto source = [&] {
        if (joined && round.load() >= fail_from) throw std::runtime_error("the joined rank's gradients are gone");
        return model.grads();
      };
      herd::optimizer_options options{.uneven_inputs = true};
      options.bucket_bytes = 100;  // several buckets
      options.first_bucket_bytes = 60;
      herd::distributed_optimizer opt(sgd, source, comm, options);
      const herd_test::regression_data data(64, 5, 2, 17);
      std::string message = "(no error)";
      if (joined) {
        message = herd_test::error_of([&] { opt.join(); });
      } else {
        message = herd_test::error_of([&] {
          for (int k = 0; k < 3; ++k) {
            if (comm.rank() == 0) round = k;
            model.forward_backward(data, static_cast<std::size_t>(8 * k), static_cast<std::size_t>(8 * k + 4));
            for (std::size_t i = 4; i-- > 0;) opt.mark_ready(i);
            opt.step();
          }
        });
      }
      INFO("rank ", comm.rank(), ", failing from round ", fail_from, ": ", message);
      CHECK(herd_test::has(message, joined ? "the joined rank's gradients are gone" : "rank 2"));
    });
  }
}
