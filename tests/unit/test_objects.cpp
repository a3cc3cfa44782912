// allgather_object and broadcast_object on local_communicator: strings, vectors (nested too) and
// trivially copyable structs; types or roots that differ across ranks raise on every rank.

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/object.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include "../support/checks.hpp"
#include "../support/native_stand_in.hpp"

#include <doctest/doctest.h>

#include <array>
#include <string>
#include <vector>

using herd_test::has;

namespace {

struct progress {
  int epoch;
  double loss;
  bool operator==(const progress&) const = default;
};

// Two structs of one shape (size, alignment, kind), their fields in another order.
struct id_weight {
  int id;
  float weight;
};
struct weight_id {
  float weight;
  int id;
};

}  // namespace

TEST_CASE("allgather_object returns every rank's value in rank order") {
  for (int p = 1; p <= 4; ++p) {
    herd::local::run(p, [p](herd::local_communicator& comm) {
      const int r = comm.rank();
      const std::vector<std::string> names = herd::allgather_object(std::string(static_cast<std::size_t>(r), 'x'), comm);
      const std::vector<progress> states = herd::allgather_object(progress{r, 0.5 * r}, comm);
      std::vector<std::vector<std::string>> nested(static_cast<std::size_t>(r), std::vector<std::string>{"a", ""});
      const auto all_nested = herd::allgather_object(nested, comm);
      REQUIRE(names.size() == static_cast<std::size_t>(p));
      for (int q = 0; q < p; ++q) {
        const auto at = static_cast<std::size_t>(q);
        CHECK(names[at] == std::string(at, 'x'));
        CHECK(states[at] == progress{q, 0.5 * q});
        CHECK(all_nested[at] == std::vector<std::vector<std::string>>(at, std::vector<std::string>{"a", ""}));
      }
      const auto bits = herd::allgather_object(std::vector<bool>{r == 0, true}, comm);
      CHECK(bits[0] == std::vector<bool>{true, true});
      if (p > 1) CHECK(bits[1] == std::vector<bool>{false, true});
    });
  }
}

TEST_CASE("broadcast_object gives every rank the root's value") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    const bool root = comm.rank() == 2;
    progress s = root ? progress{7, 0.25} : progress{0, 0.0};
    std::string text = root ? "resume from epoch 7" : "something longer than the root's text, to be replaced";
    std::vector<std::vector<int>> table = root ? std::vector<std::vector<int>>{{1}, {}, {2, 3}} : std::vector<std::vector<int>>{};
    herd::broadcast_object(s, comm, 2);
    herd::broadcast_object(text, comm, 2);
    herd::broadcast_object(table, comm, 2);
    CHECK(s == progress{7, 0.25});
    CHECK(text == "resume from epoch 7");
    CHECK(table == std::vector<std::vector<int>>{{1}, {}, {2, 3}});
  });
}

TEST_CASE("objects of different types or roots raise on every rank, and the communicator goes on") {
  std::vector<std::string> gathered(3), broadcast(3), roots(3), same_shape(3);
  herd::local::run(3, [&](herd::local_communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    try {
      if (r == 1) (void)herd::allgather_object(std::vector<int>{1}, comm);
      else (void)herd::allgather_object(std::string("a"), comm);
    } catch (const herd::error& e) {
      gathered[r] = e.what();
    }
    try {
      if (r == 2) {
        float x = 1;
        herd::broadcast_object(x, comm, 0);
      } else {
        int x = 1;
        herd::broadcast_object(x, comm, 0);
      }
    } catch (const herd::error& e) {
      broadcast[r] = e.what();
    }
    try {
      std::string s = "x";
      herd::broadcast_object(s, comm, r == 0 ? 1 : 0);
    } catch (const herd::error& e) {
      roots[r] = e.what();
    }
    // Of one shape, told apart by their names.
    try {
      if (r == 2) (void)herd::allgather_object(id_weight{1, 2.0f}, comm);
      else (void)herd::allgather_object(weight_id{2.0f, 1}, comm);
    } catch (const herd::error& e) {
      same_shape[r] += e.what();
    }
    try {
      if (r == 1) {
        std::array<int, 2> a{1, 2};
        herd::broadcast_object(a, comm, 0);
      } else {
        std::array<float, 2> a{1, 2};
        herd::broadcast_object(a, comm, 0);
      }
    } catch (const herd::error& e) {
      same_shape[r] += e.what();
    }
    try {
      if (r == 0) (void)herd::allgather_object(std::vector<bool>{true}, comm);
      else (void)herd::allgather_object(std::vector<unsigned char>{1}, comm);
    } catch (const herd::error& e) {
      same_shape[r] += e.what();
    }
    std::vector<int> one{1};
    herd::allreduce(one, comm);
    CHECK(one[0] == 3);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    INFO(gathered[r], "\n", broadcast[r], "\n", roots[r]);
    CHECK(has(gathered[r], "herd::allgather_object on rank " + std::to_string(r) + " of 3: rank 1 passed a value of another type than rank 0"));
    CHECK(has(broadcast[r], "herd::broadcast_object on rank " + std::to_string(r) + " of 3: rank 2 passed a value of another type than rank 0"));
    CHECK(has(roots[r], "the root differs across ranks (rank 0: 1, rank 1: 0, rank 2: 0)"));
    INFO(same_shape[r]);
    CHECK(has(same_shape[r], "herd::allgather_object on rank " + std::to_string(r) + " of 3: rank 2 passed a value of another type than rank 0"));
    CHECK(has(same_shape[r], "herd::broadcast_object on rank " + std::to_string(r) + " of 3: rank 1 passed a value of another type than rank 0"));
    CHECK(has(same_shape[r], "herd::allgather_object on rank " + std::to_string(r) + " of 3: rank 1 passed a value of another type than rank 0"));
  }
}

TEST_CASE("objects travel over the control channel of a communicator with native collectives") {
  herd::local::run(2, [](herd::local_communicator& host) {
    herd_test::native_stand_in comm(host);
    const auto names = herd::allgather_object(std::string(host.rank() == 0 ? "gpu0" : "gpu1"), comm);
    CHECK(names == std::vector<std::string>{"gpu0", "gpu1"});
    std::string text = host.rank() == 1 ? "from 1" : "";
    herd::broadcast_object(text, comm, 1);
    CHECK(text == "from 1");
    CHECK(comm.calls.empty());
  });
}
