// The optimizer layer on local_communicator: the reference optimizers against their formulas,
// the distributed optimizer's semantics (averaging, predivision, accumulation, synchronize and
// skip_synchronize, fusion with mixed dtypes, compression tolerances), its cross-rank checks,
// broadcasts, metrics and the learning-rate schedule.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/reference.hpp"
#include "../support/tiny_mlp.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>

#include <cmath>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using herd_test::has;

namespace {

// An inner optimizer that records the gradients it was stepped with.
struct recorder {
  std::vector<herd::buffer_view> grads;
  std::vector<std::vector<double>> seen;
  int steps = 0;
  void step() {
    ++steps;
    seen.clear();
    for (const auto& g : grads) {
      std::vector<double> values(g.count);
      herd::visit(g.type, [&](auto e) {
        using T = decltype(e);
        for (std::size_t i = 0; i < g.count; ++i) values[i] = herd::detail::to_double(static_cast<const T*>(g.data)[i]);
      });
      seen.push_back(values);
    }
  }
};

}  // namespace

TEST_CASE("sgd follows torch.optim.SGD: weight decay, momentum (cloned on the first step), dampening, Nesterov") {
  for (bool nesterov : {false, true}) {
    const double lr = 0.1, m = 0.9, wd = 0.01, damp = nesterov ? 0.0 : 0.25;
    std::vector<double> p = {1.0, -2.0}, g = {0.5, 0.25};
    herd::sgd opt(herd::views(p), herd::views(g), {.lr = lr, .momentum = m, .dampening = damp, .nesterov = nesterov, .weight_decay = wd});
    double ref_p[2] = {1.0, -2.0}, buf[2] = {0, 0};
    for (int step = 0; step < 3; ++step) {
      g = {0.5 + step, 0.25 - step};
      opt.step();
      for (int j = 0; j < 2; ++j) {
        double d = g[static_cast<std::size_t>(j)] + wd * ref_p[j];
        buf[j] = step == 0 ? d : m * buf[j] + (1 - damp) * d;
        d = nesterov ? d + m * buf[j] : buf[j];
        ref_p[j] -= lr * d;
      }
      CHECK(p[0] == doctest::Approx(ref_p[0]).epsilon(1e-12));
      CHECK(p[1] == doctest::Approx(ref_p[1]).epsilon(1e-12));
    }
  }
}

TEST_CASE("adamw follows torch.optim.AdamW") {
  std::vector<double> p = {1.0, -0.5, 0.0}, g(3);
  const herd::adamw_options o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  herd::adamw opt(herd::views(p), herd::views(g), o);
  double ref[3] = {1.0, -0.5, 0.0}, m[3] = {}, v[3] = {};
  for (int t = 1; t <= 4; ++t) {
    g = {0.1 * t, -0.2, 0.3 / t};
    opt.step();
    for (int j = 0; j < 3; ++j) {
      const double gj = g[static_cast<std::size_t>(j)];
      ref[j] *= 1 - o.lr * o.weight_decay;
      m[j] = o.beta1 * m[j] + (1 - o.beta1) * gj;
      v[j] = o.beta2 * v[j] + (1 - o.beta2) * gj * gj;
      const double step_size = o.lr / (1 - std::pow(o.beta1, t));
      ref[j] -= step_size * m[j] / (std::sqrt(v[j]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps);
      CHECK(p[static_cast<std::size_t>(j)] == doctest::Approx(ref[j]).epsilon(1e-12));
    }
  }
  CHECK(opt.steps() == 4);
}

TEST_CASE("adamw's first moment: lerp as PyTorch 2.1+ (the default), mul and add as PyTorch 1.13") {
  // One f32 step from m = 0.3 (the state after a first step with g = 3): at::lerp's arithmetic,
  // m + w * (g - m) for w = 1 - beta1 < 0.5, against beta1 * m + (1 - beta1) * g.
  const float b1 = 0.9f, w = static_cast<float>(1 - 0.9);
  int differ = 0;
  for (float g : {0.7f, -1.3f, 2.9f, 1e-3f, 5.5f, -0.01f, 0.33f, 7.25f}) {
    const auto moment_after = [&](herd::adamw_first_moment formula) {
      std::vector<float> p = {0.0f}, grad = {3.0f};
      herd::adamw opt(herd::views(p), herd::views(grad), {.first_moment = formula});
      opt.step();
      grad[0] = g;
      opt.step();
      float m = 0;
      opt.visit_state([&](const std::string& name, const herd::buffer_view& v) {
        if (name == "exp_avg.0") m = *static_cast<const float*>(v.data);
      });
      return m;
    };
    const float first = w * 3.0f;  // both formulas from m = 0
    CHECK(moment_after(herd::adamw_first_moment::lerp) == first + w * (g - first));
    CHECK(moment_after(herd::adamw_first_moment::mul_add) == b1 * first + w * g);
    differ += moment_after(herd::adamw_first_moment::lerp) != moment_after(herd::adamw_first_moment::mul_add);
  }
  CHECK(differ > 0);  // the two round differently somewhere, or this test would not tell them apart
  CHECK(herd::adamw_options{}.first_moment == herd::adamw_first_moment::lerp);
}

TEST_CASE("the reference optimizers take f16, bf16 and f32 parameters too, and reject bad lists") {
  std::vector<herd::half> ph(4, herd::half(1.0f)), gh(4, herd::half(0.5f));
  std::vector<float> pf(4, 1.0f), gf(4, 0.5f);
  herd::sgd opt(herd::views(ph, pf), herd::views(gh, gf), {.lr = 0.5});
  opt.step();
  CHECK(static_cast<float>(ph[3]) == 0.75f);
  CHECK(pf[3] == 0.75f);
  std::vector<int> pi(2), gi(2);
  CHECK_THROWS_WITH_AS(herd::sgd(herd::views(pi), herd::views(gi)), doctest::Contains("floating-point"), herd::error);
  CHECK_THROWS_WITH_AS(herd::sgd(herd::views(pf), herd::views(gf, gf)), doctest::Contains("1 parameters but 2 gradients"), herd::error);
  std::vector<float> short_grad(3);
  CHECK_THROWS_WITH_AS(herd::adamw(herd::views(pf), herd::views(short_grad)), doctest::Contains("differ"), herd::error);
}

TEST_CASE("gradients are averaged or summed over ranks, with predivision, across mixed dtypes and fusion thresholds") {
  for (std::size_t threshold : {std::size_t{0}, std::size_t{12}, std::size_t{1} << 20}) {
    for (auto op : {herd::reduce_op::avg, herd::reduce_op::sum}) {
      for (double predivide : {1.0, 4.0}) {
        if (op == herd::reduce_op::sum && predivide != 1.0) continue;
        herd::local::run(3, [&](herd::local_communicator& comm) {
          const double r = comm.rank();
          std::vector<float> a = {float(r), float(2 * r), 1.0f};
          std::vector<double> b = {r + 0.5};
          std::vector<herd::half> c = {herd::half(float(r)), herd::half(4.0f)};
          std::vector<float> d(100, float(r));
          recorder inner;
          inner.grads = herd::views(a, b, c, d);
          herd::distributed_optimizer opt(inner, herd::views(a, b, c, d), comm,
                                          {.op = op, .gradient_predivide_factor = predivide, .fusion_threshold_bytes = threshold});
          CHECK(opt.step());
          const double k = op == herd::reduce_op::avg ? 1.0 / 3 : 1.0;  // ranks 0, 1, 2: sum of r is 3
          CHECK(inner.seen[0][0] == doctest::Approx(3 * k));
          CHECK(inner.seen[0][1] == doctest::Approx(6 * k));
          CHECK(inner.seen[0][2] == doctest::Approx(3 * k));
          CHECK(inner.seen[1][0] == doctest::Approx((3 + 1.5) * k));
          CHECK(inner.seen[2][0] == doctest::Approx(3 * k));
          CHECK(inner.seen[2][1] == doctest::Approx(12 * k));
          CHECK(inner.seen[3][99] == doctest::Approx(3 * k));
        });
      }
    }
  }
}

// One herd::parameters list given to sgd, adamw, the distributed optimizer and broadcast_parameters
// trains exactly as the same lists written out for each; its values and gradients are not swapped.
TEST_CASE("a herd::parameters list trains as the views written out for each part") {
  auto train = [](bool listed, bool adam) {
    std::vector<std::vector<float>> result(2);
    herd::local::run(2, [&](herd::local_communicator& comm) {
      const float r = static_cast<float>(comm.rank());
      std::vector<float> w = {1.0f + r, -2.0f, 0.5f}, b = {0.25f - r};  // unequal until broadcast
      std::vector<float> gw(3), gb(1);
      const herd::parameters params{herd::views(w, b), herd::views(gw, gb)};
      auto run = [&](auto& inner) {
        auto opt = listed ? herd::distributed_optimizer(inner, params, comm)
                          : herd::distributed_optimizer(inner, herd::views(gw, gb), comm);
        if (listed) herd::broadcast_parameters(params, comm, 0);
        else herd::broadcast_parameters(herd::views(w, b), comm, 0);
        for (int step = 0; step < 3; ++step) {
          for (std::size_t i = 0; i < 3; ++i) gw[i] = w[i] * (r + 1) + static_cast<float>(step);
          gb[0] = b[0] - r;
          opt.step();
        }
      };
      if (adam) {
        auto inner = listed ? herd::adamw(params, {.lr = 0.1}) : herd::adamw(herd::views(w, b), herd::views(gw, gb), {.lr = 0.1});
        run(inner);
      } else {
        auto inner = listed ? herd::sgd(params, {.lr = 0.1, .momentum = 0.9})
                            : herd::sgd(herd::views(w, b), herd::views(gw, gb), {.lr = 0.1, .momentum = 0.9});
        run(inner);
      }
      result[static_cast<std::size_t>(comm.rank())] = {w[0], w[1], w[2], b[0]};
    });
    return result;
  };
  for (bool adam : {false, true}) {
    const auto listed = train(true, adam);
    const auto written = train(false, adam);
    const char* which = adam ? "adamw" : "sgd";
    INFO(which);
    CHECK(listed == written);
    CHECK(listed[0] == listed[1]);  // the broadcast made the ranks start alike
    CHECK(listed[0][0] != 1.0f);    // and they trained
  }
}

TEST_CASE("backward_passes_per_step accumulates locally and reduces the sum of the passes every k-th step (as Horovod)") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> g(3);
    recorder inner;
    inner.grads = herd::views(g);
    // Each pass overwrites the gradients: herd keeps their sum.
    herd::distributed_optimizer opt(inner, herd::views(g), comm,
                                    {.backward_passes_per_step = 3, .accumulate = herd::accumulation::by_copy});
    const float r = static_cast<float>(comm.rank());
    for (int round = 0; round < 2; ++round) {
      for (int pass = 0; pass < 3; ++pass) {
        g = {r + static_cast<float>(pass), 10.0f * static_cast<float>(round), -1.0f};
        CHECK(opt.accumulated_passes() == pass);
        CHECK(opt.step() == (pass == 2));
      }
      CHECK(inner.steps == round + 1);
      // Sum over passes 0, 1, 2, mean over ranks 0, 1, of (r + pass): 3 * 0.5 + 3 = 4.5.
      CHECK(inner.seen[0][0] == doctest::Approx(4.5));
      CHECK(inner.seen[0][1] == doctest::Approx(30.0 * round));
      CHECK(inner.seen[0][2] == doctest::Approx(-3.0));
    }
  });
}

// PyTorch's way (the default): the backward passes add into the gradients, zeroed once per
// optimizer step; the passes held back must leave them alone, or the first pass counts twice.
TEST_CASE("accumulation::in_gradients: the last step() of a round reduces the gradients as the passes left them") {
  for (const bool marks : {false, true}) {
    herd::local::run(2, [&](herd::local_communicator& comm) {
      std::vector<float> a(3), b(2);  // with marks, a bucket each
      recorder inner;
      inner.grads = herd::views(a, b);
      const herd::optimizer_options options{.backward_passes_per_step = 2, .bucket_bytes = 4, .first_bucket_bytes = 4};
      herd::distributed_optimizer opt(inner, herd::views(a, b), comm, options);
      const float r = static_cast<float>(comm.rank());
      for (int round = 0; round < 2; ++round) {
        std::fill(a.begin(), a.end(), 0.0f);  // zero_grad()
        std::fill(b.begin(), b.end(), 0.0f);
        for (int pass = 0; pass < 2; ++pass) {
          for (auto* g : {&a, &b}) {
            for (float& x : *g) x += 1.0f + r + static_cast<float>(pass);  // backward adds into the gradient
          }
          if (marks) {
            opt.mark_ready(1);
            opt.mark_ready(0);
          }
          CHECK(opt.step() == (pass == 1));
        }
        INFO("marks: " << marks << ", round " << round);
        // Rank 0's passes add up to 1 + 2, rank 1's to 2 + 3: their mean is 4 (counting the first
        // pass twice would give 5.5).
        CHECK(inner.seen[0][0] == 4.0);
        CHECK(inner.seen[1][1] == 4.0);
        CHECK(opt.accumulated_passes() == 0);
      }
      CHECK(inner.steps == 2);
    });
  }
}

// A round whose reduction fails is abandoned on every rank, the rank whose gradients changed and
// the ranks that only learn of it in the reduction, so that the next rounds hold back and reduce
// the same passes everywhere (the others once kept counting the failed round's passes).
TEST_CASE("accumulation: a reduction that fails abandons the round on every rank, and the next rounds pair up") {
  for (const int ranks : {2, 3}) {
    herd::local::run(ranks, [](herd::local_communicator& comm) {
      std::vector<float> a(3), extra(2, 0.0f);
      recorder inner;
      inner.grads = herd::views(a);
      bool change = false;
      herd::distributed_optimizer opt(
          inner, [&] { return change && comm.rank() == 1 ? herd::views(a, extra) : herd::views(a); }, comm,
          {.backward_passes_per_step = 2});
      const float r = static_cast<float>(comm.rank());
      const float p = static_cast<float>(comm.size());
      for (int round = 0; round < 4; ++round) {
        INFO("round " << round);
        std::fill(a.begin(), a.end(), 0.0f);  // zero_grad()
        for (int pass = 0; pass < 2; ++pass) {
          for (float& x : a) x += 1.0f + r + static_cast<float>(pass);  // backward adds into the gradient
          change = round == 1 && pass == 1;
          if (change) {
            const std::string message = herd_test::error_of([&] { opt.step(); });
            INFO(message);
            CHECK(has(message, comm.rank() == 1 ? "the gradients changed since the first step" : "rank 1"));
          } else {
            CHECK(opt.step() == (pass == 1));
          }
        }
        CHECK(opt.accumulated_passes() == 0);
        // The mean over the ranks of (1 + r) + (2 + r): 3 + (p - 1).
        if (round != 1) CHECK(inner.seen[0][0] == doctest::Approx(3.0 + static_cast<double>(p - 1)));
      }
      CHECK(inner.steps == 3);
    });
  }
}

// The wrapped optimizer raising on one rank ends that step there as on the others: the next
// step() reduces again on every rank (it once skipped the reduction on that rank, whose gradients
// it took for reduced already, and the ranks' reductions no longer paired up).
TEST_CASE("a wrapped optimizer that raises on one rank leaves the next step reducing on every rank") {
  struct raising_once {
    recorder inner;
    bool raise_now = false;
    void step() {
      if (std::exchange(raise_now, false)) throw std::runtime_error("the wrapped optimizer failed");
      inner.step();
    }
  };
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> g(4);
    raising_once inner;
    inner.inner.grads = herd::views(g);
    herd::distributed_optimizer opt(inner, herd::views(g), comm);
    const float r = static_cast<float>(comm.rank());
    for (int step = 0; step < 3; ++step) {
      std::fill(g.begin(), g.end(), r + static_cast<float>(step));
      inner.raise_now = step == 1 && comm.rank() == 1;
      if (inner.raise_now) {
        CHECK_THROWS_WITH(opt.step(), "the wrapped optimizer failed");
      } else {
        CHECK(opt.step());
        CHECK(inner.inner.seen[0][0] == doctest::Approx(0.5 + step));  // the mean of r + step
      }
    }
    CHECK(inner.inner.steps == (comm.rank() == 1 ? 2 : 3));
  });
}

// Likewise a gradient source whose after_reduction raises on one rank (torch_gradients' runs a
// collective there): the step ends on that rank, whose next step() reduces as the others' do (it
// once found its gradients reduced already and skipped the reduction the others made).
TEST_CASE("a gradient source whose after_reduction raises on one rank leaves the next step reducing on every rank") {
  struct raising_source {
    std::vector<float>* g;
    bool* raise_now;
    std::vector<herd::buffer_view> operator()() const { return herd::views(*g); }
    void after_reduction(herd::local_communicator&) const {
      if (std::exchange(*raise_now, false)) throw std::runtime_error("the source failed after the reduction");
    }
  };
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> g(4);
    bool raise_now = false;
    recorder inner;
    inner.grads = herd::views(g);
    herd::distributed_optimizer opt(inner, raising_source{&g, &raise_now}, comm);
    const float r = static_cast<float>(comm.rank());
    for (int step = 0; step < 3; ++step) {
      std::fill(g.begin(), g.end(), r + static_cast<float>(step));
      raise_now = step == 1 && comm.rank() == 1;
      if (raise_now) {
        CHECK_THROWS_WITH(opt.step(), "the source failed after the reduction");
      } else {
        CHECK(opt.step());
        CHECK(inner.seen[0][0] == doctest::Approx(0.5 + step));  // the mean of r + step
      }
    }
    CHECK(inner.steps == (comm.rank() == 1 ? 2 : 3));
  });
}

// A gradient source that raises on one rank (a gradient its tensor library did not make there):
// every rank raises at that step, the others naming the rank, wherever the read falls: in the
// first check, in a later step's reduction, in a pass held back (the round's reduction raises it)
// or at the first mark. The others once waited in a reduction that rank never started, and its
// next step paired with it, silently. The steps after it reduce on every rank.
TEST_CASE("a gradient source that raises on one rank raises on every rank, and the next steps reduce on every rank") {
  struct scenario {
    std::string name;
    int passes;      // backward_passes_per_step
    int marks;       // 0: none; 1: mark_ready(0, view) in each pass; 2: mark_ready(0), which reads the source
    int fail_pass;   // the pass whose read raises on rank 1
    int raise_pass;  // the pass whose step() (or mark) raises on every rank: the first check's at once,
                     // a later pass held back's at its round's reduction
  };
  const scenario scenarios[] = {{"first check, at step()", 1, 0, 0, 0},
                                {"a later step's reduction", 1, 0, 2, 2},
                                {"first check, at the first mark", 1, 1, 0, 0},
                                {"a later mark that reads the source", 1, 2, 2, 2},
                                {"first check, in a pass held back", 2, 0, 0, 0},
                                {"a later pass held back", 2, 0, 2, 3}};
  for (const scenario& sc : scenarios) {
    for (const int ranks : {2, 3}) {
      herd::local::run(ranks, [&](herd::local_communicator& comm) {
        std::vector<float> g(4);
        bool fail_now = false;
        recorder inner;
        inner.grads = herd::views(g);
        auto source = [&]() {
          if (fail_now && comm.rank() == 1) throw std::runtime_error("parameter 0 has no gradient");
          return herd::views(g);
        };
        herd::distributed_optimizer opt(inner, source, comm,
                                        {.backward_passes_per_step = sc.passes, .accumulate = herd::accumulation::by_copy});
        auto mark = [&](int how) {
          if (how == 1) opt.mark_ready(0, herd::views(g)[0]);
          if (how == 2) opt.mark_ready(0);
        };
        const double mean_rank = 0.5 * (comm.size() - 1);
        int in_round = 0, rounds = 0;
        double pass_sum = 0;  // of the round's pass numbers
        for (int pass = 0; pass < 8; ++pass) {
          std::fill(g.begin(), g.end(), static_cast<float>(comm.rank() + pass));
          fail_now = pass == sc.fail_pass;
          INFO(sc.name, ", rank ", comm.rank(), " of ", comm.size(), ", pass ", pass);
          if (pass == sc.raise_pass) {  // the round is abandoned on every rank
            const std::string message = herd_test::error_of([&] {
              mark(sc.marks);
              opt.step();
            });
            INFO(message);
            CHECK(has(message, comm.rank() == 1 ? "parameter 0 has no gradient" : "rank 1"));
            in_round = 0, pass_sum = 0;
            continue;
          }
          mark(sc.marks);
          const bool last = in_round == sc.passes - 1;
          CHECK(opt.step() == last);
          pass_sum += pass;
          if (!last) {
            ++in_round;
            continue;
          }
          ++rounds;
          CHECK(inner.seen[0][0] == doctest::Approx(sc.passes * mean_rank + pass_sum));  // the mean over the ranks
          in_round = 0, pass_sum = 0;
        }
        CHECK(inner.steps == rounds);
        CHECK(rounds >= 3);
      });
    }
  }
}

// Packing a bucket failing on one rank (memory for it on a GPU; here the tests' pack hook), before
// its operation started: as an error inside an operation, it aborts the communicator, and the
// others, waiting in that bucket, raise at once; the next step raises on every rank. The bucket
// once stayed unstarted on that rank (the failure left mark_ready there), and its next bucket
// paired with the one the others waited in.
TEST_CASE("buckets: a bucket that fails to pack on one rank aborts, and every rank raises") {
  struct hook_guard {
    hook_guard() {
      herd::detail::pack_hook() = [](int rank, std::size_t bucket) {
        if (rank == 1 && bucket == 1) throw std::bad_alloc();
      };
    }
    ~hook_guard() { herd::detail::pack_hook() = nullptr; }
  };
  for (const int ranks : {2, 3}) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      std::vector<float> a(4), b(4), c(4);
      recorder inner;
      inner.grads = herd::views(a, b, c);
      herd::distributed_optimizer opt(inner, herd::views(a, b, c), comm, {.bucket_bytes = 16, .first_bucket_bytes = 16});
      const float r = static_cast<float>(comm.rank());
      for (auto* g : {&a, &b, &c}) std::fill(g->begin(), g->end(), r);
      for (std::size_t i = 3; i-- > 0;) opt.mark_ready(i);
      CHECK(opt.step());
      REQUIRE(opt.buckets().size() == 3);  // one gradient each
      herd::barrier(comm);
      std::optional<hook_guard> failing;
      if (comm.rank() == 0) failing.emplace();
      herd::barrier(comm);
      const std::string message = herd_test::error_of([&] {
        for (std::size_t i = 3; i-- > 0;) opt.mark_ready(i);
        opt.step();
      });
      INFO("rank ", comm.rank(), " of ", comm.size(), ": ", message);
      CHECK(has(message, "packing bucket 1 failed on rank 1: std::bad_alloc"));
      if (comm.rank() != 1) CHECK(has(message, "rank 1"));
      const std::string next = herd_test::error_of([&] {
        for (std::size_t i = 3; i-- > 0;) opt.mark_ready(i);
        opt.step();
      });
      INFO(next);
      CHECK(has(next, "aborted"));
      herd::detail::pack_hook() = nullptr;
      CHECK(inner.steps == 1);
    });
  }
}

// clip_grad_norm over a communicator: a rank whose gradients it cannot read says so in the norm's
// allreduce, so every rank raises, naming it (the others once waited there for that rank, which
// had raised alone, and paired the allreduce with its next call); the next call is whole.
TEST_CASE("clip_grad_norm over ranks: gradients one rank cannot read raise on every rank, and the next call is whole") {
  for (const int ranks : {2, 3}) {
    herd::local::run(ranks, [](herd::local_communicator& comm) {
      std::vector<float> g(3, static_cast<float>(comm.rank() + 1));
      const std::vector<herd::buffer_view> good = herd::views(g);
      const std::vector<herd::buffer_view> bad = {herd::buffer_view{nullptr, 3, herd::dtype::f32, herd::device::cpu()}};
      const std::string message = herd_test::error_of([&] { herd::clip_grad_norm(comm.rank() == 1 ? bad : good, 1e9, comm); });
      INFO("rank ", comm.rank(), " of ", comm.size(), ": ", message);
      CHECK(has(message, comm.rank() == 1 ? "clip_grad_norm: gradient 0 has a null data pointer" : "rank 1 passed a null data pointer"));
      double squares = 0;  // 3 elements of r + 1 on each rank r
      for (int r = 0; r < comm.size(); ++r) squares += 3.0 * (r + 1) * (r + 1);
      CHECK(herd::clip_grad_norm(good, 1e9, comm) == doctest::Approx(std::sqrt(squares)));
    });
  }
}

// With marks and find_unused_parameters: a gradient the round's last pass did not produce still
// holds what the passes before it added, and is reduced as it is, not as zeros (as DDP's reducer
// copies a defined gradient into its bucket whether or not the pass used it).
TEST_CASE("accumulation::in_gradients: a gradient unused in the last pass keeps the earlier passes' part") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> a(3, 0.0f), b(2, 0.0f);
    recorder inner;
    inner.grads = herd::views(a, b);
    const herd::optimizer_options options{.backward_passes_per_step = 2, .bucket_bytes = 4, .first_bucket_bytes = 4,
                                          .find_unused_parameters = true};
    herd::distributed_optimizer opt(inner, herd::views(a, b), comm, options);
    const float r = static_cast<float>(comm.rank());
    for (float& x : a) x += 1.0f + r;  // pass 0 uses both
    for (float& x : b) x += 10.0f * (1.0f + r);
    opt.mark_ready(1);
    opt.mark_ready(0);
    CHECK_FALSE(opt.step());
    for (float& x : a) x += 2.0f;  // pass 1 uses a only
    opt.mark_ready(0);
    CHECK(opt.step());
    CHECK(inner.seen[0][0] == 3.5);   // mean of 1 + 2 and 2 + 2
    CHECK(inner.seen[1][1] == 15.0);  // mean of 10 and 20, from pass 0 alone
  });
}

TEST_CASE("synchronize() reduces once; skip_synchronize() makes step() use local gradients") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> g(2);
    recorder inner;
    inner.grads = herd::views(g);
    herd::distributed_optimizer opt(inner, herd::views(g), comm, {.op = herd::reduce_op::sum});
    g = {1.0f, 2.0f};
    opt.synchronize();
    CHECK(g[0] == 2.0f);  // summed over two ranks, inspectable (and clippable) before the step
    opt.synchronize();    // again before step(): reduced once already, as Horovod's (not 4)
    CHECK(g[0] == 2.0f);
    g[1] = 100.0f;        // e.g. clipping: step() must not reduce again
    CHECK(opt.step());
    CHECK(inner.seen[0][0] == 2.0);
    CHECK(inner.seen[0][1] == 100.0);
    g = {5.0f, static_cast<float>(comm.rank())};
    {
      auto skip = opt.skip_synchronize();
      CHECK(opt.step());
      CHECK(inner.seen[0][1] == comm.rank());
      g[1] = 10.0f + static_cast<float>(comm.rank());
      CHECK(opt.step());  // still skipping: the guard, not the first step, ends it
      CHECK(inner.seen[0][1] == 10.0 + comm.rank());
    }
    g = {1.0f, 1.0f};
    CHECK(opt.step());  // the guard is gone: reduce again
    CHECK(inner.seen[0][0] == 2.0);
  });
}

TEST_CASE("fp16 and bf16 compression stay within their stated tolerances") {
  // Each gradient is rounded once to the wire dtype, summed there (p - 1 roundings) and divided
  // (one more): the error stays within 2p rounding units of the largest |gradient|, where a unit
  // is 2^-11 for f16 and 2^-8 for bf16.
  const int p = 4;
  for (auto c : {herd::compression::fp16, herd::compression::bf16}) {
    const double unit = c == herd::compression::fp16 ? 0x1.0p-11 : 0x1.0p-8;
    std::vector<std::vector<float>> grads(p);
    herd_test::rng g(11);
    for (auto& v : grads) {
      v.resize(5000);
      for (auto& x : v) x = static_cast<float>((g.unit() - 0.5) * 8);
    }
    std::vector<std::vector<float>> results(p);
    herd::local::run(p, [&](herd::local_communicator& comm) {
      auto mine = grads[static_cast<std::size_t>(comm.rank())];
      recorder inner;
      inner.grads = herd::views(mine);
      herd::distributed_optimizer opt(inner, herd::views(mine), comm, {.compression = c});
      opt.step();
      results[static_cast<std::size_t>(comm.rank())] = mine;
    });
    double worst = 0;
    for (std::size_t i = 0; i < 5000; ++i) {
      double exact = 0;
      for (const auto& v : grads) exact += v[i];
      exact /= p;
      worst = std::max(worst, std::abs(results[0][i] - exact));
      for (int r = 1; r < p; ++r) CHECK(results[static_cast<std::size_t>(r)][i] == results[0][i]);
    }
    INFO("compression ", herd::name(c), ": worst error ", worst);
    CHECK(worst <= 2 * p * unit * 4.0);
    CHECK(worst > 0);  // the wire really was narrower than f32
  }
}

TEST_CASE("the distributed optimizer reports gradient and option mismatches on every rank") {
  auto errors = [](auto body) {
    std::vector<std::string> messages(2);
    herd::local::run(2, [&](herd::local_communicator& comm) {
      try {
        body(comm);
      } catch (const herd::error& e) {
        messages[static_cast<std::size_t>(comm.rank())] = e.what();
      }
    });
    return messages;
  };
  struct no_op {
    void step() {}
  };
  for (const auto& m : errors([](herd::local_communicator& comm) {
         std::vector<float> a(3), b(4);
         no_op inner;
         herd::distributed_optimizer opt(inner, comm.rank() == 0 ? herd::views(a, b) : herd::views(a), comm);
         opt.step();
       })) {
    INFO(m);
    CHECK(has(m, "rank 1 has 1 gradients but rank 0 has 2"));
  }
  for (const auto& m : errors([](herd::local_communicator& comm) {
         std::vector<float> a(3);
         std::vector<double> b(3);
         no_op inner;
         herd::distributed_optimizer opt(inner, comm.rank() == 0 ? herd::views(a) : herd::views(b), comm);
         opt.step();
       })) {
    INFO(m);
    CHECK(has(m, "gradient 0 is 3 elements of f32 on rank 0 but 3 elements of f64 on rank 1"));
  }
  for (const auto& m : errors([](herd::local_communicator& comm) {
         std::vector<float> a(3);
         no_op inner;
         herd::distributed_optimizer opt(inner, herd::views(a), comm,
                                         {.fusion_threshold_bytes = comm.rank() == 0 ? std::size_t{64} : std::size_t{128}});
         opt.step();
       })) {
    INFO(m);
    CHECK(has(m, "option fusion_threshold_bytes differs between rank 0 and rank 1"));
  }
  herd::local::run(1, [](herd::local_communicator& comm) {
    no_op inner;
    std::vector<float> a(3);
    CHECK_THROWS_WITH_AS(herd::distributed_optimizer(inner, herd::views(a), comm, {.op = herd::reduce_op::max}),
                         doctest::Contains("cannot combine gradients"), herd::error);
    CHECK_THROWS_WITH_AS(herd::distributed_optimizer(inner, herd::views(a), comm, {.backward_passes_per_step = 0}),
                         doctest::Contains("at least 1"), herd::error);
  });
}

TEST_CASE("broadcast_object carries values, strings and vectors from the root") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    struct state {
      int epoch;
      double loss;
    } s{comm.rank() == 2 ? 7 : 0, comm.rank() == 2 ? 0.25 : 0.0};
    std::string text = comm.rank() == 2 ? "resume from epoch 7" : "x";
    std::vector<std::int64_t> list = comm.rank() == 2 ? std::vector<std::int64_t>{1, 2, 3} : std::vector<std::int64_t>{};
    herd::broadcast_object(s, comm, 2);
    herd::broadcast_object(text, comm, 2);
    herd::broadcast_object(list, comm, 2);
    CHECK(s.epoch == 7);
    CHECK(s.loss == 0.25);
    CHECK(text == "resume from epoch 7");
    CHECK(list == std::vector<std::int64_t>{1, 2, 3});
  });
}

TEST_CASE("metrics combine across ranks; the learning rate scales with a linear warm-up") {
  herd::local::run(4, [](herd::local_communicator& comm) {
    herd::metric accuracy;
    // Rank r saw r + 1 samples, all with value r: the weighted mean is (0*1 + 1*2 + 2*3 + 3*4) / 10 = 2.
    accuracy.add(comm.rank(), comm.rank() + 1);
    CHECK(accuracy.global_mean(comm) == doctest::Approx(2.0));
    CHECK(herd::average(comm.rank(), comm) == doctest::Approx(1.5));
    herd::metric empty;
    CHECK(empty.global_mean(comm) == 0.0);
  });
  const herd::scaled_learning_rate lr{.base = 0.1, .ranks = 4, .warmup_steps = 10};
  CHECK(lr(0) == doctest::Approx(0.1));
  CHECK(lr(5) == doctest::Approx(0.25));
  CHECK(lr(10) == doctest::Approx(0.4));
  CHECK(lr(1000) == doctest::Approx(0.4));
  CHECK(herd::scaled_learning_rate{.base = 0.1, .ranks = 2}(0) == doctest::Approx(0.2));
}

TEST_CASE("a run resumed from a checkpoint reaches the same parameters as an uninterrupted one") {
  const auto path = std::filesystem::temp_directory_path() / ("herd-resume-" + std::to_string(::getpid()) + ".ckpt");
  const herd_test::regression_data data(2 * 8 * 6, 5, 2, 17);
  // Trains steps [first, last) on 2 ranks; resumes from `path` first when asked, saves there at the end.
  auto train = [&](int first, int last, bool resume, std::vector<std::vector<float>>& params_out) {
    herd::local::run(2, [&](herd::local_communicator& comm) {
      herd_test::tiny_mlp model(5, 7, 2, resume ? 999 : 1);  // a resumed run starts from other weights
      herd::sgd sgd(model.params(), model.grads(), {.lr = 0.05, .momentum = 0.9});
      herd::distributed_optimizer opt(sgd, model.grads(), comm);
      std::int64_t step = 0;
      herd::checkpoint state;
      state.add("w1", model.w1).add("b1", model.b1).add("w2", model.w2).add("b2", model.b2);
      state.add_optimizer_state("sgd.", sgd).add_value("step", step);
      if (resume) REQUIRE(state.load(path, comm, 0));
      CHECK(step == first);
      for (; step < last; ++step) {
        const auto begin = static_cast<std::size_t>(step * 16 + comm.rank() * 8);
        model.forward_backward(data, begin, begin + 8);
        opt.step();
      }
      state.save(path, comm, 0);
      if (comm.rank() == 1) params_out = {model.w1, model.b1, model.w2, model.b2};
    });
  };
  std::vector<std::vector<float>> straight, resumed, unused;
  train(0, 6, false, straight);
  train(0, 3, false, unused);
  train(3, 6, true, resumed);
  CHECK(resumed == straight);  // bit for bit: same state, same order of operations
  std::filesystem::remove(path);
}

TEST_CASE("16-bit averages are divided before the sum, as DDP's: two ranks averaging 40000 get 40000, not inf") {
  for (herd::compression wire : {herd::compression::none, herd::compression::fp16}) {
    for (bool buckets : {false, true}) {
      herd::local::run(2, [&](herd::local_communicator& comm) {
        // f16 gradients (f32 ones with fp16 on the wire): the sum, 80000, is past f16's 65504.
        std::vector<herd::half> g16(5, herd::half(40000.0f));
        std::vector<float> g32(5, 40000.0f);
        const bool narrow = wire == herd::compression::none;
        const auto grads = narrow ? herd::views(g16) : herd::views(g32);
        recorder inner{grads, {}, 0};
        herd::distributed_optimizer opt(inner, grads, comm, {.compression = wire});
        if (buckets) opt.mark_ready(0, grads[0]);
        opt.step();
        INFO("compression ", herd::name(wire), buckets ? ", buckets" : ", step-time fusion", ", rank ", comm.rank());
        REQUIRE(inner.seen.size() == 1);
        for (double v : inner.seen[0]) CHECK(v == 40000.0);
      });
    }
  }
}

TEST_CASE("16-bit averages beside f32 gradients are divided before the sum too; the f32 ones keep their own factor") {
  for (double predivide : {1.0, 4.0}) {
    for (bool buckets : {false, true}) {
      herd::local::run(2, [&](herd::local_communicator& comm) {
        std::vector<herd::half> g16(5, herd::half(40000.0f));
        std::vector<float> g32(7, 3.0f + static_cast<float>(comm.rank()));
        const auto grads = herd::views(g16, g32);
        recorder inner{grads, {}, 0};
        herd::distributed_optimizer opt(inner, grads, comm, {.gradient_predivide_factor = predivide});
        if (buckets) {
          opt.mark_ready(1, grads[1]);
          opt.mark_ready(0, grads[0]);
        }
        opt.step();
        INFO("predivide ", predivide, std::string(buckets ? ", buckets" : ", step-time fusion"), ", rank ", comm.rank());
        REQUIRE(inner.seen.size() == 2);
        for (double v : inner.seen[0]) CHECK(v == 40000.0);
        for (double v : inner.seen[1]) CHECK(v == 3.5);
      });
    }
  }
}
