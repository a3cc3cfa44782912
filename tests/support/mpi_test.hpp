#pragma once
// HERD_MPI_TEST_CASE("name", N): a test that needs at least N ranks (skipped with fewer).
// Its body runs on every rank of MPI_COMM_WORLD.
#include <doctest/doctest.h>

#define HERD_MPI_TEST_CASE(name, min_ranks) TEST_CASE(name " [ranks>=" #min_ranks "]")
