// ZeRO-1 (zero_optimizer) against the unsharded distributed optimizer wrapping the same optimizer:
// the same parameters after several steps (within 1e-6), at 1-4 ranks, with parameter counts
// that W does not divide and shards that are empty; each rank keeping only its shard's state.

#include <herd/herd.hpp>

#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <vector>

namespace {

// Three parameter tensors of the given sizes, seeded alike on every rank.
struct model {
  std::vector<std::vector<float>> params, grads;
  explicit model(const std::vector<std::size_t>& sizes) {
    herd_test::rng g(42);
    for (std::size_t n : sizes) {
      params.emplace_back(n);
      grads.emplace_back(n);
      for (auto& x : params.back()) x = static_cast<float>(g.unit() - 0.5);
    }
  }
  std::vector<herd::buffer_view> param_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : params) v.push_back(herd::view_of(p));
    return v;
  }
  std::vector<herd::buffer_view> grad_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : grads) v.push_back(herd::view_of(p));
    return v;
  }
  // Gradients of step s on rank r: different on every rank and step.
  void fill_grads(int rank, int step) {
    herd_test::rng g(1000 * static_cast<std::uint64_t>(rank) + static_cast<std::uint64_t>(step));
    for (auto& t : grads)
      for (auto& x : t) x = static_cast<float>(g.unit() - 0.5);
  }
};

double largest_difference(const model& a, const model& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    for (std::size_t j = 0; j < a.params[i].size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(a.params[i][j]) - b.params[i][j]));
  return worst;
}

std::size_t state_bytes(auto& opt) {
  std::size_t bytes = 0;
  herd::visit_optimizer_state(opt, [&](const auto&, herd::buffer_view v) { bytes += v.bytes(); });
  return bytes;
}

template <class MakeInner> void compare_with_unsharded(int ranks, const std::vector<std::size_t>& sizes, MakeInner make_inner,
                                                        herd::compression wire = herd::compression::none) {
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    model sharded(sizes), plain(sizes);
    herd::zero_optimizer zero(sharded.param_views(), sharded.grad_views(), comm, make_inner, {.wire = wire});
    auto inner = make_inner(plain.param_views(), plain.grad_views());
    herd::distributed_optimizer reference(inner, plain.grad_views(), comm, {.compression = wire});
    for (int step = 0; step < 5; ++step) {
      sharded.fill_grads(comm.rank(), step);
      plain.fill_grads(comm.rank(), step);
      zero.step();
      reference.step();
    }
    const double tolerance = wire == herd::compression::none ? 1e-6 : 1e-3;
    INFO("rank ", comm.rank(), " of ", ranks, " shard [", zero.shard().begin, ", ", zero.shard().end, ")");
    CHECK(largest_difference(sharded, plain) <= tolerance);
    // Every rank ends with the same parameters, bit for bit.
    std::vector<float> mine;
    for (auto& p : sharded.params) mine.insert(mine.end(), p.begin(), p.end());
    std::vector<float> first = mine;
    herd::broadcast(first, comm, 0);
    CHECK(first == mine);
  });
}

}  // namespace

TEST_CASE("zero_optimizer with SGD and momentum equals the unsharded optimizer at 1-4 ranks") {
  auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  };
  for (int ranks = 1; ranks <= 4; ++ranks) {
    compare_with_unsharded(ranks, {37, 1, 251}, make);  // 289 elements: no W of 2-4 divides it
    compare_with_unsharded(ranks, {5, 3}, make);        // 8 elements; at 3 ranks shards of 3, 3, 2
    compare_with_unsharded(ranks, {2}, make);           // fewer elements than ranks: empty shards
  }
}

TEST_CASE("zero_optimizer with AdamW equals the unsharded optimizer, also with fp16 on the wire") {
  auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::adamw(std::move(p), std::move(g), {.lr = 0.01, .weight_decay = 0.1});
  };
  for (int ranks = 1; ranks <= 4; ++ranks) compare_with_unsharded(ranks, {101, 7, 33}, make);
  compare_with_unsharded(3, {101, 7, 33}, make, herd::compression::fp16);
}

TEST_CASE("zero_optimizer keeps only its shard's state, and refuses a checkpoint of another layout") {
  const std::vector<std::size_t> sizes = {1000, 24};  // 1024 elements
  herd::local::run(4, [&](herd::local_communicator& comm) {
    model m(sizes);
    auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g));
    };
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make);
    auto whole = make(m.param_views(), m.grad_views());
    // adamw: two f32 moments per element and a step count; the shard adds its layout (3 x i64).
    CHECK(zero.shard().count() == 256);
    CHECK(state_bytes(zero) == 256 * 8 + 8 + 24);
    CHECK(state_bytes(whole) == 1024 * 8 + 8);

    m.fill_grads(comm.rank(), 0);
    zero.step();
    const auto dir = std::filesystem::temp_directory_path() / ("herd_zero_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto mine = dir / ("shard" + std::to_string(comm.rank()));
    herd::checkpoint saved;
    saved.add_optimizer_state("opt.", zero);
    saved.save(mine);
    // Each rank's own file restores; rank 1 loading rank 2's makes the next step raise on every rank.
    herd::checkpoint restored;
    restored.add_optimizer_state("opt.", zero);
    herd::barrier(comm);
    CHECK(restored.load(mine));
    CHECK_NOTHROW(zero.step());
    herd::barrier(comm);
    CHECK(restored.load(comm.rank() == 1 ? dir / "shard2" : mine));
    const char* expected = comm.rank() == 1 ? "loaded from a shard of rank 2 of 4 ranks" : "rank 1 passed optimizer state of another shard layout";
    CHECK_THROWS_WITH_AS(zero.step(), doctest::Contains(expected), herd::error);
    if (comm.rank() == 0) std::filesystem::remove_all(dir);
  });
}

TEST_CASE("zero_optimizer with fp16 on the wire divides before the sum: two ranks averaging 40000 get 40000, not inf") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> param(4, 0.0f), grad(4, 40000.0f);  // the f16 sum, 80000, is past f16's 65504
    herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); },
                              {.wire = herd::compression::fp16});
    zero.step();
    INFO("rank ", comm.rank());
    for (float p : param) CHECK(p == -40000.0f);
  });
}

TEST_CASE("zero_optimizer with max_grad_norm clips by the norm of the whole, as the unsharded optimizer after clip_grad_norm") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  for (int ranks : {1, 3}) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
        return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9});
      };
      model sharded(sizes), plain(sizes);
      herd::zero_optimizer zero(sharded.param_views(), sharded.grad_views(), comm, make, {.max_grad_norm = 0.5});
      auto inner = make(plain.param_views(), plain.grad_views());
      herd::distributed_optimizer reference(inner, plain.grad_views(), comm);
      for (int step = 0; step < 4; ++step) {
        sharded.fill_grads(comm.rank(), step);
        plain.fill_grads(comm.rank(), step);
        zero.step();
        reference.synchronize();
        const double norm = herd::clip_grad_norm(plain.grad_views(), 0.5);
        reference.step();
        INFO("rank ", comm.rank(), " of ", ranks, ", step ", step);
        CHECK(zero.grad_norm() == doctest::Approx(norm).epsilon(1e-6));
        CHECK(norm > 0.5);  // the clipping acts
      }
      CHECK(largest_difference(sharded, plain) <= 1e-6);
    });
  }
}
