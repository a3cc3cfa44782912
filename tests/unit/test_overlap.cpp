// The distributed optimizer's buckets (mark_ready) on threads: the plan DDP would make, and the
// cases of support/overlap_cases.hpp at 2 and 3 ranks (tests/mpi/test_mpi_overlap.cpp runs the
// same on MPI ranks).

#include <herd/herd.hpp>

#include "../support/overlap_cases.hpp"

#include <doctest/doctest.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace {

template <class Case> void on_threads(Case run_case, std::initializer_list<int> rank_counts = {2, 3}) {
  for (int p : rank_counts) {
    INFO(p, " ranks");
    herd::local::run(p, [&](herd::local_communicator& comm) { run_case(comm); });
  }
}

}  // namespace

TEST_CASE("bucket plan: reverse order, the first bucket small, a cap for the rest, dtypes apart, large gradients alone") {
  using herd::dtype;
  const std::vector<std::pair<std::size_t, dtype>> shapes = {
      {100, dtype::f32}, {300, dtype::f32}, {10, dtype::f64}, {1000, dtype::f32}, {50, dtype::f32}, {20, dtype::f64}};
  const auto plan = herd::detail::bucket_plan::make(shapes, herd::detail::bucket_plan::reverse_order(6), 256, 2000, 16);
  // Reverse order: 5 (f64, 160 B) opens the first f64 bucket; 4 (f32, 200 B) the first f32 bucket,
  // which 3 (4000 B) closes past its 256 B; 2 (f64) joins the f64 bucket (240 B: still open); 1 and
  // 0 fill a new f32 bucket (1600 B, under the 2000 B cap).
  REQUIRE(plan.buckets.size() == 3);
  CHECK(plan.buckets[0].members == std::vector<std::size_t>{5, 2});
  CHECK(plan.buckets[1].members == std::vector<std::size_t>{4, 3});
  CHECK(plan.buckets[2].members == std::vector<std::size_t>{1, 0});
  // Members start at multiples of 16 bytes: 3 after 4's 50 elements (200 B) and 8 bytes of padding.
  CHECK(plan.buckets[1].offsets == std::vector<std::size_t>{0, 52});
  CHECK(plan.buckets[1].count == 1052);
  CHECK(plan.bucket_of[3] == 1);
  CHECK(plan.slot_of[0] == 1);
}

TEST_CASE("buckets: marks in any order give the bits of a blocking reduction; rebuilt from rank 0's order") {
  on_threads([](auto& comm) { herd_test::overlap::marks_in_any_order_give_the_blocking_bits(comm); });
}

TEST_CASE("buckets: integer-valued gradients reduce to the bits of the fusion buffer") {
  on_threads([](auto& comm) { herd_test::overlap::buckets_equal_fusion_on_exact_values(comm); });
}

TEST_CASE("buckets: a gradient never marked ready is an error on every rank naming it") {
  on_threads([](auto& comm) { herd_test::overlap::unmarked_gradient_is_an_error_everywhere(comm); });
}

TEST_CASE("buckets: with find_unused_parameters a gradient a rank did not produce counts as zeros") {
  on_threads([](auto& comm) { herd_test::overlap::unused_gradient_counts_as_zeros(comm); });
}

TEST_CASE("buckets: with find_unused_parameters they keep their first plan (rebuilt only with static_graph), as DDP's") {
  on_threads([](auto& comm) { herd_test::overlap::unused_parameters_keep_the_first_buckets(comm); });
}

TEST_CASE("buckets: no_sync accumulates, the next step reduces the sum") {
  on_threads([](auto& comm) { herd_test::overlap::no_sync_accumulates_then_reduces_the_sum(comm); });
}

TEST_CASE("buckets: a bad gradient found when it is marked reaches step() on every rank") {
  on_threads([](auto& comm) { herd_test::overlap::a_bad_gradient_in_a_bucket_reaches_step_everywhere(comm); });
}

TEST_CASE("buckets: mark_ready with an index that names no gradient reaches step() on every rank") {
  on_threads([](auto& comm) { herd_test::overlap::an_invalid_mark_reaches_step_everywhere(comm); });
}

TEST_CASE("buckets: a bad mark after the last gradient reaches step() on every rank") {
  on_threads([](auto& comm) { herd_test::overlap::a_bad_mark_after_the_last_gradient_reaches_step_everywhere(comm); });
}

TEST_CASE("buckets: with no gradients, a bad mark is raised at once by its rank, and the steps still pair up") {
  on_threads([](auto& comm) { herd_test::overlap::a_bad_mark_with_no_gradients_raises_at_once(comm); });
}

TEST_CASE("buckets: marks are checked alike at 1, 2 and 3 ranks, and an unmarked gradient with find_unused_parameters becomes zeros") {
  on_threads([](auto& comm) { herd_test::overlap::marks_are_checked_alike_at_any_size(comm); }, {1, 2, 3});
}

TEST_CASE("buckets: with find_unused_parameters, an unmarked gradient whose tensor changed is refused before it is written") {
  on_threads([](auto& comm) { herd_test::overlap::an_unmarked_gradient_that_changed_is_refused(comm); }, {1, 2, 3});
}

TEST_CASE("buckets: a rank with no gradients where the others have some is named on every rank") {
  on_threads([](auto& comm) { herd_test::overlap::no_gradients_on_one_rank_are_named_on_every_rank(comm); });
}

TEST_CASE("with no gradients at the first step, gradients that appear on one rank raise there alone") {
  on_threads([](auto& comm) { herd_test::overlap::gradients_where_the_first_step_had_none_raise_on_their_rank(comm); });
}

TEST_CASE("buckets: gradients laid out by bucket_layout reduce in place and keep their buckets") {
  on_threads([](auto& comm) { herd_test::overlap::gradients_in_their_buckets_reduce_in_place(comm); });
}
