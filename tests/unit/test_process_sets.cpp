// Process sets on local_communicator: split(herd::no_color) leaves ranks out, subset(ranks) keeps
// the listed ones in the listed order; a rank left out holds a communicator it is not a member of,
// on which everything raises herd::error; the members' communicator works, and so do later
// splits of the parent.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/gather.hpp>
#include <herd/collectives/object.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include "../support/checks.hpp"

#include <chrono>
#include <string>
#include <vector>

using herd_test::has;

namespace {

// Every operation on a communicator this rank is not a member of raises, saying so.
void check_refuses_everything(herd::local_communicator& outside) {
  CHECK_FALSE(outside.is_member());
  CHECK(outside.rank() == -1);
  CHECK(outside.size() == 0);
  std::vector<float> v(4, 1.0f), all(8);
  auto refused = [](auto&& op) {
    try {
      op();
    } catch (const herd::error& e) {
      INFO(e.what());
      CHECK(has(e.what(), "this rank is not a member of this communicator"));
      CHECK(has(e.what(), "comm.is_member()"));
      CHECK(e.rank() == -1);
      return;
    }
    FAIL_CHECK("no error");
  };
  refused([&] { herd::allreduce(v, outside); });
  refused([&] { (void)herd::allreduce_async(v, outside); });
  refused([&] { herd::gather(v, all, outside, 0); });
  refused([&] { (void)herd::allgather_object(1, outside); });
  refused([&] { herd::barrier(outside); });
  refused([&] { (void)outside.split(0, 0); });
  refused([&] { (void)outside.subset({0}); });
  refused([&] { (void)outside.renew(); });
  refused([&] { (void)outside.isend(v.data(), 4, 0, 1); });
  refused([&] { (void)outside.options(); });
}

}  // namespace

TEST_CASE("split with no_color leaves ranks out; the members' communicator works, and later splits too") {
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> sizes(5, -2);
  std::vector<int> ranks(5, -2);
  herd::local::run(5, [&](herd::local_communicator& comm) {
    const int r = comm.rank();
    // Ranks 1 and 3 are left out; the others are ordered by descending rank.
    herd::local_communicator part = comm.split(r % 2 == 1 ? herd::no_color : 7, -r);
    sizes[static_cast<std::size_t>(r)] = part.size();
    ranks[static_cast<std::size_t>(r)] = part.rank();
    if (part.is_member()) {
      std::vector<int> v{r};
      herd::allreduce(v, part);
      CHECK(v[0] == 0 + 2 + 4);
    } else {
      check_refuses_everything(part);
    }
    // The parent goes on; so does its next split, which the left-out ranks take part in.
    herd::local_communicator all = comm.split(0, r);
    std::vector<int> one{1};
    herd::allreduce(one, all);
    CHECK(one[0] == 5);
    herd::barrier(comm);
  });
  CHECK(sizes == std::vector<int>{3, 0, 3, 0, 3});
  CHECK(ranks == std::vector<int>{2, -1, 1, -1, 0});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("every rank left out, and a non-member moved around") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    herd::local_communicator none = comm.split(herd::no_color, 0);
    check_refuses_everything(none);
    herd::local_communicator moved = std::move(none);
    check_refuses_everything(moved);
    herd::barrier(comm);
  });
}

TEST_CASE("subset keeps the listed ranks in the listed order") {
  std::vector<std::vector<std::int32_t>> seen(4);
  herd::local::run(4, [&](herd::local_communicator& comm) {
    herd::local_communicator set = comm.subset({3, 0, 2});
    CHECK(set.is_member() == (comm.rank() != 1));
    if (!set.is_member()) return check_refuses_everything(set);
    CHECK(set.size() == 3);
    const std::int32_t mine = comm.rank();
    std::vector<std::int32_t> all(3);
    herd::allgather(std::vector<std::int32_t>{mine}, all, set);
    seen[static_cast<std::size_t>(comm.rank())] = all;
    // A subset of a subset: the new ranks 0 and 2 (the old 3 and 2).
    herd::local_communicator pair = set.subset({2, 0});
    if (pair.is_member()) {
      std::vector<std::int32_t> two(2);
      herd::allgather(std::vector<std::int32_t>{mine}, two, pair);
      CHECK(two == std::vector<std::int32_t>{2, 3});
    }
  });
  for (int r : {0, 2, 3}) CHECK(seen[static_cast<std::size_t>(r)] == std::vector<std::int32_t>{3, 0, 2});
}

TEST_CASE("bad colors and lists raise on every rank, and the communicator goes on") {
  auto errors = [](int p, auto body) {
    std::vector<std::string> messages(static_cast<std::size_t>(p));
    herd::local::run(p, [&](herd::local_communicator& comm) {
      try {
        body(comm);
      } catch (const herd::error& e) {
        messages[static_cast<std::size_t>(comm.rank())] = e.what();
      }
      std::vector<int> one{1};
      herd::allreduce(one, comm);
      CHECK(one[0] == p);
    });
    return messages;
  };
  for (const auto& m : errors(3, [](herd::local_communicator& comm) { (void)comm.split(comm.rank() == 1 ? -1 : 0, 0); })) {
    INFO(m);
    CHECK(has(m, "herd::split on rank"));
    CHECK(has(m, "rank 1 passed the negative color -1"));
    CHECK(has(m, "herd::no_color to leave a rank out"));
  }
  for (const auto& m : errors(3, [](herd::local_communicator& comm) {
         (void)comm.subset(comm.rank() == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1});
       })) {
    INFO(m);
    CHECK(has(m, "herd::subset on rank"));
    CHECK(has(m, "the list of ranks differs across ranks (rank 2's is not rank 0's)"));
  }
  for (const auto& m : errors(2, [](herd::local_communicator& comm) { (void)comm.subset({0, 2}); })) {
    CHECK(has(m, "the list of ranks names rank 2, which is out of range"));
  }
  for (const auto& m : errors(2, [](herd::local_communicator& comm) { (void)comm.subset({1, 1}); })) {
    CHECK(has(m, "the list of ranks names rank 1 twice"));
  }
  for (const auto& m : errors(2, [](herd::local_communicator& comm) { (void)comm.subset({}); })) {
    CHECK(has(m, "the list of ranks is empty"));
  }
}
