// The distributed optimizer's buckets (mark_ready) on threads: the plan DDP would make, results
// bitwise equal to the reduction without overlap, the rebuild from rank 0's ready order, gradients
// marked in different orders on different ranks, unused gradients both ways, no_sync, and errors
// found in a bucket reaching step() on every rank.

#include <herd/herd.hpp>

#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <mutex>
#include <string>
#include <vector>

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct counting_optimizer {
  int steps = 0;
  void step() { ++steps; }
};

// Five gradients of f32 (sizes chosen so that small caps make several buckets).
struct model {
  std::vector<std::vector<float>> grads;
  explicit model(int rank, int seed = 0) {
    for (std::size_t n : std::vector<std::size_t>{700, 30, 2000, 5, 300}) grads.emplace_back(n);
    refill(rank, seed);
  }
  // New values in the same memory (the optimizer holds views of it).
  void refill(int rank, int seed) {
    herd_test::rng g(static_cast<std::uint64_t>(100 * seed + rank + 1));
    for (auto& v : grads) {
      for (auto& x : v) x = static_cast<float>(g.unit() * 2 - 1);
    }
  }
  std::vector<herd::buffer_view> views() {
    std::vector<herd::buffer_view> out;
    for (auto& g : grads) out.push_back(herd::view_of(g));
    return out;
  }
};

herd::optimizer_options small_buckets() {
  herd::optimizer_options o;
  o.first_bucket_bytes = 1000;
  o.bucket_bytes = 4000;
  return o;
}

// Runs `body` on every rank of a p-rank world and returns each rank's error message ("" if none).
template <class Body> std::vector<std::string> errors_per_rank(int p, Body body) {
  std::vector<std::string> messages(static_cast<std::size_t>(p));
  herd::local::run(p, [&](herd::local_communicator& comm) {
    try {
      body(comm);
    } catch (const herd::error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  return messages;
}

}  // namespace

TEST_CASE("bucket plan: reverse order, the first bucket small, a cap for the rest, dtypes apart, large gradients alone") {
  using herd::dtype;
  const std::vector<std::pair<std::size_t, dtype>> shapes = {
      {100, dtype::f32}, {300, dtype::f32}, {10, dtype::f64}, {1000, dtype::f32}, {50, dtype::f32}, {20, dtype::f64}};
  const auto plan = herd::detail::bucket_plan::make(shapes, herd::detail::bucket_plan::reverse_order(6), 256, 2000);
  // Reverse order: 5 (f64, 160 B) opens the first f64 bucket; 4 (f32, 200 B) the first f32 bucket,
  // which 3 (4000 B) closes past its 256 B; 2 (f64) joins the f64 bucket (240 B: still open); 1 and
  // 0 fill a new f32 bucket (1600 B, under the 2000 B cap).
  REQUIRE(plan.buckets.size() == 3);
  CHECK(plan.buckets[0].members == std::vector<std::size_t>{5, 2});
  CHECK(plan.buckets[1].members == std::vector<std::size_t>{4, 3});
  CHECK(plan.buckets[2].members == std::vector<std::size_t>{1, 0});
  CHECK(plan.buckets[1].offsets == std::vector<std::size_t>{0, 50});
  CHECK(plan.buckets[1].count == 1050);
  CHECK(plan.bucket_of[3] == 1);
  CHECK(plan.slot_of[0] == 1);
}

TEST_CASE("overlapped buckets give the bits of the reduction without overlap, whatever order each rank marks in") {
  for (int p : {2, 3}) {
    std::vector<std::vector<std::vector<float>>> overlapped(static_cast<std::size_t>(p)), blocking(overlapped);
    std::mutex lock;
    herd::local::run(p, [&](herd::local_communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      // Overlapped: each rank marks in its own order, one gradient at a time, computing between.
      model a(comm.rank());
      counting_optimizer inner_a;
      herd::distributed_optimizer opt_a(inner_a, a.views(), comm, small_buckets());
      // Blocking: the same buckets, every gradient marked just before step().
      model b(comm.rank());
      counting_optimizer inner_b;
      herd::distributed_optimizer opt_b(inner_b, b.views(), comm, small_buckets());
      const std::vector<std::size_t> orders[] = {{4, 3, 2, 1, 0}, {0, 2, 4, 1, 3}, {3, 4, 0, 2, 1}};
      for (int step = 0; step < 3; ++step) {
        a.refill(comm.rank(), step);
        b.refill(comm.rank(), step);
        for (std::size_t i : orders[(r + static_cast<std::size_t>(step)) % 3]) opt_a.mark_ready(i);
        opt_a.step();
        for (std::size_t i = 5; i-- > 0;) opt_b.mark_ready(i);
        opt_b.step();
        // Rebuilt once, from rank 0's first order: every rank holds the same plan.
        CHECK(opt_a.buckets() == opt_b.buckets());
      }
      std::lock_guard guard(lock);
      overlapped[r] = a.grads;
      blocking[r] = b.grads;
    });
    for (int r = 0; r < p; ++r) {
      CHECK(overlapped[static_cast<std::size_t>(r)] == blocking[static_cast<std::size_t>(r)]);
      CHECK(overlapped[static_cast<std::size_t>(r)] == overlapped[0]);
    }
    // And the values are the average over ranks.
    std::vector<float> mean(2000, 0.0f);
    for (int r = 0; r < p; ++r) {
      const auto g = model(r, 2).grads[2];
      for (std::size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
    }
    for (std::size_t i = 0; i < mean.size(); i += 97) CHECK(overlapped[0][2][i] == doctest::Approx(mean[i] / static_cast<float>(p)));
  }
}

TEST_CASE("without overlap and with it, integer-valued gradients reduce to the same bits") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    std::vector<float> x(5000), y(77);
    auto fill = [&] {
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 17) - 8 + comm.rank());
      for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(comm.rank() * 3 - static_cast<int>(i));
    };
    counting_optimizer inner;
    herd::distributed_optimizer plain(inner, herd::views(x, y), comm, {.op = herd::reduce_op::sum});
    fill();
    plain.step();
    const std::vector<float> x1 = x, y1 = y;
    herd::distributed_optimizer buckets(inner, herd::views(x, y), comm, {.op = herd::reduce_op::sum, .bucket_bytes = 1000, .first_bucket_bytes = 100});
    fill();
    buckets.mark_ready(1);
    buckets.mark_ready(0);
    buckets.step();
    CHECK(x == x1);
    CHECK(y == y1);
  });
}

TEST_CASE("the buckets are rebuilt once, in the order rank 0 saw its gradients become ready") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    model m(comm.rank());
    counting_optimizer inner;
    herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
    const std::vector<std::size_t> first = comm.rank() == 0 ? std::vector<std::size_t>{1, 0, 4, 2, 3}
                                                            : std::vector<std::size_t>{3, 2, 4, 0, 1};
    for (std::size_t i : first) opt.mark_ready(i);
    const auto before = opt.buckets();
    opt.step();
    // From rank 0's order 1, 0, 4, 2, 3: 1 (120 B) + 0 (2800 B) closes the first bucket (1000 B);
    // 4 (1200 B) + 2 (8000 B) closes the next (4000 B); 3 alone.
    const std::vector<std::vector<std::size_t>> rebuilt = {{1, 0}, {4, 2}, {3}};
    CHECK(opt.buckets() == rebuilt);
    CHECK(before != rebuilt);
    for (std::size_t i : std::vector<std::size_t>{2, 4, 0, 1, 3}) opt.mark_ready(i);
    opt.step();
    CHECK(opt.buckets() == rebuilt);  // only once
  });
}

TEST_CASE("a gradient never marked ready: an error on every rank naming it, and the communicator goes on") {
  const auto messages = errors_per_rank(3, [](herd::local_communicator& comm) {
    model m(comm.rank());
    counting_optimizer inner;
    herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
    for (std::size_t i : std::vector<std::size_t>{4, 3, 2, 1, 0}) {
      if (!(comm.rank() == 1 && i == 2)) opt.mark_ready(i);
    }
    try {
      opt.step();
    } catch (const herd::error&) {
      CHECK(inner.steps == 0);
      std::vector<float> v(10, 1.0f);
      herd::allreduce(v, comm);  // still usable: the error was agreed
      CHECK(v[0] == 3.0f);
      throw;
    }
  });
  CHECK(has(messages[1], "gradient(s) 2 were not marked ready in this backward pass"));
  CHECK(has(messages[1], "find_unused_parameters"));
  CHECK(has(messages[0], "rank 1 passed gradients it did not mark ready in this backward pass"));
  CHECK(has(messages[2], "rank 1 passed gradients it did not mark ready"));
}

TEST_CASE("find_unused_parameters: a gradient one rank did not produce counts as zeros there") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> used(100), unused(50);
    counting_optimizer inner;
    herd::optimizer_options o;
    o.find_unused_parameters = true;
    herd::distributed_optimizer opt(inner, herd::views(used, unused), comm, o);
    std::fill(used.begin(), used.end(), 2.0f + static_cast<float>(comm.rank()));
    std::fill(unused.begin(), unused.end(), comm.rank() == 0 ? 8.0f : -999.0f);  // rank 1 leaves garbage
    opt.mark_ready(0);
    if (comm.rank() == 0) opt.mark_ready(1);
    opt.step();
    CHECK(used[7] == 2.5f);
    CHECK(unused[7] == 4.0f);  // (8 + 0) / 2 on every rank
    CHECK(inner.steps == 1);
  });
}

TEST_CASE("no_sync: steps under the guard accumulate; the next step reduces the sum of every pass") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> g(300);
    counting_optimizer inner;
    herd::distributed_optimizer opt(inner, herd::views(g), comm, small_buckets());
    const float r = static_cast<float>(comm.rank());
    {
      auto guard = opt.no_sync();
      for (int pass = 0; pass < 2; ++pass) {
        std::fill(g.begin(), g.end(), r + static_cast<float>(pass));
        opt.mark_ready(0);  // does nothing in a pass that only accumulates
        CHECK_FALSE(opt.step());
      }
    }
    CHECK(inner.steps == 0);
    CHECK(opt.accumulated_passes() == 2);
    std::fill(g.begin(), g.end(), 10.0f);
    opt.mark_ready(0);
    CHECK(opt.step());
    // Passes (r, r + 1, 10) summed: 2r + 11, then averaged over r = 0, 1: 12.
    CHECK(g[0] == 12.0f);
    CHECK(inner.steps == 1);
    CHECK(opt.accumulated_passes() == 0);
  });
}

TEST_CASE("a gradient that changed, found when it is marked, reaches step() on every rank") {
  const auto messages = errors_per_rank(2, [](herd::local_communicator& comm) {
    model m(comm.rank());
    counting_optimizer inner;
    herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
    for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
    opt.step();
    std::vector<float> wrong(123);
    for (std::size_t i = 5; i-- > 0;) {
      if (comm.rank() == 1 && i == 0) opt.mark_ready(0, herd::view_of(wrong));
      else opt.mark_ready(i);
    }
    opt.step();
  });
  CHECK(has(messages[1], "gradient 0 changed since the first step (123 f32 instead of 700 f32)"));
  CHECK(has(messages[0], "rank 1 passed gradients that differ from those of the first step"));
}
