// local_communicator: point-to-point semantics, barrier, split, and failure propagation.

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

static_assert(herd::communicator<herd::local_communicator>);

TEST_CASE("messages between two ranks with one tag arrive in the order they were sent") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    constexpr int n = 50;
    std::vector<int> values(n);
    std::vector<herd::local_communicator::request> pending;
    for (int i = 0; i < n; ++i) {
      if (comm.rank() == 0) {
        values[static_cast<std::size_t>(i)] = i;
        pending.push_back(comm.isend(&values[static_cast<std::size_t>(i)], sizeof(int), 1, 7));
      } else {
        pending.push_back(comm.irecv(&values[static_cast<std::size_t>(i)], sizeof(int), 0, 7));
      }
    }
    for (auto& r : pending) comm.wait(r);
    if (comm.rank() == 1)
      for (int i = 0; i < n; ++i) CHECK(values[static_cast<std::size_t>(i)] == i);
  });
}

TEST_CASE("tags keep messages apart and test() reports completion") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    if (comm.rank() == 0) {
      const int one = 1;
      const int two = 2;
      herd::barrier(comm);
      auto s2 = comm.isend(&two, sizeof two, 1, 2);
      auto s1 = comm.isend(&one, sizeof one, 1, 1);
      comm.wait(s2);
      comm.wait(s1);
    } else {
      int a = 0;
      int b = 0;
      auto r1 = comm.irecv(&a, sizeof a, 0, 1);  // posted first, but only tag 1 may match it
      auto r2 = comm.irecv(&b, sizeof b, 0, 2);
      CHECK_FALSE(comm.test(r1));
      herd::barrier(comm);
      comm.wait(r2);
      CHECK(b == 2);
      while (!comm.test(r1)) {
      }
      CHECK(a == 1);
    }
  });
}

TEST_CASE("a message larger than its receive buffer is an error on both sides") {
  std::vector<std::string> errors(2);
  herd::local::run(2, [&](herd::local_communicator& comm) {
    std::vector<char> buffer(16);
    try {
      if (comm.rank() == 0) {
        auto r = comm.isend(buffer.data(), 16, 1, 3);
        comm.wait(r);
      } else {
        auto r = comm.irecv(buffer.data(), 8, 0, 3);
        comm.wait(r);
      }
    } catch (const herd::error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK(e.find("does not fit") != std::string::npos);
}

TEST_CASE("barrier holds every rank until all arrive") {
  for (int p = 1; p <= 7; ++p) {
    std::atomic<int> arrived{0};
    std::atomic<int> early{0};
    herd::local::run(p, [&](herd::local_communicator& comm) {
      arrived++;
      herd::barrier(comm);
      if (arrived.load() != p) early++;
    });
    CHECK(early.load() == 0);
  }
}

TEST_CASE("split groups ranks by color and orders them by key") {
  std::vector<int> new_rank(6, -1);
  std::vector<int> new_size(6, -1);
  std::vector<double> sums(6, 0);
  herd::local::run(6, [&](herd::local_communicator& comm) {
    const int r = comm.rank();
    // Colors: even and odd ranks. Keys reverse the order.
    auto part = comm.split(r % 2, -r);
    new_rank[static_cast<std::size_t>(r)] = part.rank();
    new_size[static_cast<std::size_t>(r)] = part.size();
    std::vector<double> v{static_cast<double>(r)};
    herd::allreduce(v, part);
    sums[static_cast<std::size_t>(r)] = v[0];
  });
  const int expected_rank[6] = {2, 2, 1, 1, 0, 0};
  for (std::size_t r = 0; r < 6; ++r) {
    CHECK(new_size[r] == 3);
    CHECK(new_rank[r] == expected_rank[r]);
    CHECK(sums[r] == (r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
  }
}

TEST_CASE("an exception on one rank is rethrown by run() and releases the others") {
  const auto start = std::chrono::steady_clock::now();
  std::atomic<int> released{0};
  try {
    herd::local::run(4, [&](herd::local_communicator& comm) {
      std::vector<float> v(10, 1.0f);
      try {
        herd::allreduce(v, comm);  // every rank has created its communicator (not a must: run() releases those too)
        if (comm.rank() == 2) throw std::runtime_error("rank two gives up");
        herd::allreduce(v, comm);  // waits for rank 2 forever, unless released
      } catch (const herd::error& e) {
        if (std::string(e.what()).find("rank 2 failed") != std::string::npos) released++;
        throw;
      }
    });
    FAIL("run() returned normally");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "rank two gives up");
  }
  CHECK(released.load() == 3);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("a rank that waits for a peer that never sends gives up after the stall shutdown time") {
  herd::comm_options options;
  options.stall_check_seconds = 0;
  options.stall_shutdown_seconds = 0.5;
  std::string message;
  herd::local::run(
      2,
      [&](herd::local_communicator& comm) {
        if (comm.rank() == 0) {
          int x = 0;
          auto r = comm.irecv(&x, sizeof x, 1, 5);
          try {
            comm.wait(r);
          } catch (const herd::error& e) {
            message = e.what();
          }
        }
      },
      options);
  CHECK(message.find("waited") != std::string::npos);
  CHECK(message.find("receive from rank 1") != std::string::npos);
  CHECK(message.find("HERD_STALL_SHUTDOWN_TIME_SECONDS") != std::string::npos);
}

TEST_CASE("wait() and test() on a communicator that was left raise herd::error") {
  std::vector<std::string> messages(2);
  herd::local::run(2, [&](herd::local_communicator& comm) {
    int x = 0;
    auto r = comm.irecv(&x, sizeof x, 1 - comm.rank(), 5);  // nothing is ever sent
    comm.leave();
    for (int i = 0; i < 2; ++i) {
      try {
        if (i == 0) comm.wait(r);
        else (void)comm.test(r);
        messages[static_cast<std::size_t>(comm.rank())] += "(no error)";
      } catch (const herd::error& e) {
        messages[static_cast<std::size_t>(comm.rank())] += e.what();
      }
    }
  });
  for (const std::string& m : messages) {
    INFO(m);
    CHECK(m.find("(no error)") == std::string::npos);
    CHECK(m.find("this communicator is empty: it was moved from, or left (leave())") != std::string::npos);
  }
}

TEST_CASE("run() refuses fewer than one rank") {
  CHECK_THROWS_AS(herd::local::run(0, [](herd::local_communicator&) {}), herd::error);
}
