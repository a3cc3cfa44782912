#pragma once
// The distributed optimizer's buckets (mark_ready), as cases every rank runs with its own
// communicator: tests/unit/test_overlap.cpp runs them on threads, tests/mpi/test_mpi_overlap.cpp
// on MPI ranks. Each case checks its own rank's results and messages.

#include <herd/herd.hpp>

#include "reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace herd_test::overlap {

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct counting_optimizer {
  int steps = 0;
  void step() { ++steps; }
};

// Five f32 gradients whose sizes make several buckets with small_buckets().
struct model {
  std::vector<std::vector<float>> grads;
  explicit model(int rank, int seed = 0) {
    for (std::size_t n : std::vector<std::size_t>{700, 30, 2000, 5, 300}) grads.emplace_back(n);
    refill(rank, seed);
  }
  // New values in the same memory (the optimizer holds views of it).
  void refill(int rank, int seed) {
    rng g(static_cast<std::uint64_t>(100 * seed + rank + 1));
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

inline herd::optimizer_options small_buckets() {
  herd::optimizer_options o;
  o.first_bucket_bytes = 1000;
  o.bucket_bytes = 4000;
  return o;
}

template <class Fn> std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const herd::error& e) {
    return e.what();
  }
  return "(no error)";
}

// Every rank marks in an order of its own, one gradient at a time; a second optimizer marks all
// just before step() (a blocking reduction), first in rank 0's first order so that it rebuilds
// the same buckets. Same bits at any number of ranks, alike on every rank, equal to the average.
template <class C> void marks_in_any_order_give_the_blocking_bits(C& comm) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  model a(comm.rank()), b(comm.rank());
  counting_optimizer inner_a, inner_b;
  herd::distributed_optimizer opt_a(inner_a, a.views(), comm, small_buckets());
  herd::distributed_optimizer opt_b(inner_b, b.views(), comm, small_buckets());
  const std::vector<std::size_t> orders[] = {{1, 0, 4, 2, 3}, {0, 2, 4, 1, 3}, {3, 4, 0, 2, 1}};
  const std::vector<std::vector<std::size_t>> reverse = {{4}, {3, 2}, {1, 0}};
  CHECK(opt_a.buckets().empty());  // planned at the first mark
  for (int step = 0; step < 3; ++step) {
    a.refill(comm.rank(), step);
    b.refill(comm.rank(), step);
    for (std::size_t i : orders[(r + static_cast<std::size_t>(step)) % 3]) opt_a.mark_ready(i);
    if (step == 0) CHECK(opt_a.buckets() == reverse);
    opt_a.step();
    if (step == 0) {
      for (std::size_t i : orders[0]) opt_b.mark_ready(i);
    } else {
      for (std::size_t i = 5; i-- > 0;) opt_b.mark_ready(i);
    }
    opt_b.step();
  }
  // Rebuilt once, from rank 0's first order 1, 0, 4, 2, 3 (120, 2800, 1200, 8000, 20 bytes):
  // 1 + 0 closes the first bucket (1000 B), 4 + 2 the next (4000 B), 3 is alone.
  const std::vector<std::vector<std::size_t>> rebuilt = {{1, 0}, {4, 2}, {3}};
  CHECK(opt_a.buckets() == rebuilt);
  CHECK(opt_b.buckets() == rebuilt);
  CHECK(inner_a.steps == 3);
  CHECK(a.grads == b.grads);
  std::vector<float> mean(2000, 0.0f);
  for (int q = 0; q < p; ++q) {
    const auto g = model(q, 2).grads[2];
    for (std::size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
  }
  for (std::size_t i = 0; i < mean.size(); i += 97) CHECK(a.grads[2][i] == doctest::Approx(mean[i] / static_cast<float>(p)));
  std::vector<float> gathered(a.grads[2].size() * static_cast<std::size_t>(p));
  herd::allgather(a.grads[2], gathered, comm);
  for (int q = 1; q < p; ++q) {
    CHECK(std::equal(gathered.begin(), gathered.begin() + 2000, gathered.begin() + q * 2000));
  }
}

// Integer-valued gradients: every order of summation is exact, so the buckets and the fusion
// buffer give the same bits at any number of ranks.
template <class C> void buckets_equal_fusion_on_exact_values(C& comm) {
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
  herd::distributed_optimizer buckets(inner, herd::views(x, y), comm,
                                      {.op = herd::reduce_op::sum, .bucket_bytes = 1000, .first_bucket_bytes = 100});
  fill();
  buckets.mark_ready(1);
  buckets.mark_ready(0);
  buckets.step();
  CHECK(x == x1);
  CHECK(y == y1);
}

// Rank 1 never marks gradient 2: an agreed error on every rank, the communicator still usable.
template <class C> void unmarked_gradient_is_an_error_everywhere(C& comm) {
  model m(comm.rank());
  counting_optimizer inner;
  herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
  const std::string message = error_of([&] {
    for (std::size_t i = 5; i-- > 0;) {
      if (!(comm.rank() == 1 && i == 2)) opt.mark_ready(i);
    }
    opt.step();
  });
  INFO(message);
  if (comm.rank() == 1) {
    CHECK(has(message, "gradient(s) 2 were not marked ready in this backward pass"));
    CHECK(has(message, "find_unused_parameters"));
  } else {
    CHECK(has(message, "rank 1 passed gradients it did not mark ready in this backward pass"));
  }
  CHECK(inner.steps == 0);
  std::vector<float> v(10, 1.0f);
  herd::allreduce(v, comm);
  CHECK(v[0] == static_cast<float>(comm.size()));
  // The next pass, complete, works.
  for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
  opt.step();
  CHECK(inner.steps == 1);
}

// find_unused_parameters: a gradient only rank 0 produced is averaged with zeros from the others.
template <class C> void unused_gradient_counts_as_zeros(C& comm) {
  std::vector<float> used(100), unused(50);
  counting_optimizer inner;
  herd::optimizer_options o;
  o.find_unused_parameters = true;
  herd::distributed_optimizer opt(inner, herd::views(used, unused), comm, o);
  // A first pass where every rank uses both leaves values in the bucket's memory.
  std::fill(used.begin(), used.end(), 1.0f);
  std::fill(unused.begin(), unused.end(), 5.0f);
  opt.mark_ready(1);
  opt.mark_ready(0);
  opt.step();
  CHECK(unused[0] == 5.0f);
  std::fill(used.begin(), used.end(), 2.0f + static_cast<float>(comm.rank()));
  std::fill(unused.begin(), unused.end(), comm.rank() == 0 ? 8.0f : -999.0f);  // the others leave garbage
  opt.mark_ready(0);
  if (comm.rank() == 0) opt.mark_ready(1);
  opt.step();
  const float p = static_cast<float>(comm.size());
  CHECK(used[7] == doctest::Approx(2.0f + (p - 1) / 2));
  CHECK(unused[7] == doctest::Approx(8.0f / p));
  CHECK(inner.steps == 2);
}

// With find_unused_parameters the buckets keep their first plan (reverse order), as DDP keeps
// them unless static_graph: the ready order of a graph with unused parameters changes.
template <class C> void unused_parameters_keep_the_first_buckets(C& comm) {
  for (const bool static_graph : {false, true}) {
    CAPTURE(static_graph);
    model m(comm.rank());
    counting_optimizer inner;
    herd::optimizer_options options = small_buckets();
    options.find_unused_parameters = true;
    options.static_graph = static_graph;
    herd::distributed_optimizer opt(inner, m.views(), comm, options);
    const std::vector<std::vector<std::size_t>> reverse = {{4}, {3, 2}, {1, 0}};
    for (int step = 0; step < 2; ++step) {
      for (std::size_t i : {std::size_t{1}, std::size_t{0}, std::size_t{4}, std::size_t{2}, std::size_t{3}}) opt.mark_ready(i);
      opt.step();
    }
    if (static_graph) CHECK(opt.buckets() == std::vector<std::vector<std::size_t>>{{1, 0}, {4, 2}, {3}});
    else CHECK(opt.buckets() == reverse);
  }
}

// no_sync: passes under the guard accumulate (marks do nothing); the next reduces their sum
// (passes that overwrite the gradients: accumulation::by_copy).
template <class C> void no_sync_accumulates_then_reduces_the_sum(C& comm) {
  std::vector<float> g(300);
  counting_optimizer inner;
  herd::optimizer_options options = small_buckets();
  options.accumulate = herd::accumulation::by_copy;
  herd::distributed_optimizer opt(inner, herd::views(g), comm, options);
  const float r = static_cast<float>(comm.rank());
  {
    auto guard = opt.no_sync();
    for (int pass = 0; pass < 2; ++pass) {
      std::fill(g.begin(), g.end(), r + static_cast<float>(pass));
      opt.mark_ready(0);
      CHECK_FALSE(opt.step());
    }
  }
  CHECK(inner.steps == 0);
  CHECK(opt.accumulated_passes() == 2);
  std::fill(g.begin(), g.end(), 10.0f);
  opt.mark_ready(0);
  CHECK(opt.step());
  // Passes r, r + 1 and 10 summed (2r + 11), averaged over the ranks.
  const float p = static_cast<float>(comm.size());
  CHECK(g[0] == doctest::Approx(11.0f + (p - 1)));
  CHECK(inner.steps == 1);
  CHECK(opt.accumulated_passes() == 0);
}

// A gradient marked with a view of the wrong size: its bucket carries the problem, and step()
// raises it on every rank.
template <class C> void a_bad_gradient_in_a_bucket_reaches_step_everywhere(C& comm) {
  model m(comm.rank());
  counting_optimizer inner;
  herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
  for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
  opt.step();
  std::vector<float> wrong(123);
  const std::string message = error_of([&] {
    for (std::size_t i = 5; i-- > 0;) {
      if (comm.rank() == 1 && i == 0) opt.mark_ready(0, herd::view_of(wrong));
      else opt.mark_ready(i);
    }
    opt.step();
  });
  INFO(message);
  if (comm.rank() == 1) CHECK(has(message, "gradient 0 changed since the first step (123 f32 instead of 700 f32)"));
  else CHECK(has(message, "rank 1 passed gradients that differ from those of the first step"));
  CHECK(inner.steps == 1);
}

// mark_ready with an index that names no gradient, as the pass's first mark on one rank: the
// fault stands until step(), which raises it on every rank (the next mark must not open the pass
// again and forget it, nor may a pass with no valid mark reduce as if nothing were marked).
template <class C> void an_invalid_mark_reaches_step_everywhere(C& comm) {
  model m(comm.rank());
  counting_optimizer inner;
  herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
  const std::string message = error_of([&] {
    if (comm.rank() == 1) opt.mark_ready(99);
    for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
    opt.step();
  });
  INFO(message);
  if (comm.rank() == 1) CHECK(has(message, "mark_ready(99) names no gradient (there are 5)"));
  else CHECK(has(message, "rank 1"));
  CHECK(inner.steps == 0);
  // Alone, too: a pass whose only mark is invalid.
  const std::string alone = error_of([&] {
    if (comm.rank() == 1) opt.mark_ready(7);
    opt.step();
  });
  INFO(alone);
  if (comm.rank() == 1) CHECK(has(alone, "mark_ready(7) names no gradient"));
  CHECK_FALSE(alone.empty());
  CHECK(inner.steps == 0);
}

// A bad mark on one rank after its last gradient was marked (a gradient marked again, an index
// past the last). The pass's last bucket has not started then (on a host communicator it runs in
// step(): detail/reducer.hpp's last_on_caller), so it carries the problem and that step raises it
// on every rank, stepping nowhere; the next pass, with marks or at step(), reduces to the average.
template <class C> void a_bad_mark_after_the_last_gradient_reaches_step_everywhere(C& comm) {
  const float p = static_cast<float>(comm.size());
  for (const bool next_with_marks : {true, false}) {
    INFO("the next reduction ", next_with_marks ? "with marks" : "at step()");
    for (const std::size_t late : {std::size_t{3}, std::size_t{5}}) {
      model m(comm.rank());
      counting_optimizer inner;
      herd::distributed_optimizer opt(inner, m.views(), comm, small_buckets());
      const std::string message = error_of([&] {
        for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
        if (comm.rank() == 1) opt.mark_ready(late);
        opt.step();
      });
      INFO(message);
      if (comm.rank() == 1) {
        CHECK(has(message, late == 5 ? "mark_ready(5) names no gradient (there are 5)"
                                     : "gradient 3 was marked ready twice in one pass"));
      } else {
        CHECK(has(message, "rank 1"));
      }
      CHECK(inner.steps == 0);
      for (auto& g : m.grads) std::fill(g.begin(), g.end(), static_cast<float>(comm.rank() + 1));
      if (next_with_marks)
        for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
      opt.step();
      CHECK(inner.steps == 1);
      for (const auto& g : m.grads) CHECK(g.back() == doctest::Approx((p + 1) / 2));
    }
  }
}

// With no gradients at all there is no bucket to carry a bad mark to the other ranks (they reduce
// nothing): the rank that made it raises it at once, and every rank's step() still pairs up.
template <class C> void a_bad_mark_with_no_gradients_raises_at_once(C& comm) {
  counting_optimizer inner;
  herd::distributed_optimizer opt(inner, std::vector<herd::buffer_view>{}, comm);
  for (int pass = 0; pass < 2; ++pass) {  // the first pass makes the first check, the second does not
    INFO("pass ", pass);
    const std::string marked = error_of([&] {
      if (comm.rank() == 1) opt.mark_ready(0);
    });
    if (comm.rank() == 1) {
      CHECK(has(marked, "rank 1"));
      CHECK(has(marked, "mark_ready(0) names no gradient (this distributed optimizer has none)"));
    } else {
      CHECK(marked == "(no error)");
    }
    CHECK(error_of([&] { opt.step(); }) == "(no error)");
    CHECK(inner.steps == pass + 1);
  }
}

// A rank with no gradients where the others have some: its mark makes the first check, which
// names the difference on every rank (it once raised alone, and the others waited in that check).
template <class C> void no_gradients_on_one_rank_are_named_on_every_rank(C& comm) {
  counting_optimizer inner;
  std::vector<float> g(10, 1.0f);
  herd::distributed_optimizer opt(
      inner, comm.rank() == 1 ? std::vector<herd::buffer_view>{} : herd::views(g), comm);
  const std::string message = error_of([&] {
    opt.mark_ready(0);
    opt.step();
  });
  INFO(message);
  CHECK(has(message, "rank 1"));
  CHECK(has(message, "gradient"));
  CHECK(inner.steps == 0);
}

// Likewise gradients that appear on one rank where the first step had none: the others reduce
// nothing, so that rank raises the change alone, at its step(), and the next step pairs up.
template <class C> void gradients_where_the_first_step_had_none_raise_on_their_rank(C& comm) {
  counting_optimizer inner;
  std::vector<float> extra(3, 1.0f);
  int pass = 0;
  herd::distributed_optimizer opt(
      inner, [&] { return pass == 1 && comm.rank() == 1 ? herd::views(extra) : std::vector<herd::buffer_view>{}; }, comm);
  for (; pass < 3; ++pass) {
    INFO("pass ", pass);
    const std::string message = error_of([&] { opt.step(); });
    if (pass == 1 && comm.rank() == 1) {
      CHECK(has(message, "rank 1"));
      CHECK(has(message, "the gradients changed since the first step"));
    } else {
      CHECK(message == "(no error)");
    }
  }
  CHECK(inner.steps == (comm.rank() == 1 ? 2 : 3));
}

// The marks are checked alike at any number of ranks, one included (as DDP's reducer at world
// size 1): every rank makes the same mistake, step() raises it, nothing steps, and the next pass
// reduces to the exact average. With find_unused_parameters an unmarked gradient becomes zeros.
template <class C> void marks_are_checked_alike_at_any_size(C& comm) {
  const float p = static_cast<float>(comm.size());
  struct mistake {
    const char* what;
    std::vector<std::size_t> marks;
    const char* message;
  };
  const mistake mistakes[] = {
      {"an index past the last", {4, 3, 2, 1, 0, 7}, "mark_ready(7) names no gradient (there are 5)"},
      {"a second mark", {4, 3, 2, 1, 0, 3}, "gradient 3 was marked ready twice in one pass"},
      {"a gradient left unmarked", {4, 3, 1, 0}, "gradient(s) 2 were not marked ready in this backward pass"},
  };
  for (const mistake& m : mistakes) {
    INFO(m.what);
    model grads(comm.rank());
    counting_optimizer inner;
    herd::distributed_optimizer opt(inner, grads.views(), comm, small_buckets());
    for (int pass = 0; pass < 2; ++pass) {  // the first pass also makes the first check
      INFO("pass ", pass);
      const std::string message = error_of([&] {
        for (std::size_t i : m.marks) opt.mark_ready(i);
        opt.step();
      });
      INFO(message);
      CHECK(has(message, m.message));
      CHECK(has(message, "of " + std::to_string(comm.size())));
    }
    CHECK(inner.steps == 0);
    for (auto& g : grads.grads) std::fill(g.begin(), g.end(), static_cast<float>(comm.rank() + 1));
    for (std::size_t i = 5; i-- > 0;) opt.mark_ready(i);
    opt.step();
    CHECK(inner.steps == 1);
    for (const auto& g : grads.grads) CHECK(g.back() == doctest::Approx((p + 1) / 2));
  }
  herd::optimizer_options options = small_buckets();
  options.find_unused_parameters = true;
  model grads(comm.rank());
  counting_optimizer inner;
  herd::distributed_optimizer opt(inner, grads.views(), comm, options);
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& g : grads.grads) std::fill(g.begin(), g.end(), static_cast<float>(comm.rank() + 1));
    for (std::size_t i : {std::size_t{4}, std::size_t{3}, std::size_t{1}, std::size_t{0}}) opt.mark_ready(i);
    opt.step();
    CHECK(inner.steps == pass + 1);
    CHECK(grads.grads[2] == std::vector<float>(2000, 0.0f));
    CHECK(grads.grads[1] == std::vector<float>(30, (p + 1) / 2));
  }
}

// With find_unused_parameters a pass writes into the tensors of the gradients it did not mark
// (zeros, or the others' average): one whose tensor changed since the first step is refused
// before anything is written into it, at any number of ranks.
template <class C> void an_unmarked_gradient_that_changed_is_refused(C& comm) {
  herd::optimizer_options options = small_buckets();
  options.find_unused_parameters = true;
  model grads(comm.rank());
  std::vector<float> small(100, 5.0f);
  int pass = 0;
  counting_optimizer inner;
  herd::distributed_optimizer opt(
      inner,
      [&] {
        std::vector<herd::buffer_view> v = grads.views();
        if (pass == 1 && comm.rank() == comm.size() - 1) v[2] = herd::view_of(small);
        return v;
      },
      comm, options);
  for (; pass < 3; ++pass) {
    INFO("pass ", pass);
    const std::string message = error_of([&] {
      for (std::size_t i : {std::size_t{4}, std::size_t{3}, std::size_t{1}, std::size_t{0}}) opt.mark_ready(i);
      opt.step();
    });
    INFO(message);
    if (pass != 1) {
      CHECK(message == "(no error)");
    } else if (comm.rank() == comm.size() - 1) {
      CHECK(has(message, "gradient 2 changed since the first step (100 f32 instead of 2000 f32)"));
    } else {
      CHECK(has(message, "rank " + std::to_string(comm.size() - 1)));
    }
  }
  CHECK(small == std::vector<float>(100, 5.0f));
  CHECK(inner.steps == 2);
}

// gradient_as_bucket_view: gradients laid out by bucket_layout() in one storage per bucket reduce
// in place (nothing packed), keep that layout after the first step (no rebuild, though the marks
// come in another order), and give the bits of the same gradients reduced by packing.
template <class C> void gradients_in_their_buckets_reduce_in_place(C& comm) {
  herd::optimizer_options options = small_buckets();
  options.gradient_as_bucket_view = true;
  model packed(comm.rank());
  std::vector<std::pair<std::size_t, herd::dtype>> shapes;
  for (const auto& g : packed.grads) shapes.emplace_back(g.size(), herd::dtype::f32);
  const std::vector<herd::gradient_bucket> layout = herd::bucket_layout(shapes, options);
  std::vector<std::vector<std::size_t>> members;
  for (const auto& b : layout) members.push_back(b.members);
  CHECK(members == std::vector<std::vector<std::size_t>>{{4}, {3, 2}, {1, 0}});

  std::vector<std::vector<float>> storage;
  std::vector<herd::buffer_view> views(shapes.size());
  for (const auto& b : layout) {
    storage.emplace_back(b.count);
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      views[b.members[k]] = {storage.back().data() + b.offsets[k], shapes[b.members[k]].first, herd::dtype::f32};
    }
  }
  auto copy_in = [&] {
    for (std::size_t i = 0; i < views.size(); ++i) std::copy(packed.grads[i].begin(), packed.grads[i].end(), static_cast<float*>(views[i].data));
  };
  counting_optimizer inner_a, inner_b;
  herd::distributed_optimizer in_place(inner_a, views, comm, options);
  herd::distributed_optimizer copied(inner_b, packed.views(), comm, small_buckets());
  for (int step = 0; step < 2; ++step) {
    packed.refill(comm.rank(), step);
    for (auto& g : packed.grads) {  // multiples of 2^-10: sums exact in any order, so buckets may differ
      for (float& x : g) x = std::round(x * 1024.0f) / 1024.0f;
    }
    copy_in();
    for (std::size_t i : std::vector<std::size_t>{1, 0, 4, 2, 3}) {
      in_place.mark_ready(i);
      copied.mark_ready(i);
    }
    in_place.step();
    copied.step();
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto* got = static_cast<const float*>(views[i].data);
      CHECK(std::equal(got, got + views[i].count, packed.grads[i].begin()));
    }
  }
  CHECK(in_place.buckets() == members);  // kept: the copied optimizer rebuilt in the marks' order
  CHECK(copied.buckets() != members);
  CHECK(in_place.overlap().packed_bytes == 0);
  CHECK(copied.overlap().packed_bytes > 0);
}

}  // namespace herd_test::overlap
