// Collectives as operations, on local_communicator: identities and order checked across ranks,
// protocol options agreed at creation, aborts that reach every rank, departures noticed, a
// renewed communicator that computes the right bits, asynchronous operations in order, and the
// grouped allreduce.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/comm/local.hpp>
#include <herd/core/detail/function_ref.hpp>
#include <herd/runtime/elastic.hpp>
#include <herd/tensor/std.hpp>

#include "../support/local_errors.hpp"
#include "../support/elastic_training.hpp"
#include "../support/faulty_communicator.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

using herd_test::errors_per_rank;
using herd_test::has;

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Integer-valued floats: every order of summation gives the same bits.
std::vector<float> ramp(std::size_t n, int rank) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i % 1000) - 500 + 7 * rank);
  return v;
}

std::vector<float> ramp_sum(std::size_t n, int p) {
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < p; ++r) {
    const auto v = ramp(n, r);
    for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

herd::comm_options impatient() {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 0.5;
  o.ring_segment_bytes = 64 << 10;  // many segments: the fault lands mid-ring
  return o;
}

}  // namespace

// The engine's callbacks go through function_ref (an operation's body, the ranks' operands of a
// reduction): it must call the very object it was made from, with the arguments given, and give
// back its result converted to the declared type.
TEST_CASE("function_ref calls the callable it refers to, with its arguments and result") {
  int calls = 0;
  auto count = [&calls](int by) {
    calls += by;
    return calls;  // an int result, dropped by a ref that returns void
  };
  const herd::detail::function_ref<void(int)> add(count);
  add(2);
  add(3);
  CHECK(calls == 5);

  std::vector<std::byte> first(4), second(4);
  auto where = [&](int q) { return q == 0 ? first.data() : second.data(); };  // std::byte*, taken as const
  const herd::detail::operand_ref operand(where);
  CHECK(operand(0) == first.data());
  CHECK(operand(1) == second.data());

  // A callable that keeps state between calls: the ref must reach the same object each time.
  struct counter {
    int n = 0;
    int operator()() { return ++n; }
  } state;
  const herd::detail::function_ref<int()> next(state);
  CHECK(next() == 1);
  CHECK(next() == 2);
  CHECK(state.n == 2);
}

TEST_CASE("ranks in different operations: allreduce against barrier, and a skipped collective") {
  for (const auto& m : errors_per_rank(2, [](herd::local_communicator& comm) {
         std::vector<float> v(1 << 20);
         if (comm.rank() == 0) herd::allreduce(v, comm);
         else herd::barrier(comm);
       })) {
    INFO(m);
    CHECK(has(m, "the ranks are in different operations: rank 0 is in allreduce #1 (4 MiB f32), rank 1 in barrier #1"));
  }
  // Rank 1 skips the first allreduce: the next operation already tells.
  for (const auto& m : errors_per_rank(3, [](herd::local_communicator& comm) {
         std::vector<double> grad(100);
         std::vector<int> step(1);
         if (comm.rank() != 1) herd::allreduce(grad, comm);
         herd::broadcast(step, comm, 0);
       })) {
    INFO(m);
    CHECK(has(m, "rank 0 is in allreduce #1 (800 B f64), rank 1 in broadcast #1 (4 B i32), rank 2 in allreduce #1"));
  }
}

TEST_CASE("an agreed error leaves the communicator usable; the sequence goes on alike on every rank") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    std::vector<float> wrong(comm.rank() == 2 ? 5 : 6);
    CHECK_THROWS_AS(herd::allreduce(wrong, comm), herd::error);
    CHECK_FALSE(comm.operations().aborted());
    std::vector<float> v = ramp(3000, comm.rank());
    herd::allreduce(v, comm);
    CHECK(v == ramp_sum(3000, 3));
    CHECK(comm.operations().issued() == 3);  // the creation is #0; the failed allreduce counted as #1
  });
}

TEST_CASE("differing protocol options are an error at creation on every rank, naming the variable") {
  auto create_pair = [](herd::comm_options zero, herd::comm_options one) {
    auto w = std::make_shared<herd::detail::local::world>(2);
    std::vector<std::string> messages(2);
    std::thread other([&] {
      try {
        herd::local_communicator c(w, 1, one);
      } catch (const herd::error& e) {
        messages[1] = e.what();
      }
    });
    try {
      herd::local_communicator c(w, 0, zero);
    } catch (const herd::error& e) {
      messages[0] = e.what();
    }
    other.join();
    return messages;
  };
  herd::comm_options checks_off;
  checks_off.check_arguments = false;
  for (const auto& m : create_pair({}, checks_off)) {
    INFO(m);
    CHECK(has(m, "HERD_CHECK_ARGUMENTS differs across ranks (rank 0: 1, rank 1: 0)"));
  }
  herd::comm_options small_segments;
  small_segments.ring_segment_bytes = 4096;
  for (const auto& m : create_pair(small_segments, {})) {
    INFO(m);
    CHECK(has(m, "HERD_RING_SEGMENT_BYTES differs across ranks (rank 0: 4096, rank 1: 1048576)"));
  }
}

TEST_CASE("a malformed HERD_ variable is kept as a problem, not thrown, when the settings are read") {
  ::setenv("HERD_RING_SEGMENT_BYTES", "lots", 1);
  const herd::runtime::settings s = herd::runtime::read_settings();
  ::unsetenv("HERD_RING_SEGMENT_BYTES");
  CHECK(has(s.problem, "HERD_RING_SEGMENT_BYTES='lots' is not a whole number"));
  CHECK(s.ring_segment_bytes == herd::runtime::settings{}.ring_segment_bytes);
  CHECK(herd::runtime::read_settings().problem.empty());
}

TEST_CASE("HERD_ variables: bytes and ranks are whole numbers, flags 0 or 1; each refusal says what to give") {
  struct variable_case {
    const char* variable;
    const char* value;
    const char* words;  // in the problem; empty: none
  };
  const variable_case cases[] = {
      {"HERD_RING_SEGMENT_BYTES", "0.5", "HERD_RING_SEGMENT_BYTES='0.5' is not a whole number between 0 and 1e15; unset it or give one such as 1048576"},
      {"HERD_SIMULATE_NODE_SIZE", "1.5", "HERD_SIMULATE_NODE_SIZE='1.5' is not a whole number"},
      {"HERD_SHM_SLICE_BYTES", "65536.5", "HERD_SHM_SLICE_BYTES='65536.5' is not a whole number"},
      {"HERD_FUSION_THRESHOLD", "1e3", ""},
      {"HERD_BUCKET_BYTES", "0", "HERD_BUCKET_BYTES=0 leaves no room in a bucket; unset it for the default (26214400), or give"},
      {"HERD_PROGRESS_THREAD", "2", "HERD_PROGRESS_THREAD='2' is neither 0 nor 1; unset it, or give 1 (on) or 0 (off)"},
      {"HERD_CHECK_ARGUMENTS", "yes", "HERD_CHECK_ARGUMENTS='yes' is neither 0 nor 1; unset it, or give 1 (on) or 0 (off)"},
      {"HERD_PROGRESS_THREAD", "0", ""},
      {"HERD_STALL_SHUTDOWN_TIME_SECONDS", "soon", "HERD_STALL_SHUTDOWN_TIME_SECONDS='soon' is not a number of seconds between 0 and 1e15; unset it or give one such as 60"},
      {"HERD_STALL_SHUTDOWN_TIME_SECONDS", "0.25", ""},
      {"HERD_SIMULATE_NODE_SIZE", "2", ""},
      // Decimal only: what strtod would also take is refused.
      {"HERD_RING_SEGMENT_BYTES", "0x10", "HERD_RING_SEGMENT_BYTES='0x10' is not a whole number"},
      {"HERD_RING_SEGMENT_BYTES", "0x1p4", "HERD_RING_SEGMENT_BYTES='0x1p4' is not a whole number"},
      {"HERD_RING_SEGMENT_BYTES", "+5", "HERD_RING_SEGMENT_BYTES='+5' is not a whole number"},
      {"HERD_RING_SEGMENT_BYTES", " 60", "HERD_RING_SEGMENT_BYTES=' 60' is not a whole number"},
      {"HERD_RING_SEGMENT_BYTES", "\t7", "is not a whole number"},
      {"HERD_STALL_SHUTDOWN_TIME_SECONDS", "inf", "HERD_STALL_SHUTDOWN_TIME_SECONDS='inf' is not a number of seconds"},
      {"HERD_STALL_SHUTDOWN_TIME_SECONDS", "nan", "HERD_STALL_SHUTDOWN_TIME_SECONDS='nan' is not a number of seconds"},
      {"HERD_STALL_SHUTDOWN_TIME_SECONDS", ".5", ""},
      {"HERD_RING_SEGMENT_BYTES", "1e+6", ""},
  };
  for (const variable_case& c : cases) {
    ::setenv(c.variable, c.value, 1);
    const herd::runtime::settings s = herd::runtime::read_settings();
    ::unsetenv(c.variable);
    INFO(c.variable, "=", c.value, ": ", s.problem);
    if (*c.words == '\0') {
      CHECK(s.problem.empty());
    } else {
      CHECK(has(s.problem, c.words));
      CHECK(!has(s.problem, "such as 60") == (std::string(c.variable).find("SECONDS") == std::string::npos));
    }
  }
  ::setenv("HERD_PROGRESS_THREAD", "0", 1);
  CHECK(!herd::runtime::read_settings().progress_thread);
  ::setenv("HERD_FUSION_THRESHOLD", "1e3", 1);
  CHECK(herd::runtime::read_settings().fusion_threshold_bytes == 1000);
  ::setenv("HERD_SIMULATE_NODE_SIZE", "2", 1);
  CHECK(herd::runtime::read_settings().simulated_node_size == 2);
  ::unsetenv("HERD_PROGRESS_THREAD");
  ::unsetenv("HERD_FUSION_THRESHOLD");
  ::unsetenv("HERD_SIMULATE_NODE_SIZE");
}

TEST_CASE("a shutdown time below a tenth of a second is refused at creation; 0 (never) and 0.1 are taken") {
  for (double seconds : {1e-9, 0.05, 0.0, 0.1}) {
    herd::comm_options o;
    o.stall_shutdown_seconds = seconds;
    const std::string message = herd_test::error_of([&] { herd::local::run(2, [](herd::local_communicator&) {}, o); });
    INFO(seconds, ": ", message);
    if (seconds == 0.0 || seconds >= 0.1) {
      CHECK(message == "(no herd::error)");
    } else {
      CHECK(has(message, "comm_options::stall_shutdown_seconds (HERD_STALL_SHUTDOWN_TIME_SECONDS) is "));
      CHECK(has(message, "; give 0 (never give up) or seconds between 0.1 and 1e15"));
    }
  }
}

TEST_CASE("the watchdog's warning says what comes next: the error after the shutdown time, or none when it is 0") {
  for (double shutdown : {0.0, 5.0}) {
    herd::comm_options o;
    o.stall_check_seconds = 0.05;
    o.stall_shutdown_seconds = shutdown;
    const std::string warned = herd_test::stderr_of([&] {
      herd::local::run(
          2,
          [](herd::local_communicator& comm) {
            if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
            std::vector<float> v(4, 1.0f);
            herd::allreduce(v, comm);
          },
          o);
    });
    INFO(shutdown, ": ", warned);
    CHECK(has(warned, "herd warning: rank 0 has waited "));
    if (shutdown == 0) {
      CHECK(has(warned, "herd waits on (HERD_STALL_SHUTDOWN_TIME_SECONDS=0: it never gives up)"));
      CHECK(!has(warned, "raises an error"));
    } else {
      CHECK(has(warned, "herd raises an error after HERD_STALL_SHUTDOWN_TIME_SECONDS=5 s"));
    }
  }
}

TEST_CASE("a rank delayed mid-ring: every rank gets the error, the old communicator refuses, a renewed one is exact") {
  for (int p : {2, 3}) {
    std::vector<std::string> first(static_cast<std::size_t>(p)), later(static_cast<std::size_t>(p));
    std::vector<int> exact(static_cast<std::size_t>(p), 0);
    const auto start = clock_type::now();
    herd::local::run(
        p,
        [&](herd::local_communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          herd_test::faulty_communicator<herd::local_communicator> faulty(
              comm, comm.rank() == 1 ? 5 : -1, [] { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); });
          std::vector<float> v = ramp(1 << 18, comm.rank());
          try {
            herd::allreduce(v, faulty);
          } catch (const herd::error& e) {
            first[r] = e.what();
          }
          CHECK(comm.operations().aborted());
          try {
            herd::allreduce(v, comm);
          } catch (const herd::error& e) {
            later[r] = e.what();
          }
          herd::local_communicator fresh = comm.renew(herd::comm_options{});  // patient: rank 1 may still sleep
          std::vector<float> w = ramp(1 << 18, comm.rank());
          herd::allreduce(w, fresh);
          exact[r] = w == ramp_sum(1 << 18, p) ? 1 : 0;
        },
        impatient());
    CHECK(seconds_since(start) < 10);
    for (int r = 0; r < p; ++r) {
      const auto& m = first[static_cast<std::size_t>(r)];
      INFO("p=", p, " rank ", r, ": ", m);
      CHECK(has(m, "herd::allreduce on rank " + std::to_string(r)));
      if (r == 1) CHECK(has(m, "aborted its operation #1"));  // told by the others, who gave up meanwhile
      else CHECK((has(m, "has waited 0.5 s in allreduce #1 (1 MiB f32)") || has(m, "aborted its operation #1")));
      CHECK(has(m, "The communicator is now aborted"));
      INFO(later[static_cast<std::size_t>(r)]);
      CHECK(has(later[static_cast<std::size_t>(r)], "this communicator was aborted by an earlier error"));
      CHECK(has(later[static_cast<std::size_t>(r)], "comm.renew()"));
      CHECK(exact[static_cast<std::size_t>(r)] == 1);
    }
  }
}

TEST_CASE("a rank whose function returns while the others wait: they raise at once, naming it") {
  const auto start = clock_type::now();
  const auto messages = errors_per_rank(3, [](herd::local_communicator& comm) {
    std::vector<float> v(10, 1.0f);
    herd::allreduce(v, comm);  // #1: every rank takes part
    if (comm.rank() == 1) return;
    herd::allreduce(v, comm);  // #2: rank 1 has left
  });
  CHECK(seconds_since(start) < 5);
  CHECK(messages[1].empty());
  for (std::size_t r : {0u, 2u}) {
    INFO(messages[r]);
    CHECK(has(messages[r], "rank 1 finished (it left the communicator after operation #1)"));
    CHECK(has(messages[r], "waits in allreduce #2 (40 B f32)"));
  }
}

TEST_CASE("asynchronous operations complete in order, interleaved with blocking ones, with and without a progress thread") {
  for (bool thread : {true, false}) {
    herd::comm_options options;
    options.progress_thread = thread;
    herd::local::run(
        3,
        [&](herd::local_communicator& comm) {
          const int r = comm.rank();
          const std::size_t n = 100000;
          std::vector<float> a = ramp(n, r), b = ramp(n, r), c = ramp(7, r), d = ramp(n, r);
          std::vector<int> root_value(5, r == 1 ? 42 : -1);
          std::vector<float> gathered(3 * 7);
          std::vector<float> shard(n / 4);
          std::vector<float> scatter_in = ramp(3 * (n / 4), r);
          herd::handle ha = herd::allreduce_async(a, comm);
          herd::handle hb = herd::allreduce_async(b, comm, herd::reduce_op::max);
          herd::allreduce(d, comm);  // blocking, after the two above
          herd::handle hc = herd::broadcast_async(root_value, comm, 1);
          herd::handle hd = herd::allgather_async(c, gathered, comm);
          herd::handle he = herd::reduce_scatter_async(scatter_in, shard, comm);
          he.wait();
          CHECK(ha.test());  // operations complete in submission order
          CHECK(hd.test());
          ha.wait();
          hb.wait();
          hc.wait();
          hd.wait();
          CHECK(a == ramp_sum(n, 3));
          CHECK(d == ramp_sum(n, 3));
          CHECK(b == ramp(n, 2));  // max: rank 2's values are the largest
          CHECK(root_value == std::vector<int>(5, 42));
          for (int q = 0; q < 3; ++q) CHECK(std::vector<float>(gathered.begin() + 7 * q, gathered.begin() + 7 * q + 7) == ramp(7, q));
          const auto full = ramp_sum(3 * (n / 4), 3);
          CHECK(shard == std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(r) * static_cast<std::ptrdiff_t>(n / 4),
                                            full.begin() + static_cast<std::ptrdiff_t>(r + 1) * static_cast<std::ptrdiff_t>(n / 4)));
          std::vector<float> e = ramp(n, r);
          {
            herd::handle dropped = herd::allreduce_async(e, comm);
            // destroyed here, before anyone waited: it waits, so e is not freed or read while it runs
          }
          CHECK(e == ramp_sum(n, 3));
          CHECK(comm.operations().issued() == 8);
        },
        options);
  }
}

TEST_CASE("an asynchronous operation's error is rethrown by wait() on every rank") {
  for (const auto& m : errors_per_rank(2, [](herd::local_communicator& comm) {
         std::vector<float> v(comm.rank() == 0 ? 10 : 11);
         herd::handle h = herd::allreduce_async(v, comm);
         h.wait();
       })) {
    INFO(m);
    CHECK(has(m, "the element count differs across ranks (rank 0: 10, rank 1: 11)"));
  }
}

TEST_CASE("grouped allreduce: many tensors, one operation, the same bits as one by one") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    const int r = comm.rank();
    std::vector<float> a = ramp(100, r), d = ramp(5000, r);
    std::vector<double> b(50, 0.25 * r);
    std::vector<std::int32_t> c(3000, r + 1);
    std::vector<float> empty;
    herd::allreduce(herd::views(a, b, c, empty, d), comm);
    CHECK(a == ramp_sum(100, 3));
    CHECK(d == ramp_sum(5000, 3));
    CHECK(b == std::vector<double>(50, 0.75));
    CHECK(c == std::vector<std::int32_t>(3000, 6));
    std::vector<double> avg(9, r);
    herd::handle h = herd::allreduce_async(herd::views(avg), comm, herd::reduce_op::avg);
    h.wait();
    CHECK(avg == std::vector<double>(9, 1.0));
    CHECK(comm.operations().issued() == 3);
  });
  for (const auto& m : errors_per_rank(2, [](herd::local_communicator& comm) {
         std::vector<float> a(10), b(20);
         if (comm.rank() == 0) herd::allreduce(herd::views(a, b), comm);
         else herd::allreduce(herd::views(a), comm);
       })) {
    INFO(m);
    CHECK(has(m, "the list of tensors (their number, sizes, dtypes or devices) differs across ranks"));
  }
}

TEST_CASE("an operation started from inside another of the same communicator is refused, not deadlocked") {
  herd::local::run(1, [](herd::local_communicator& comm) {
    auto& ops = comm.operations();
    std::string message;
    ops.run_blocking(
        [&](std::uint64_t) {
          try {
            herd::barrier(comm);
          } catch (const herd::error& e) {
            message = e.what();
          }
        },
        {"test", 0, 1});
    CHECK(has(message, "started from inside another operation"));
  });
}

TEST_CASE("a second thread issuing an operation while another is in one of the same communicator: every rank raises") {
  // Rank 0's main thread waits in an allreduce for rank 1, which comes 1 s late; 200 ms in, a
  // second thread of rank 0 starts an allreduce (blocking, then async) of the same communicator.
  for (const bool async : {false, true}) {
    INFO("the second thread's operation is ", async ? "async" : "blocking");
    std::string second;
    std::vector<std::string> first(2), after(2);
    std::vector<float> got(2, 0);
    herd::local::run(2, [&](herd::local_communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      std::vector<float> a(1000, 1.0f);
      std::thread other;
      if (comm.rank() == 0) {
        other = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::vector<float> b(1000, 100.0f);
          try {
            if (async) herd::allreduce_async(b, comm).wait();
            else herd::allreduce(b, comm);
          } catch (const herd::error& e) {
            second = e.what();
          }
        });
      } else {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      try {
        herd::allreduce(a, comm);
        got[r] = a[0];
      } catch (const herd::error& e) {
        first[r] = e.what();
      }
      if (other.joinable()) other.join();
      try {
        herd::barrier(comm);
      } catch (const herd::error& e) {
        after[r] = e.what();
      }
    });
    CHECK(has(second, "herd::allreduce on rank 0 of 2: another thread of this rank is issuing or running an operation "
                      "of this communicator at the same time"));
    CHECK(has(second, "from one thread at a time"));
    CHECK(has(first[0], "another thread of this rank issued an operation of this communicator while this one ran"));
    CHECK(has(first[0], "The communicator is now aborted"));
    // Rank 1's allreduce paired with rank 0's first one, and may have ended before the abort; the
    // barrier after it raises on every rank.
    CHECK((first[1].empty() ? got[1] == 2.0f : has(first[1], "another thread")));
    for (const std::string& m : after) CHECK(has(m, "aborted"));
  }
}

TEST_CASE("a blocking and an async operation started at once from two threads, first on a new communicator: no hang") {
  // Each round's two threads start together; the refusal must hold whichever comes first (the
  // async one's queueing used to race the blocking one's unlocked start: a rank could sleep for
  // good with the async operation queued).
  const auto start = std::chrono::steady_clock::now();
  int refused = 0;
  for (int round = 0; round < 150; ++round) {
    std::atomic<int> refusals{0};
    herd::local::run(2, [&](herd::local_communicator& comm) {
      std::atomic<int> go{0};
      std::vector<float> a(16, 1.0f), b(16, 100.0f);
      auto attempt = [&](auto&& op) {
        ++go;
        while (go.load() < 2) std::this_thread::yield();
        try {
          op();
        } catch (const herd::error& e) {
          if (has(e.what(), "another thread of this rank")) ++refusals;
        }
      };
      std::thread blocking([&] { attempt([&] { herd::allreduce(a, comm); }); });
      std::thread async([&] { attempt([&] { herd::allreduce_async(b, comm).wait(); }); });
      blocking.join();
      async.join();
    });
    refused += refusals.load() > 0;
  }
  INFO(refused, " of 150 rounds refused");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
}

TEST_CASE("the watchdog is on by default: a warning after 60 s, an error after 30 minutes") {
  ::unsetenv("HERD_STALL_CHECK_TIME_SECONDS");
  ::unsetenv("HERD_STALL_SHUTDOWN_TIME_SECONDS");
  const herd::runtime::settings s = herd::runtime::read_settings();
  CHECK(s.stall_check_seconds == 60);
  CHECK(s.stall_shutdown_seconds == 1800);
}

TEST_CASE("tags at or above reserved_tag_base are refused by isend and irecv, naming the range; collectives still run") {
  const auto messages = errors_per_rank(2, [](herd::local_communicator& comm) {
    std::vector<float> v(4, 1.0f);
    const int peer = 1 - comm.rank();
    for (int tag : {herd::reserved_tag_base, herd::reserved_tag_base + 2, 32767, -1}) {
      std::string refused;
      try {
        if (comm.rank() == 0) (void)comm.isend(v.data(), 16, peer, tag);
        else (void)comm.irecv(v.data(), 16, peer, tag);
      } catch (const herd::error& e) {
        refused = e.what();
      }
      INFO("tag ", tag, ": ", refused);
      CHECK(has(refused, comm.rank() == 0 ? "herd::isend on rank 0 of 2: tag " : "herd::irecv on rank 1 of 2: tag "));
      if (tag >= 0) CHECK(has(refused, "is in herd's reserved range [16384, 32767]"));
      CHECK(has(refused, "Use a tag in [0, herd::reserved_tag_base) = [0, 16384)"));
    }
    comm.sendrecv(v.data(), 16, peer, v.data(), 16, peer, herd::reserved_tag_base - 1);  // the last user tag
    herd::allreduce(v, comm);
    CHECK(v == std::vector<float>(4, 2.0f));
  });
  for (const auto& m : messages) CHECK(m == "");
}

TEST_CASE("every numeric option is checked at creation, from code or from the environment, on every rank") {
  struct bad_option {
    void (*spoil)(herd::comm_options&);
    const char* words;
  };
  const bad_option cases[] = {
      {[](herd::comm_options& o) { o.ring_segment_bytes = 0; }, "comm_options::ring_segment_bytes (HERD_RING_SEGMENT_BYTES) is 0"},
      {[](herd::comm_options& o) { o.stall_shutdown_seconds = -1; }, "comm_options::stall_shutdown_seconds (HERD_STALL_SHUTDOWN_TIME_SECONDS) is -1"},
      {[](herd::comm_options& o) { o.stall_check_seconds = std::numeric_limits<double>::quiet_NaN(); }, "comm_options::stall_check_seconds (HERD_STALL_CHECK_TIME_SECONDS) is nan"},
      {[](herd::comm_options& o) { o.shm_slice_bytes = 100; }, "comm_options::shm_slice_bytes (HERD_SHM_SLICE_BYTES) is 100"},
      {[](herd::comm_options& o) { o.simulated_node_size = -2; }, "comm_options::simulated_node_size (HERD_SIMULATE_NODE_SIZE) is -2"},
      {[](herd::comm_options& o) { o.allreduce_algorithm = static_cast<herd::algorithm>(9); }, "comm_options::allreduce_algorithm (HERD_ALLREDUCE_ALGORITHM) is 9"},
  };
  for (const bad_option& c : cases) {
    // Every rank with the bad option: each raises it. Rank 1 alone (through renew): rank 0 names rank 1.
    herd::comm_options spoilt;
    c.spoil(spoilt);
    std::string alone;
    try {
      herd::local::run(2, [](herd::local_communicator&) {}, spoilt);
    } catch (const herd::error& e) {
      alone = e.what();
    }
    INFO(alone);
    CHECK(has(alone, "herd::communicator on rank "));
    CHECK(has(alone, c.words));
    const auto messages = errors_per_rank(2, [&](herd::local_communicator& comm) {
      herd::comm_options mine;
      if (comm.rank() == 1) mine = spoilt;
      herd::local_communicator fresh = comm.renew(mine);
    });
    INFO(messages[0], " | ", messages[1]);
    CHECK(has(messages[0], "rank 1 has a malformed setting: " + std::string(c.words)));
    CHECK(has(messages[1], c.words));
  }
  // HERD_RING_SEGMENT_BYTES=0 is kept as the value, which the creation then refuses (it used to
  // fall back to the default silently; a 0 set in code divided by zero in a broadcast).
  ::setenv("HERD_RING_SEGMENT_BYTES", "0", 1);
  const herd::runtime::settings s = herd::runtime::read_settings();
  ::unsetenv("HERD_RING_SEGMENT_BYTES");
  herd::comm_options from_environment;
  from_environment.ring_segment_bytes = s.ring_segment_bytes;
  const auto messages = errors_per_rank(2, [&](herd::local_communicator& comm) {
    herd::local_communicator fresh = comm.renew(from_environment);
    std::vector<float> v(1000, 1.0f);
    herd::broadcast(v, fresh, 0);
  });
  for (const auto& m : messages) CHECK(has(m, "ring_segment_bytes (HERD_RING_SEGMENT_BYTES) is 0"));
}

TEST_CASE("renew after an operation that completed on one rank and failed on the other raises on every rank, naming both") {
  const auto messages = errors_per_rank(2, [](herd::local_communicator& comm) {
    // Rank 0 fails operation #1 after it sent and received all of it (its second wait): rank 1 has
    // all it needs, completes #1 and fails in #2, told of rank 0's abort.
    auto faulty = herd_test::faulty_communicator<herd::local_communicator>::after_wait(
        comm, comm.rank() == 0 ? 1 : -1, [] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw herd::error("injected failure");
        });
    std::vector<std::int32_t> step{1};
    std::string first;
    try {
      herd::allreduce(step, faulty);
      step = {2};
      herd::allreduce(step, faulty);
    } catch (const herd::error& e) {
      first = e.what();
    }
    CHECK(has(first, comm.rank() == 0 ? "injected failure" : "rank 0 aborted its operation #1"));
    std::string renewal;
    try {
      herd::local_communicator fresh = comm.renew();
    } catch (const herd::error& e) {
      renewal = e.what();
    }
    INFO(renewal);
    CHECK(has(renewal, "the ranks last completed different operations of the communicator they renew (rank 0: its "
                       "creation (#0), rank 1: allreduce #1 (4 B i32))"));
    // Brought back to one state, the ranks go on.
    herd::local_communicator fresh = comm.renew(comm.options(), herd::rolled_back);
    step = {1};
    herd::allreduce(step, fresh);
    CHECK(step[0] == 2);
  });
  for (const auto& m : messages) CHECK(m == "");
}

TEST_CASE("named operations: a skipped collective followed by one of the same shape is caught on every rank") {
  // Rank 1 skips "grad.a". Unnamed, its "grad.b" would pass for rank 0's "grad.a" (same number,
  // kind and shape) and the sums would mix; named, the agreement tells them apart.
  const auto messages = errors_per_rank(2, [](herd::local_communicator& comm) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    if (comm.rank() == 0) {
      herd::operation_name n("grad.a");
      herd::allreduce(a, comm);
    }
    herd::operation_name n("grad.b");
    herd::allreduce(b, comm);
  });
  for (const auto& m : messages) {
    INFO(m);
    CHECK(has(m, "the ranks are in different operations: rank 0 is in allreduce #1 \"grad.a\" (400 B f32), rank 1 in "
                 "allreduce #1 \"grad.b\" (400 B f32)"));
  }
  // The same program, unnamed: what is not detected without names.
  const auto unnamed = errors_per_rank(2, [](herd::local_communicator& comm) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    if (comm.rank() == 0) herd::allreduce(a, comm);
    herd::allreduce(b, comm);
  });
  CHECK(unnamed[1] == "");
  // Names nest and end with their scope; asynchronous operations take the name at submission.
  const auto nested = errors_per_rank(2, [](herd::local_communicator& comm) {
    std::vector<float> a(100, 1.0f);
    herd::operation_name outer("outer");
    herd::handle h;
    {
      herd::operation_name inner(comm.rank() == 0 ? "inner" : "other");
      h = herd::allreduce_async(a, comm);
    }
    h.wait();
  });
  CHECK(has(nested[0], "rank 0 is in allreduce #1 \"inner\" (400 B f32), rank 1 in allreduce #1 \"other\" (400 B f32)"));
}

namespace {
// A small training loop under run_elastic: 4096 parameters (16 KiB: the ring, with data messages),
// a gradient of arbitrary floats that depends on the parameters, the step and the rank, averaged
// across ranks, a commit every 4 steps. `fault` (if any) runs on `faulty_rank` before its data send
// number `at`, or, with `after_wait`, after its wait number `at`. Returns every rank's final
// parameters; `waits` gets rank 0's count of waits after each step.
struct elastic_fault {
  int rank = -1;
  int at = -1;
  bool after_wait = false;
  std::function<void()> fault;
};

std::vector<std::vector<float>> train_elastic(int p, const elastic_fault& f, std::vector<int>* waits = nullptr) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(p));
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 0.4;
  o.ring_segment_bytes = 4096;
  herd::local::run(
      p,
      [&](herd::local_communicator& comm) {
        std::vector<float> w(4096, 0.5f);
        std::int64_t step = 0;
        const int rank = comm.rank();
        using faulty_type = herd_test::faulty_communicator<herd::local_communicator>;
        const int at = rank == f.rank ? f.at : -1;
        faulty_type faulty = f.after_wait ? faulty_type::after_wait(comm, at, f.fault) : faulty_type(comm, at, f.fault);
        const int attempts = herd_test::train_elastic_steps(comm, faulty, w, step, 24, [&](int) {
          if (rank == 0 && waits != nullptr) waits->push_back(faulty.waits());
        });
        if (f.fault) CHECK(attempts == 2);
        finals[static_cast<std::size_t>(rank)] = w;
      },
      o);
  return finals;
}
}  // namespace

TEST_CASE("run_elastic: faults at random steps roll back to the last commit every rank holds; the same bits as without") {
  for (int p : {2, 3}) {
    std::vector<int> waits;
    const auto clean = train_elastic(p, {}, &waits);
    for (int r = 1; r < p; ++r) CHECK(clean[static_cast<std::size_t>(r)] == clean[0]);
    std::mt19937 rng(20261126u + static_cast<unsigned>(p));
    const int sends = 23 * 2 * (p - 1);  // data sends of rank 1 in the first 23 steps, at least
    std::vector<elastic_fault> faults = {
        // An exception inside a reduction, and a stall past the shutdown time (the others give up).
        {1, std::uniform_int_distribution<int>(0, sends)(rng), false, [] { throw herd::error("injected failure"); }},
        {1, std::uniform_int_distribution<int>(0, sends)(rng), false,
         [] { std::this_thread::sleep_for(std::chrono::milliseconds(600)); }},
        // Rank 0 fails step 8's allreduce after its last wait: the others complete it and commit
        // (#3) while rank 0 holds #2, so the ranks must agree to go back to #2.
        {0, waits[7] - 1, true, [] { throw herd::error("injected failure after the last wait"); }},
    };
    for (const elastic_fault& f : faults) {
      INFO("p=", p, " fault on rank ", f.rank, std::string(f.after_wait ? " after wait " : " before data send "), f.at);
      const auto faulted = train_elastic(p, f);
      for (int r = 0; r < p; ++r) CHECK(faulted[static_cast<std::size_t>(r)] == clean[0]);
    }
  }
}

// Handles a failed step drops while its exception unwinds (run_elastic then rolls back) and handles
// whose failure aborted the communicator (its next call reports it) say nothing; a handle dropped
// unwaited whose failure nobody would hear of otherwise (an argument error, after which the
// communicator goes on) still warns.
TEST_CASE("dropped handles warn only of failures nobody hears of: not in a rollback, not after an abort") {
  const std::string rollback = herd_test::stderr_of([] {
    herd::local::run(2, [](herd::local_communicator& comm) {
      std::vector<std::vector<float>> parts(3, std::vector<float>(1000, 1.0f));
      std::int64_t step = 0;
      herd::elastic_state state;
      state.track(step);
      for (auto& part : parts) state.track(part);
      auto faulty = herd_test::faulty_communicator<herd::local_communicator>::after_wait(
          comm, comm.rank() == 1 ? 7 : -1, [] { throw herd::error("injected failure"); });
      int attempts = 0;
      herd::run_elastic(comm, state, [&](herd::local_communicator&) {
        ++attempts;
        while (step < 6) {
          std::vector<herd::handle> handles;
          for (auto& part : parts) handles.push_back(herd::allreduce_async(part, faulty));
          for (auto& h : handles) h.wait();
          ++step;
          if (step % 2 == 0) state.commit();
        }
      });
      CHECK(attempts == 2);
      for (auto& part : parts) CHECK(part == std::vector<float>(1000, 64.0f));
    }, impatient());
  });
  CHECK(!has(rollback, "dropped without wait()"));

  const std::string dropped = herd_test::stderr_of([] {
    herd::local::run(2, [](herd::local_communicator& comm) {
      {
        std::vector<float> v(static_cast<std::size_t>(4 + comm.rank()), 1.0f);  // counts differ: an argument error
        herd::handle h = herd::allreduce_async(v, comm);
      }
      std::vector<float> ok(4, 1.0f);
      herd::allreduce(ok, comm);  // the communicator goes on after an argument error
      CHECK(ok == std::vector<float>(4, 2.0f));
      {
        auto faulty = herd_test::faulty_communicator<herd::local_communicator>::after_wait(
            comm, comm.rank() == 1 ? 0 : -1, [] { throw herd::error("injected failure"); });
        herd::handle h = herd::allreduce_async(ok, faulty);  // fails and aborts: the next call says so
      }
      const std::string next = herd_test::error_of([&] { herd::allreduce(ok, comm); });
      INFO(next);
      CHECK(has(next, "aborted"));  // this rank's abort of #3, or rank 1's, found in #4
    }, impatient());
  });
  CHECK(has(dropped, "herd warning: an operation whose handle was dropped without wait() failed: herd::allreduce on rank 0 of 2: the element count differs"));
  CHECK(has(dropped, "herd warning: an operation whose handle was dropped without wait() failed: herd::allreduce on rank 1 of 2: the element count differs"));
  const auto first = dropped.find("dropped without wait()");
  const auto second = dropped.find("dropped without wait()", first + 1);
  CHECK(dropped.find("dropped without wait()", second + 1) == std::string::npos);  // the aborted one says nothing

  // The same abort with no call after it: nothing reports it, so the communicator's end warns.
  const std::string unheard = herd_test::stderr_of([] {
    herd::local::run(2, [](herd::local_communicator& comm) {
      std::vector<float> ok(4, 1.0f);
      auto faulty = herd_test::faulty_communicator<herd::local_communicator>::after_wait(
          comm, comm.rank() == 1 ? 0 : -1, [] { throw herd::error("injected failure"); });
      herd::handle h = herd::allreduce_async(ok, faulty);  // fails and aborts; the communicator ends unused
    }, impatient());
  });
  INFO(unheard);
  CHECK(has(unheard, "herd warning: an operation whose handle was dropped without wait() failed, and no later call of "
                     "its communicator reported it: injected failure The communicator is now aborted"));  // rank 1's
}

// A herd::error raised between operations on one rank told no peer: run_elastic aborts the
// communicator to tell them, and every rank rolls back at once instead of at its watchdog.
TEST_CASE("run_elastic: a herd::error raised outside any operation on one rank; every rank recovers at once") {
  for (int p : {2, 3}) {
    for (int on : {0, p - 1}) {
      std::vector<std::vector<float>> results(static_cast<std::size_t>(p));
      std::vector<int> attempts(static_cast<std::size_t>(p));
      herd::comm_options o = impatient();
      o.stall_shutdown_seconds = 3;
      const auto start = clock_type::now();
      herd::local::run(p, [&](herd::local_communicator& comm) {
        std::vector<float> w(1000, 0.5f);
        std::int64_t step = 0;
        const int rank = comm.rank();
        attempts[static_cast<std::size_t>(rank)] = herd_test::train_elastic_steps(comm, comm, w, step, 12, [&](int attempt) {
          if (rank == on && step == 6 && attempt == 1) throw herd::error("a failure planted between operations");
        });
        results[static_cast<std::size_t>(rank)] = w;
      }, o);
      const double took = seconds_since(start);
      INFO("p=", p, " failure on rank ", on, ", took ", took, " s");
      CHECK(took < 1.5);
      for (int r = 0; r < p; ++r) {
        CHECK(attempts[static_cast<std::size_t>(r)] == 2);
        CHECK(results[static_cast<std::size_t>(r)] == results[0]);
      }
    }
  }
}
