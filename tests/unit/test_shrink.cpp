// A rank that leaves the training: the others shrink the communicator to the ranks still there,
// re-shard the data and go on at the smaller size from the last commit they all hold, with the
// same bits as a run without faults that switches to the smaller world at that commit.

#include <herd/herd.hpp>

#include "../support/elastic_training.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t shrink_parameters = 257;
constexpr std::int64_t shrink_steps = 30;

herd::comm_options patient_enough() {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 20;  // a hang fails the test instead of blocking it
  return o;
}

// The final parameters of every rank that stayed (indexed by its first rank; empty for the one
// that left), training `p` ranks of which one leaves as `gone` says.
std::vector<std::vector<float>> train_with_departure(int p, const herd_test::departure& gone) {
  std::vector<std::vector<float>> finals(static_cast<std::size_t>(p));
  std::vector<int> attempts(static_cast<std::size_t>(p));
  herd::local::run(
      p,
      [&](herd::local_communicator& comm) {
        const int first = comm.rank();
        herd_test::sharded_run run = herd_test::start_sharded(shrink_parameters, p, first);
        try {
          attempts[static_cast<std::size_t>(first)] = herd_test::train_sharded(comm, run, shrink_steps, gone);
        } catch (const herd_test::rank_left&) {
          return;  // as a process's harness ends it: the communicator is destroyed on the way out
        }
        if (first != gone.rank) {
          CHECK(comm.size() == p - 1);
          CHECK(comm.rank() == first - (first > gone.rank ? 1 : 0));
          CHECK(attempts[static_cast<std::size_t>(first)] == 2);  // one rollback
          finals[static_cast<std::size_t>(first)] = run.w;
        }
      },
      patient_enough());
  return finals;
}

// What the ranks that stay must end with: `p` ranks without faults to step `at`, then `p` - 1
// ranks from there, the sampler re-sharded over them.
std::vector<float> switched_at(int p, std::int64_t at) {
  std::optional<herd_test::sharded_run> at_switch;
  std::mutex mutex;
  herd::local::run(p, [&](herd::local_communicator& comm) {
    herd_test::sharded_run run = herd_test::start_sharded(shrink_parameters, p, comm.rank());
    herd_test::train_sharded(comm, run, at);
    std::lock_guard lock(mutex);
    if (comm.rank() == 0) at_switch = run;
  });
  std::vector<float> final_w;
  herd::local::run(p - 1, [&](herd::local_communicator& comm) {
    herd_test::sharded_run run = *at_switch;
    run.sampler.reshard(p - 1, comm.rank());
    herd_test::train_sharded(comm, run, shrink_steps);
    std::lock_guard lock(mutex);
    if (comm.rank() == 0) final_w = run.w;
  });
  return final_w;
}

}  // namespace

TEST_CASE("a rank leaves the training (returns, leave(), an exception): the others go on smaller, with the bits of a run that switches at the commit") {
  std::mt19937 rng(20261126u);
  for (int p : {3, 4}) {
    for (auto how : {herd_test::departure::returns, herd_test::departure::leaves, herd_test::departure::raises}) {
      herd_test::departure gone;
      gone.rank = std::uniform_int_distribution<int>(0, p - 1)(rng);
      gone.step = std::uniform_int_distribution<std::int64_t>(1, shrink_steps - 2)(rng);
      gone.how = how;
      INFO("p=", p, " rank ", gone.rank, " leaves before step ", gone.step, " (how: ", static_cast<int>(how), ")");
      const auto finals = train_with_departure(p, gone);
      // The leaving rank fails nobody's step before its own: the others go back to the commit of
      // the last multiple of 4 at or before it.
      const std::vector<float> expected = switched_at(p, gone.step / 4 * 4);
      for (int r = 0; r < p; ++r) {
        if (r == gone.rank) continue;
        CHECK(finals[static_cast<std::size_t>(r)] == expected);
      }
    }
  }
}

// A rank leaves after commit 2 (the others shrink to 2 ranks and re-shard what commit 2 holds),
// then one of the two fails before the next commit: the renewal keeps 2 ranks, but what it
// restores is commit 2 again, made at 3, so the world-change callbacks must run again.
TEST_CASE("run_elastic: a failure after a shrink and before the next commit restores a commit of the larger world, and re-shards it") {
  std::vector<std::string> seen(3);
  herd::local::run(
      3,
      [&](herd::local_communicator& comm) {
        const int first = comm.rank();
        herd::distributed_sampler sampler(60, 3, first);
        std::int64_t step = 0;
        double lr = 0.3;  // scaled with the number of ranks
        herd::elastic_state state;
        state.track(step);
        state.track(sampler);
        state.track(lr);
        std::string changes;
        state.on_world_change([&](int old_size, int new_size) {
          changes += std::to_string(old_size) + "->" + std::to_string(new_size) + " ";
          sampler.reshard(new_size, comm.rank());
          lr *= static_cast<double>(new_size) / old_size;
        });
        bool raised = false;
        herd::run_elastic(comm, state, [&](herd::local_communicator& c) {
          while (step < 8) {
            if (first == 2 && step == 5) {
              c.leave();
              return;
            }
            if (first == 0 && !changes.empty() && !raised && step == 5) {
              raised = true;
              throw herd::error("injected failure");
            }
            std::vector<float> g{1.0f};
            herd::allreduce(g, c);
            ++step;
            sampler.advance(2);
            if (step % 4 == 0) state.commit();
          }
        });
        if (first == 2) return;
        seen[static_cast<std::size_t>(first)] = "size " + std::to_string(comm.size()) + ", sampler over " +
                                                 std::to_string(sampler.world_size()) + ", lr " + std::to_string(lr) +
                                                 ", changes " + changes;
      },
      patient_enough());
  for (int r = 0; r < 2; ++r) {
    INFO("first rank ", r);
    CHECK(seen[static_cast<std::size_t>(r)] == "size 2, sampler over 2, lr 0.200000, changes 3->2 3->2 ");
  }
}

TEST_CASE("shrink with every rank still there is a renewal: the same ranks, the same numbers") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    const int rank = comm.rank();
    comm = comm.shrink();
    CHECK(comm.size() == 3);
    CHECK(comm.rank() == rank);
    std::vector<int> v{rank};
    herd::allreduce(v, comm);
    CHECK(v[0] == 3);
  });
}

TEST_CASE("distributed_sampler::reshard: the rest of the epoch, once each, over the new ranks") {
  herd::sampler_options o;
  o.seed = 3;
  o.pad = false;
  const std::size_t n = 23;
  std::vector<std::size_t> seen;
  std::vector<herd::distributed_sampler> old;
  for (int r = 0; r < 3; ++r) {
    old.emplace_back(n, 3, r, o);
    old.back().set_epoch(2);
    const auto taken = old.back().indices();
    seen.insert(seen.end(), taken.begin(), taken.begin() + 4);
  }
  for (int r = 0; r < 2; ++r) {
    herd::distributed_sampler s = old[0];
    s.advance(4);
    s.reshard(2, r);
    CHECK(s.consumed() == 12);
    const auto rest = s.indices();
    seen.insert(seen.end(), rest.begin(), rest.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  CHECK(seen == all);

  // The next epoch is whole again at the new size, and may be resumed anywhere in it.
  herd::distributed_sampler s(100, 2, 0);
  s.advance(25);
  s.reshard(1, 0);
  CHECK(s.size() == 50);
  s.set_epoch(1, 60);
  CHECK(s.consumed() == 0);
  CHECK(s.size() == 100);
  CHECK(s.indices().size() == 40);
  CHECK_THROWS_AS(s.set_epoch(2, 101), herd::error);
}

TEST_CASE("shrink waits for every rank to say whether it stays: a late one is counted, one that leaves late is not") {
  for (bool late_one_stays : {true, false}) {
    INFO("the late rank ", std::string(late_one_stays ? "stays" : "leaves"));
    herd::local::run(
        4,
        [&](herd::local_communicator& comm) {
          if (comm.rank() == 3) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            if (!late_one_stays) return;  // leaves after the others began to shrink
          }
          comm = comm.shrink();
          CHECK(comm.size() == (late_one_stays ? 4 : 3));
          std::vector<int> v{1};
          herd::allreduce(v, comm);
          CHECK(v[0] == comm.size());
        },
        patient_enough());
  }
}

// A rank that said it stays and then left (its own shrink gave up before the last rank came) is
// not counted: the others go on without it instead of waiting for it in the new communicator.
TEST_CASE("shrink: a rank that said it stays and then left is not counted") {
  std::vector<std::string> outcome(3);
  herd::local::run(
      3,
      [&](herd::local_communicator& comm) {
        const int rank = comm.rank();
        herd::comm_options o = patient_enough();
        o.stall_shutdown_seconds = rank == 1 ? 0.3 : 5;  // rank 1 gives up before rank 2 comes
        std::this_thread::sleep_for(std::chrono::milliseconds(rank == 0 ? 100 : rank == 2 ? 800 : 0));
        try {
          herd::local_communicator smaller = comm.shrink(o);
          std::vector<int> v{1};
          herd::allreduce(v, smaller);
          outcome[static_cast<std::size_t>(rank)] = "went on as " + std::to_string(smaller.size()) + ", sum " + std::to_string(v[0]);
        } catch (const herd::error& e) {
          outcome[static_cast<std::size_t>(rank)] = std::string("raised: ") + e.what();
        }
      },
      patient_enough());
  INFO(outcome[0], " | ", outcome[1], " | ", outcome[2]);
  CHECK(outcome[0] == "went on as 2, sum 2");
  CHECK(outcome[2] == "went on as 2, sum 2");
  CHECK(outcome[1].find("raised: herd::local_communicator::shrink on rank 1 of 3: rank 1 has waited") == 0);
}
