// The loss scaler and f32 master weights (optim/mixed_precision.hpp) under the distributed
// optimizer: an overflow on one rank makes every rank skip that step and back the scale off; clean
// steps grow it after the interval; the masters keep what f16 cannot and round into the
// parameters; all of it equal on every rank.

#include <herd/herd.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

bool same(const std::vector<herd::half>& a, const std::vector<herd::half>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(herd::half)) == 0;
}

bool same(const std::vector<std::vector<herd::half>>& a, const std::vector<std::vector<herd::half>>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return a.size() == b.size();
}

std::vector<herd::buffer_view> views_of(std::vector<std::vector<herd::half>>& ts) {
  std::vector<herd::buffer_view> v;
  for (auto& t : ts) v.push_back(herd::view_of(t));
  return v;
}

}  // namespace

TEST_CASE("loss_scaler: backs off on an overflow, grows after the interval of clean steps") {
  herd::loss_scaler scaler({.initial_scale = 8, .growth_interval = 3});
  CHECK(scaler.scale() == 8);
  scaler.update(false);
  scaler.update(false);
  CHECK(scaler.scale() == 8);
  scaler.update(false);
  CHECK(scaler.scale() == 16);
  scaler.update(false);
  scaler.update(true);  // the clean run starts again
  CHECK(scaler.scale() == 8);
  CHECK(scaler.skipped_steps() == 1);
  scaler.update(false);
  scaler.update(false);
  CHECK(scaler.scale() == 8);
  scaler.update(false);
  CHECK(scaler.scale() == 16);
  CHECK(herd::loss_scaler().scale() == 65536);
  CHECK_THROWS_AS(herd::loss_scaler({.backoff_factor = 1.5}), herd::error);
}

TEST_CASE("an overflow on one rank skips that step on every rank and halves the scale") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    std::vector<std::vector<herd::half>> params = {std::vector<herd::half>(40, herd::half(0.5f)),
                                                   std::vector<herd::half>(7, herd::half(-0.25f))};
    std::vector<std::vector<herd::half>> grads = {std::vector<herd::half>(40), std::vector<herd::half>(7)};
    herd::loss_scaler scaler({.initial_scale = 1024, .growth_interval = 4});
    herd::mixed_precision amp(views_of(params), views_of(grads), scaler, [](auto p, auto g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = 1.0, .momentum = 0.9});
    });
    herd::distributed_optimizer opt(amp, views_of(grads), comm);
    const std::vector<double> expected_scale = {1024, 512, 512, 512, 512, 1024, 1024, 1024};
    for (int step = 0; step < 8; ++step) {
      // Scaled gradients, as a backward pass from loss * scale would give.
      for (auto& t : grads)
        for (std::size_t i = 0; i < t.size(); ++i)
          t[i] = herd::half(static_cast<float>(static_cast<std::size_t>(comm.rank() + 1) * (i % 5 + 1)) * 1e-3f *
                           static_cast<float>(scaler.scale()));
      if (step == 1 && comm.rank() == 1) grads[1][3] = herd::half(std::numeric_limits<float>::infinity());
      const auto before = params;
      opt.step();
      INFO("rank ", comm.rank(), " step ", step);
      CHECK(amp.last_step_skipped() == (step == 1));
      CHECK(scaler.scale() == expected_scale[static_cast<std::size_t>(step)]);
      CHECK(same(params, before) == (step == 1));
      // The same parameters on every rank.
      std::vector<herd::half> mine = params[0], first = params[0];
      herd::broadcast(first, comm, 0);
      CHECK(same(first, mine));
    }
    CHECK(scaler.skipped_steps() == 1);
  });
}

TEST_CASE("f32 masters keep the updates f16 cannot hold, equal an f32 optimizer, and round into the parameters") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<std::vector<herd::half>> params = {std::vector<herd::half>(16, herd::half(1.0f))};
    std::vector<std::vector<herd::half>> grads = {std::vector<herd::half>(16)};
    std::vector<float> reference_param(16, 1.0f), reference_grad(16);
    herd::loss_scaler scaler({.initial_scale = 256});
    herd::mixed_precision amp(views_of(params), views_of(grads), scaler,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); });
    herd::distributed_optimizer opt(amp, views_of(grads), comm);
    herd::sgd reference({herd::view_of(reference_param)}, {herd::view_of(reference_grad)}, {.lr = 1.0});
    for (int step = 0; step < 10; ++step) {
      for (std::size_t i = 0; i < 16; ++i) {
        const float g = 1e-4f * static_cast<float>(i + 1);  // far below f16's step at 1.0 (2^-11) for small i
        grads[0][i] = herd::half(g * static_cast<float>(scaler.scale()));
        reference_grad[i] = static_cast<float>(herd::half(g * 256.0f)) / 256.0f;  // what the f16 gradient carries
      }
      opt.step();
      reference.step();
    }
    const auto* master = static_cast<const float*>(amp.master_params()[0].data);
    for (std::size_t i = 0; i < 16; ++i) {
      INFO("element ", i);
      CHECK(std::abs(master[i] - reference_param[i]) <= 1e-6);
      const herd::half rounded(master[i]);
      CHECK(std::memcmp(&params[0][i], &rounded, sizeof rounded) == 0);
    }
    CHECK(master[0] < 0.9991f);  // ten updates of 1e-4 accumulated, which f16 alone would have rounded away
    std::size_t state = 0;
    herd::visit_optimizer_state(amp, [&](const auto& name, herd::buffer_view v) {
      state += v.bytes();
      if (name == "scaler.scale") CHECK(*static_cast<const double*>(v.data) == 256);
    });
    CHECK(state == 16 * 4 + 8 + 8 + 8 + 8);  // master, sgd's step count, the scaler's scale and counters
  });
}

TEST_CASE("masters follow broadcast_parameters after construction: every rank steps from rank 0's weights") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    // Each rank starts from its own weights, as each would from its own random initialization.
    std::vector<std::vector<herd::half>> params = {std::vector<herd::half>(9, herd::half(0.5f * static_cast<float>(comm.rank() + 1)))};
    std::vector<std::vector<herd::half>> grads = {std::vector<herd::half>(9, herd::half(64.0f))};
    herd::loss_scaler scaler({.initial_scale = 256});
    herd::mixed_precision amp(views_of(params), views_of(grads), scaler,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 0.5}); });
    herd::distributed_optimizer opt(amp, views_of(grads), comm);
    herd::broadcast_parameters(views_of(params), comm, 0);  // the README's order: after building the optimizers
    opt.step();
    INFO("rank ", comm.rank());
    // 0.5 - 0.5 * 64 / 256 on every rank: rank 1's construction-time master (1.0) is not used.
    for (const herd::half& p : params[0]) CHECK(static_cast<float>(p) == 0.375f);
  });
}

TEST_CASE("loss_scaler stops growing at max_scale, 2^24 by default as apex's") {
  herd::loss_scaler scaler({.initial_scale = 4194304.0, .growth_interval = 1});  // 2^22
  for (int i = 0; i < 5; ++i) scaler.update(false);
  CHECK(scaler.scale() == 16777216.0);
  scaler.update(true);
  CHECK(scaler.scale() == 8388608.0);
  herd::loss_scaler uncapped({.initial_scale = 4194304.0, .growth_interval = 1, .max_scale = INFINITY});
  for (int i = 0; i < 5; ++i) uncapped.update(false);
  CHECK(uncapped.scale() == 134217728.0);
  CHECK_THROWS_AS(herd::loss_scaler({.initial_scale = 1e9}), herd::error);  // above the default cap
}

TEST_CASE("unscale() then clipping the master gradients: step() steps with the clipped gradients, unscaled once") {
  std::vector<std::vector<herd::half>> params = {std::vector<herd::half>(4, herd::half(0.0f))};
  std::vector<std::vector<herd::half>> grads = {{herd::half(3 * 8.0f), herd::half(4 * 8.0f), herd::half(0.0f), herd::half(0.0f)}};
  herd::loss_scaler scaler({.initial_scale = 8});
  herd::mixed_precision amp(views_of(params), views_of(grads), scaler,
                            [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); });
  CHECK_FALSE(amp.unscale());
  CHECK(herd::clip_grad_norm(amp.master_grads(), 1.0) == doctest::Approx(5.0));
  amp.step();
  CHECK(static_cast<float>(params[0][0]) == doctest::Approx(-0.6).epsilon(1e-3));  // -3/5, not -3 or -3/40
  CHECK(static_cast<float>(params[0][1]) == doctest::Approx(-0.8).epsilon(1e-3));
  CHECK(scaler.scale() == 8);
}

// The casts and the masters' refresh between f16 and f32 take core/detail/f16c.hpp, 8 at a time,
// on a CPU with F16C: the same bits as their portable formulas (the product in double, rounded
// once; a master read again where it no longer rounds to its parameter), over every f16 pattern
// and a stride of every f32 pattern, with lengths that leave a remainder.
TEST_CASE("f16 <-> f32 casts and the masters' refresh: the portable formulas' bits, F16C or not") {
  using herd::half;
  const std::size_t n = 0x10000 + 3;
  std::vector<half> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = half::from_bits(static_cast<std::uint16_t>(i));
  for (double scale : {1.0, 1.0 / 65536, 3.0, 1.0 / 3, 1e-30, 1e30}) {
    std::vector<float> got(n);
    herd::detail::host_cast(got.data(), herd::dtype::f32, h.data(), herd::dtype::f16, n, scale);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = static_cast<float>(static_cast<double>(static_cast<float>(h[i])) * scale);
      wrong += std::memcmp(&got[i], &want, sizeof want) != 0;
    }
    INFO("f16 -> f32, scale ", scale);
    CHECK(wrong == 0);
  }
  // f32 -> f16: every 4099th f32 pattern (4099 is odd, so every low-bit residue, every rounding case)
  std::vector<float> f;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099) {
    const auto bits = static_cast<std::uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, sizeof x);
    f.push_back(x);
  }
  for (const float x : {0x1.ffcp15f, 0x1.ffep15f, 0x1.0p-24f, 0x1.8p-25f, 0x1.0p-25f, 0x1.004p-14f}) f.push_back(x);
  std::vector<half> narrowed(f.size());
  herd::detail::host_cast(narrowed.data(), herd::dtype::f16, f.data(), herd::dtype::f32, f.size(), 1.0);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < f.size(); ++i) wrong += narrowed[i].bits != half(f[i]).bits;
  CHECK(wrong == 0);
  // The refresh: masters that round to their parameters stay; the others (every 1000th, and a
  // run of them at the end) are read again from the parameters.
  std::vector<float> master(n), want(n);
  std::vector<half> param(n);
  for (std::size_t i = 0; i < n; ++i) {
    master[i] = static_cast<float>(i % 4000) * 0.37f - 700.0f;
    param[i] = half(master[i]);
    if (i % 1000 == 7 || i + 5 > n) param[i] = half(master[i] + 16.0f);
    want[i] = half(master[i]).bits == param[i].bits ? master[i] : static_cast<float>(param[i]);
  }
  herd::detail::refresh_masters(master.data(), param.data(), herd::dtype::f16, n);
  CHECK(std::memcmp(master.data(), want.data(), n * sizeof(float)) == 0);
}
