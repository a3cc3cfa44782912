// The distributed optimizer's buckets (mark_ready) on real MPI ranks: the cases of
// support/overlap_cases.hpp (tests/unit/test_overlap.cpp runs the same on threads).

#include <herd/herd.hpp>

#include "../support/mpi_test.hpp"
#include "../support/overlap_cases.hpp"

HERD_MPI_TEST_CASE("buckets: marks in any order give the bits of a blocking reduction; rebuilt from rank 0's order", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::marks_in_any_order_give_the_blocking_bits(comm);
}

HERD_MPI_TEST_CASE("buckets: integer-valued gradients reduce to the bits of the fusion buffer", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::buckets_equal_fusion_on_exact_values(comm);
}

HERD_MPI_TEST_CASE("buckets: a gradient never marked ready is an error on every rank naming it", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::unmarked_gradient_is_an_error_everywhere(comm);
}

HERD_MPI_TEST_CASE("buckets: with find_unused_parameters a gradient a rank did not produce counts as zeros", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::unused_gradient_counts_as_zeros(comm);
}

HERD_MPI_TEST_CASE("buckets: no_sync accumulates, the next step reduces the sum", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::no_sync_accumulates_then_reduces_the_sum(comm);
}

HERD_MPI_TEST_CASE("buckets: a bad gradient found when it is marked reaches step() on every rank", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::a_bad_gradient_in_a_bucket_reaches_step_everywhere(comm);
}

HERD_MPI_TEST_CASE("buckets: a bad mark after the last gradient reaches step() on every rank", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::a_bad_mark_after_the_last_gradient_reaches_step_everywhere(comm);
}

HERD_MPI_TEST_CASE("buckets: with no gradients, a bad mark is raised at once by its rank, and the steps still pair up", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::a_bad_mark_with_no_gradients_raises_at_once(comm);
}

HERD_MPI_TEST_CASE("buckets: marks are checked alike at any number of ranks, one included", 1) {
  herd::mpi_communicator comm;
  herd_test::overlap::marks_are_checked_alike_at_any_size(comm);
}

HERD_MPI_TEST_CASE("buckets: with find_unused_parameters, an unmarked gradient whose tensor changed is refused", 1) {
  herd::mpi_communicator comm;
  herd_test::overlap::an_unmarked_gradient_that_changed_is_refused(comm);
}

HERD_MPI_TEST_CASE("buckets: a rank with no gradients where the others have some is named on every rank", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::no_gradients_on_one_rank_are_named_on_every_rank(comm);
}

HERD_MPI_TEST_CASE("with no gradients at the first step, gradients that appear on one rank raise there alone", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::gradients_where_the_first_step_had_none_raise_on_their_rank(comm);
}

HERD_MPI_TEST_CASE("buckets: gradients laid out by bucket_layout reduce in place and keep their buckets", 2) {
  herd::mpi_communicator comm;
  herd_test::overlap::gradients_in_their_buckets_reduce_in_place(comm);
}
