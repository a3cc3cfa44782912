// The fault matrix: every kind of fault, on every path an operation can take, at every phase of
// it, on real MPI ranks. Each cell trains a few steps under herd::run_elastic with the fault on
// rank 1 in one step, and requires:
// - every rank raises herd::error within the shutdown time + 2 s of the fault (the stalled rank
//   itself when it wakes), and the communicator it raised on refuses further use;
// - run_elastic recovers: the final weights equal, bit for bit, those of a fault-free run computed
//   here without herd (integer-valued gradients, so that every path's sums are exact);
// - nothing is left in /dev/shm.
// A rank that leaves: the others shrink to a communicator of their own and go on, bit for bit a run
// that switches to one rank fewer at the commit they went back to. A stall that never resumes: the
// others raise within the bound, and run_elastic's renewal, which needs the rank, raises too.
// A user's message on a reserved tag, sent from another thread while the operation runs, is refused
// on that rank alone and disturbs nothing.
//
// Faults are injected through herd's test hooks (comm/detail/fault_hooks.hpp): an "event" is a
// message this process posts on herd's tags or a step it publishes in shared memory. The phases:
// the faulted step's first event (its agreement), its middle one, and its last.

#include <herd/herd.hpp>

#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/runtime/elastic.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class fault_kind { stall_that_resumes, stall_that_never_resumes, exception, rank_leaves, reserved_tag };
enum class path { ring, shared_memory, hierarchical, async, grouped, buckets };
enum class phase { agreement, mid_data, last_step };

const char* name(path p) {
  constexpr const char* names[] = {"ring", "shared memory", "hierarchical", "async", "grouped", "optimizer buckets"};
  return names[static_cast<int>(p)];
}
const char* name(phase p) {
  constexpr const char* names[] = {"agreement", "mid-data", "last step"};
  return names[static_cast<int>(p)];
}

constexpr double shutdown = 0.4;      // the communicators' stall_shutdown_seconds
constexpr double resume_after = 0.6;  // a stall that resumes: past the shutdown time, before the renewal gives up
constexpr std::size_t elements = 6000;      // 23.4 KiB of f32 per step: several segments and slices
constexpr std::int64_t steps = 6;
constexpr std::int64_t fault_step = 3;  // after commit #2 (step 2), before commit #3 (step 4)

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

using herd_test::error_of;
using herd_test::has;

// --- The injection: counts this process's events in the faulted step and runs the fault at one.

std::atomic<int> events{0};
std::atomic<int> fault_at{-1};  // the event that faults, or -1
std::atomic<fault_kind> armed_kind{fault_kind::exception};
std::atomic<bool> counting{false};

// A user's thread that posts on a reserved tag when told to (the reserved_tag fault).
struct tag_poster {
  std::mutex m;
  std::condition_variable cv;
  bool asked = false, answered = false;
  std::string answer;
};
tag_poster* poster = nullptr;
herd::mpi_communicator* current = nullptr;  // the communicator training now
std::vector<herd::mpi_communicator::request> leaked;  // user posts that were not refused

// What the rank that leaves throws: not a herd::error, so that run_elastic lets it pass, and the
// rank's communicator is destroyed on the way out (which tells its peers it left).
struct leaves_training : std::runtime_error {
  leaves_training() : std::runtime_error("this rank leaves the training") {}
};

void stall(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// A stall that never resumes, as far as its peers can tell: it lasts until every other rank has
// given up altogether (they create `given_up` then), so that the test can go on.
std::string given_up;
void stall_until_given_up() {
  const auto start = clock_type::now();
  while (::access(given_up.c_str(), F_OK) != 0 && seconds_since(start) < 30) stall(0.01);
}

void on_event() {
  if (!counting.load()) return;
  const int e = events.fetch_add(1);
  if (e != fault_at.load()) return;
  fault_at = -1;
  switch (armed_kind.load()) {
    case fault_kind::stall_that_resumes: stall(resume_after); break;
    case fault_kind::stall_that_never_resumes: stall_until_given_up(); break;
    case fault_kind::exception: throw herd::error("injected failure inside the operation");
    case fault_kind::rank_leaves: throw leaves_training();
    case fault_kind::reserved_tag: {  // the operation waits until the user's thread has tried
      std::unique_lock lock(poster->m);
      poster->asked = true;
      poster->cv.notify_all();
      poster->cv.wait(lock, [] { return poster->answered; });
      break;
    }
  }
}
void on_post(int, bool) { on_event(); }
void on_publish(std::uint64_t) { on_event(); }

struct hooks_installed {
  hooks_installed() {
    herd::detail::post_hook() = on_post;
    herd::detail::shm_step_hook() = on_publish;
  }
  ~hooks_installed() {
    herd::detail::post_hook() = nullptr;
    herd::detail::shm_step_hook() = nullptr;
  }
};

// --- The training: integer-valued weights and gradients, summed over ranks.

float gradient(float w, int rank, std::int64_t step, std::size_t i) {
  const std::int64_t x = static_cast<std::int64_t>(w) * (rank + 1) + step * 5 + static_cast<std::int64_t>(i);
  return static_cast<float>(((x % 7) + 7) % 7 - 3);
}

// The fault-free result, without herd: every rank's gradient is known here. From step `switch_at`
// on, `later_ranks` ranks train (those that stay after a rank left, renumbered from 0).
std::vector<float> expected_weights(int ranks, std::int64_t switch_at = steps, int later_ranks = 0) {
  std::vector<float> w(elements, 1.0f);
  for (std::int64_t step = 0; step < steps; ++step) {
    std::vector<float> sum(elements, 0.0f);
    for (int r = 0; r < (step < switch_at ? ranks : later_ranks); ++r) {
      for (std::size_t i = 0; i < elements; ++i) sum[i] += gradient(w[i], r, step, i);
    }
    for (std::size_t i = 0; i < elements; ++i) w[i] -= sum[i];
  }
  return w;
}

herd::comm_options options_for(path p) {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = shutdown;
  o.end_job_if_unsettled = false;  // a peer that never resumes must not end the test's job
  o.ring_segment_bytes = 4096;
  o.shm_slice_bytes = 4096;
  o.allreduce_algorithm = p == path::ring            ? herd::algorithm::ring
                          : p == path::hierarchical  ? herd::algorithm::hierarchical
                          : p == path::shared_memory ? herd::algorithm::shared_memory
                                                     : herd::algorithm::automatic;
  if (p == path::hierarchical) o.simulated_node_size = 1;  // two nodes of one rank: the ring across them
  return o;
}

// The gradients of one step, in three tensors of unequal sizes.
struct step_gradients {
  std::vector<float> parts[3];
  std::vector<herd::buffer_view> views() { return herd::views(parts[0], parts[1], parts[2]); }
};
constexpr std::size_t part_begin[4] = {0, 1000, 3500, elements};

// Adds the summed gradients to nothing: the weights are updated by the loop from the parts.
struct no_step {
  void step() {}
};

// What one rank saw in one cell.
struct outcome {
  int attempts = 0;
  std::string error;            // the faulted step's error, if any
  double seconds = 0;           // from the faulted step's start to that error
  std::string refusal;          // the aborted communicator's answer to a later call
  std::string gave_up;          // run_elastic's own error, when it could not recover
  bool left = false;            // this rank left the training
  std::int64_t world_changed_at = -1;  // the step the survivors went on from, and their number
  int new_size = 0;
  std::vector<float> weights;
};

// Reduces one step's gradients on path `p`.
void reduce(path p, herd::mpi_communicator& comm, step_gradients& g) {
  switch (p) {
    case path::ring:
    case path::shared_memory:
    case path::hierarchical:
      for (auto& part : g.parts) herd::allreduce(part, comm);
      break;
    case path::async: {
      std::vector<herd::handle> handles;
      for (auto& part : g.parts) handles.push_back(herd::allreduce_async(part, comm));
      std::string first;  // every handle is waited for, the first error raised after
      for (auto& h : handles) {
        const std::string e = error_of([&] { h.wait(); });
        if (first.empty() && e != "(no herd::error)") first = e;
      }
      if (!first.empty()) throw herd::error(first);
      break;
    }
    case path::grouped: herd::allreduce(g.views(), comm); break;
    case path::buckets: {
      herd::optimizer_options o;
      o.op = herd::reduce_op::sum;
      o.bucket_bytes = 8192;
      o.first_bucket_bytes = 4096;
      no_step inner;
      herd::distributed_optimizer opt(inner, g.views(), comm, o);
      for (int i = 2; i >= 0; --i) opt.mark_ready(static_cast<std::size_t>(i));
      opt.step();
      break;
    }
  }
}

// Trains under run_elastic; `fault_event` >= 0 arms the fault on this rank at that event of the
// faulted step. `events_seen` (if given) gets the number of events of the faulted step.
outcome train(path p, fault_kind kind, int fault_event, int* events_seen = nullptr) {
  MPI_Barrier(MPI_COMM_WORLD);  // the last cell's stalled rank is back
  herd::mpi_communicator comm(MPI_COMM_WORLD, options_for(p));
  outcome out;
  std::vector<float> w(elements, 1.0f);
  std::int64_t step = 0;
  herd::elastic_state state;
  state.track(w);
  state.track(step);
  state.on_world_change([&](int, int new_size) {
    out.world_changed_at = step;
    out.new_size = new_size;
  });
  // Gradients that outlive the cell: a peer that never resumes may leave sends from them to MPI.
  static step_gradients g;
  clock_type::time_point fault_start;
  try {
    herd::run_elastic(comm, state, [&](herd::mpi_communicator& c) {
      ++out.attempts;
      current = &c;
      while (step < steps) {
        for (int k = 0; k < 3; ++k) {
          g.parts[k].resize(part_begin[k + 1] - part_begin[k]);
          for (std::size_t i = part_begin[k]; i < part_begin[k + 1]; ++i) {
            g.parts[k][i - part_begin[k]] = gradient(w[i], c.rank(), step, i);
          }
        }
        const bool faulted = step == fault_step && out.attempts == 1;
        if (faulted) {
          events = 0;
          armed_kind = kind;
          fault_at = fault_event;
          counting = true;
        }
        if (faulted) fault_start = clock_type::now();
        try {
          reduce(p, c, g);
        } catch (const herd::error& e) {
          counting = false;
          fault_at = -1;
          // The first error after the fault (a rank that completed the faulted operation raises in
          // a later one).
          if (out.attempts == 1 && step >= fault_step) {
            out.error = e.what();
            out.seconds = seconds_since(fault_start);
            out.refusal = error_of([&] {
              std::vector<float> probe(4);
              herd::allreduce(probe, c);
            });
          }
          throw;
        }
        if (faulted) {
          counting = false;
          fault_at = -1;
          if (events_seen != nullptr) *events_seen = events.load();
        }
        for (int k = 0; k < 3; ++k) {
          for (std::size_t i = part_begin[k]; i < part_begin[k + 1]; ++i) w[i] -= g.parts[k][i - part_begin[k]];
        }
        ++step;
        if (step % 2 == 0) state.commit();
      }
    });
  } catch (const herd::error& e) {
    out.gave_up = e.what();
  } catch (const leaves_training&) {
    counting = false;
    fault_at = -1;
    out.left = true;
  }
  current = nullptr;
  out.weights = w;
  return out;
}

// herd's entries in /dev/shm (none are expected: its segments are anonymous).
std::vector<std::string> herd_segments() {
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      if (std::string(e->d_name).rfind("herd.", 0) == 0) found.push_back(e->d_name);
    }
    ::closedir(dir);
  }
  return found;
}

constexpr path every_path[] = {path::ring, path::shared_memory, path::hierarchical, path::async, path::grouped, path::buckets};
constexpr phase every_phase[] = {phase::agreement, phase::mid_data, phase::last_step};

// Runs the row of `kind`: every path, every phase, fault on rank 1.
void run_row(fault_kind kind) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int first_pid = static_cast<int>(::getpid());
  MPI_Bcast(&first_pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::vector<float> expected = expected_weights(size);
  const std::vector<std::string> segments_before = herd_segments();
  hooks_installed hooks;
  tag_poster tags;
  poster = &tags;
  int cell = 0;
  for (path p : every_path) {
    // A fault-free run counts rank 1's events in the faulted step (the same in every run).
    int count = 0;
    const outcome clean = train(p, kind, -1, &count);
    REQUIRE(clean.weights == expected);
    MPI_Bcast(&count, 1, MPI_INT, 1, MPI_COMM_WORLD);
    REQUIRE(count > 2);
    for (phase ph : every_phase) {
      const int at = ph == phase::agreement ? 0 : ph == phase::mid_data ? count / 2 : count - 1;
      INFO("path " << std::string(name(p)) << ", phase " << std::string(name(ph)) << " (event " << at << " of " << count << ")");
      given_up = "/tmp/herd-fault-matrix." + std::to_string(first_pid) + "." + std::to_string(++cell);
      tags.asked = tags.answered = false;
      tags.answer.clear();
      std::thread user;
      if (kind == fault_kind::reserved_tag && rank == 1) {
        user = std::thread([&] {  // the user's other thread: posts on the data tag of a running operation
          std::unique_lock lock(tags.m);
          tags.cv.wait(lock, [&] { return tags.asked; });
          lock.unlock();
          // The tag of the operation running now: had it been taken, its data would be this junk.
          static std::vector<float> junk(1024, 1e6f);
          const std::uint64_t running = current->operations().issued() - 1;
          tags.answer = error_of([&] {
            leaked.push_back(current->isend(junk.data(), 4096, 0, herd::detail::data_tag(running)));
          });
          lock.lock();
          tags.answered = true;
          tags.cv.notify_all();
        });
      }
      const outcome o = train(p, kind, rank == 1 ? at : -1);
      if (user.joinable()) user.join();
      if (rank != 1 && kind == fault_kind::stall_that_never_resumes) std::ofstream{given_up} << "gave up\n";
      INFO("rank " << rank << ": error " << o.error << "; then " << o.gave_up);
      switch (kind) {
        case fault_kind::reserved_tag:
          CHECK(o.attempts == 1);
          CHECK(o.error.empty());
          if (rank == 1) CHECK(has(tags.answer, "is in herd's reserved range"));
          CHECK(o.weights == expected);
          break;
        case fault_kind::stall_that_never_resumes:
          // No recovery without the rank: run_elastic's renewal gives up too, on every rank. The
          // stalled rank resumes once the others gave up and left: a shrink that counts who is
          // still there leaves it alone, and it goes on as a world of one (a rank that said it
          // stays and then left is not counted), unless it heard of their departure too late.
          CHECK(!o.error.empty());
          CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
          if (rank != 1) CHECK(!o.gave_up.empty());
          else CHECK((!o.gave_up.empty() || o.new_size == 1));
          if (rank != 1) CHECK(o.seconds < shutdown + 2);
          break;
        case fault_kind::rank_leaves:
          if (rank == 1) {
            CHECK(o.left);
            break;
          }
          // The others raise at once, shrink to a communicator of their own and go on from the
          // last commit they hold: the result of a run that switches to one rank fewer there.
          CHECK(o.gave_up.empty());
          CHECK(o.attempts == 2);
          CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
          CHECK(o.seconds < shutdown + 2);
          CHECK(o.new_size == size - 1);
          CHECK((o.world_changed_at == 2 || o.world_changed_at == 4));  // commit #2, or #3 if step 3 completed here
          CHECK(o.weights == expected_weights(size, o.world_changed_at, size - 1));
          break;
        case fault_kind::stall_that_resumes:
        case fault_kind::exception:
          CHECK(o.gave_up.empty());
          CHECK(o.attempts == 2);
          CHECK(!o.error.empty());
          CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
          CHECK(o.seconds < shutdown + 2);
          if (kind == fault_kind::exception && rank == 1) CHECK(has(o.error, "injected failure inside the operation"));
          CHECK(o.weights == expected);
          break;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) ::unlink(given_up.c_str());
    }
    CHECK(herd_segments() == segments_before);
  }
  poster = nullptr;
}

}  // namespace

HERD_MPI_TEST_CASE("fault matrix: a stall that resumes, on every path and phase", 2) { run_row(fault_kind::stall_that_resumes); }
HERD_MPI_TEST_CASE("fault matrix: a stall that never resumes, on every path and phase", 2) {
  run_row(fault_kind::stall_that_never_resumes);
}
HERD_MPI_TEST_CASE("fault matrix: an exception inside the operation, on every path and phase", 2) {
  run_row(fault_kind::exception);
}
HERD_MPI_TEST_CASE("fault matrix: a rank that leaves inside the operation, on every path and phase", 2) {
  run_row(fault_kind::rank_leaves);
}
HERD_MPI_TEST_CASE("fault matrix: a user's message on a reserved tag while an operation runs, on every path and phase", 2) {
  run_row(fault_kind::reserved_tag);
}
