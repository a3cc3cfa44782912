// The fault matrix: kinds of fault, on the paths an operation can take, at phases of it, on real
// MPI ranks. Each cell trains a few steps under herd::run_elastic with the fault on one rank (or
// two) in one step, and requires:
// - every rank raises herd::error within the shutdown time + 2 s of the fault (the stalled rank
//   itself when it wakes), and the communicator it raised on refuses further use; where the
//   faulted rank raised or left, it told its peers, and they raise sooner, without a watchdog
//   (within 0.4 s at 2 ranks, 1.5 s at 3 and 4);
// - run_elastic recovers: the final weights equal, bit for bit, those of a fault-free run computed
//   here without herd (integer-valued gradients, so that every path's sums are exact);
// - nothing is left in /dev/shm, and no segment of herd is still mapped in any process (its
//   segments are anonymous: /proc/self/maps, not /dev/shm, shows one that leaked).
// A rank that leaves: the others shrink to a communicator of their own and go on, bit for bit a run
// that switches to fewer ranks at the commit they went back to. A stall that never resumes: the
// others raise within the bound, and run_elastic's renewal, which needs the rank, raises too.
// A user's message on a reserved tag, sent from another thread while the operation runs, is refused
// on that rank alone and disturbs nothing.
//
// The kinds of fault: inside an operation (a stall that resumes, one that never does, a herd::error,
// an exception that makes the rank leave, a message on a reserved tag); outside any operation, in
// the user's step between operations (a herd::error: every rank recovers; an exception of another
// type: that rank leaves); and a rank that, after an error inside the operation, stays busy outside
// herd for a while before it goes on (its peers must raise without its help, then wait for it in
// the recovery); three of those cells send big messages, which MPI completes (rendezvous) only once
// the busy rank's process takes them, one of them posted only after the busy rank went away.
//
// Faults inside operations are injected through herd's test hooks (comm/detail/fault_hooks.hpp):
// an "event" is a message this process posts on herd's tags or a step it publishes in shared
// memory. The phases: the faulted step's first event (its agreement), its middle one, and its
// last. Faults outside operations are raised by the step itself, at three points: before the
// step's first operation, after its first operation was issued and before the next (for the
// asynchronous path and the optimizer's buckets, with that one still in flight), and after its
// last.
//
// The cells.
// - 2 ranks (ctest mpi_fault_matrix_np2): the full cross product of the five kinds inside
//   operations x six paths x three phases, fault on rank 1 (90 cells). The hierarchical path runs
//   on two simulated nodes of one rank: its ring across nodes.
// - 3 ranks (one node; _np3) and 4 ranks (_np4, the hierarchical path on two simulated nodes of 2
//   ranks, {0, 1} and {2, 3}, so that its shared-memory phase is faulted too). The cross product
//   would be some 1,500 cells, and a cell at 4 ranks on this 2-core machine takes about a second,
//   so cells are chosen: the fault goes on rank 0 (the first node's leader, which creates the
//   segment), a middle rank (1, no leader), and at 4 ranks the second node's leader (2); the
//   cheap kinds (an exception, a departure, a herd::error outside operations) get most cells, the
//   stalls, which cost their shutdown time once or twice, a few. The reserved tag is a check on
//   the posting rank alone, so it runs at 2 ranks only; the hierarchical path at 3 ranks would be
//   3 nodes of one rank, which the 2-rank row covers.
//   3 ranks, 31 cells (ring, shared memory, async, grouped, buckets):
//     exception inside: every path x ranks 0, 1, 2, the phase rotating with path and rank, so
//       that every rank meets every phase and every path (15); a stall that resumes (2: ring on
//       rank 0 mid-data, buckets on 2 in the agreement); one that never resumes (1: shared memory,
//       rank 0, mid-data); a rank that leaves inside (5: one per path, ranks 0, 1, 2, 0, 1) and
//       outside (3); a herd::error outside (4: before, between and after operations, on ranks 0,
//       1, 2); busy after its error (1, shared memory).
//   4 ranks, 33 cells: the exception on the hierarchical path on ranks 0, 1 and 2 at each phase
//     (9), which between them fault its shared-memory steps and its messages across nodes
//     (checked), and once on each other path (5, on ranks 3, 2, 1, 0, 3); stalls on the
//     hierarchical path (2 that resume, on ranks 1 and 2; 1 that never resumes, on 2); a
//     herd::error outside (3) and a departure outside (2); busy after its error (4: hierarchical
//     on rank 0; hierarchical on 1 and ring on 2 with big messages; hierarchical on rank 0 before
//     its first message across nodes, with the other leader posting its big message to it only
//     after it went away); and the shrink races, all
//     departures: rank 0, 1 and 2 leaving alone on the hierarchical path (after which its nodes
//     hold 2 and 1 ranks, and the algorithm falls back to auto), ranks 1 and 2 leaving in the
//     same step, ranks 0 and 3 in the same step on the ring, and two cells where a rank leaves
//     and another one's own shrink then fails after it said it stays (the others then give up
//     within the bound, with the agreement's error, rather than create a communicator without
//     it) (7).
// - The abort that ends the job (MPI_Abort) runs outside this program, where a test can see
//   every process go: tests/mpi/abort_job.cpp, mode "hierarchical" at 4 ranks (ctest
//   mpi_abort_job_hierarchical_np4): the second node's leader stalls before its first message
//   across nodes, and the job must be gone within the shutdown time + 2 s of the abort. Here
//   every cell sets end_job_if_unsettled = false, so that a stall that never resumes leaves the
//   test running.
// At 3 and 4 ranks the shutdown time is 3 s in the cells of stalls and 10 s in the others (0.4 s
// at 2 ranks): with more ranks than cores and another build beside (a load of 7 on 2 cores), the
// creation of a communicator with shared memory took up to 2.3 s here at 4 ranks (0.3 s on
// average, nearly all in MPI_Comm_split_type on its thread), and a renewal that gives up on its
// own creation fails a cell that should recover. Where no rank waits for a watchdog, the shutdown
// time only bounds a hang; the peers of a rank that raised or left must raise within 1.5 s. The
// stalls, which cost their shutdown time once or twice, get few cells for that reason.

#include <herd/herd.hpp>

#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/runtime/elastic.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"
#include "../support/mpi_world.hpp"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class fault_kind {
  stall_that_resumes,
  stall_that_never_resumes,
  exception,
  rank_leaves,
  reserved_tag,
  error_outside,     // a herd::error raised by the step between operations
  leaves_outside,    // an exception of another type raised there: the rank leaves the training
  busy_after_error,  // an exception inside the operation, then the rank stays busy outside herd
};
enum class path { ring, shared_memory, hierarchical, async, grouped, buckets };
enum class phase { agreement, mid_data, last_step, first_data_message };

const char* name(fault_kind k) {
  constexpr const char* names[] = {"a stall that resumes", "a stall that never resumes", "an exception inside",
                                   "a rank that leaves inside", "a reserved tag", "a herd::error outside",
                                   "an exception outside (leaves)", "busy after its error"};
  return names[static_cast<int>(k)];
}
const char* name(path p) {
  constexpr const char* names[] = {"ring", "shared memory", "hierarchical", "async", "grouped", "optimizer buckets"};
  return names[static_cast<int>(p)];
}
const char* name(phase p) {
  constexpr const char* names[] = {"agreement", "mid-data", "last step", "first data message"};
  return names[static_cast<int>(p)];
}
bool outside(fault_kind k) { return k == fault_kind::error_outside || k == fault_kind::leaves_outside; }
bool leaves(fault_kind k) { return k == fault_kind::rank_leaves || k == fault_kind::leaves_outside; }

// One cell: a kind of fault on `ranks` (each at the same phase of its own events), on one path.
struct cell {
  fault_kind kind;
  path p;
  phase ph;
  std::vector<int> ranks;
  int shrink_fails = -1;  // a departure cell: this rank's own shrink then fails
  double shutdown = 0;    // 0: the row's
  bool big = false;       // tensors 64 times larger, in segments of 256 KiB: messages MPI sends by
                          // rendezvous, which complete only once the receiver takes them
  int late_sender = -1;   // a busy cell: this rank posts its first data message late (late_by), after
                          // the busy rank left herd, so that only the busy rank's process can take it
  bool faulted(int rank) const { return std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }
};

// The timing of a row: the communicators' stall_shutdown_seconds in the cells of stalls, and how
// long a stall that resumes lasts (past the shutdown time, before the renewal gives up); the
// shutdown time of the other cells, where no rank waits for a watchdog (at 3 and 4 ranks a long
// one, so that a creation slowed by the load is not taken for a fault); and how soon the peers of a
// rank that raised or left must raise (they are told: no watchdog fires).
double shutdown = 0.4;
double resume_after = 0.6;
double patient_shutdown = 0.4;
double told_within = 0.4;
void set_timing(int ranks) {
  shutdown = ranks <= 2 ? 0.4 : 3.0;
  resume_after = 1.5 * shutdown;
  patient_shutdown = ranks <= 2 ? 0.4 : 10.0;
  told_within = ranks <= 2 ? 0.4 : 1.5;
}
bool waits_for_watchdog(fault_kind k) { return k == fault_kind::stall_that_resumes || k == fault_kind::stall_that_never_resumes; }
// A busy rank's cells: the peers must raise well before it is back (within 1 s of the fault) and
// then wait for it in the recovery (a longer shutdown time).
constexpr double busy_shutdown = 10.0;
constexpr double busy_seconds = 1.5;
constexpr double busy_peers_raise_within = 1.0;
// A late sender's cell: the busy rank stays away longer than its peer's whole bound.
constexpr double late_by = 0.8;
constexpr double busy_seconds_late = 4.0;

// 6000 f32 per step (23.4 KiB: several segments and slices), or 64 times as many in a big cell.
std::size_t elements = 6000;
std::size_t part_begin[4] = {0, 1000, 3500, 6000};  // three tensors of unequal sizes
void set_elements(bool big) {
  const std::size_t scale = big ? 64 : 1;
  elements = 6000 * scale;
  part_begin[1] = 1000 * scale;
  part_begin[2] = 3500 * scale;
  part_begin[3] = elements;
}
constexpr std::int64_t steps = 6;
constexpr std::int64_t fault_step = 3;  // after commit #2 (step 2), before commit #3 (step 4)

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

using herd_test::error_of;
using herd_test::has;

using herd_test::world_rank;
using herd_test::world_size;

// --- The injection: counts this process's events in the faulted step and runs the fault at one.

std::atomic<int> events{0};
std::atomic<int> fault_at{-1};  // the event that faults, or -1
std::atomic<fault_kind> armed_kind{fault_kind::exception};
std::atomic<bool> counting{false};
std::atomic<bool> late_send_armed{false};  // this rank is the cell's late sender, before its first data send
int outside_point = -1;  // a fault outside operations: the point of the step that raises it, or -1
fault_kind outside_kind = fault_kind::error_outside;

// The faulted step is over (or never came): nothing more is counted or injected.
void disarm() {
  counting = false;
  late_send_armed = false;
  fault_at = -1;
  outside_point = -1;
}

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

// What a rank that leaves throws: not a herd::error, so that run_elastic lets it pass, and the
// rank's communicator is destroyed on the way out (which tells its peers it left).
struct leaves_training : std::runtime_error {
  leaves_training() : std::runtime_error("this rank leaves the training") {}
};

void stall(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// A stall that never resumes, as far as its peers can tell: it lasts until every rank not stalled
// has given up altogether (each creates `given_up`.RANK then), so that the test can go on.
std::string given_up;
std::vector<int> not_stalled;
std::string given_up_by(int rank) { return given_up + "." + std::to_string(rank); }
void stall_until_given_up() {
  const auto start = clock_type::now();
  auto all_gave_up = [] {
    for (int r : not_stalled)
      if (::access(given_up_by(r).c_str(), F_OK) != 0) return false;
    return true;
  };
  while (!all_gave_up() && seconds_since(start) < 30) stall(0.01);
}

void on_event() {
  if (!counting.load()) return;
  const int e = events.fetch_add(1);
  if (e != fault_at.load()) return;
  fault_at = -1;
  switch (armed_kind.load()) {
    case fault_kind::stall_that_resumes: stall(resume_after); break;
    case fault_kind::stall_that_never_resumes: stall_until_given_up(); break;
    case fault_kind::exception:
    case fault_kind::busy_after_error: throw herd::error("injected failure inside the operation");
    case fault_kind::rank_leaves: throw leaves_training();
    case fault_kind::reserved_tag: {  // the operation waits until the user's thread has tried
      std::unique_lock lock(poster->m);
      poster->asked = true;
      poster->cv.notify_all();
      poster->cv.wait(lock, [] { return poster->answered; });
      break;
    }
    case fault_kind::error_outside:
    case fault_kind::leaves_outside: break;  // raised by the step, not here
  }
}
// What each event of the faulted step was, in a fault-free run: 'm' a message, 's' a shared-memory step.
// (The progress thread runs asynchronous operations: under a lock.)
std::mutex event_kinds_mutex;
std::string event_kinds;
void note_event(char kind) {
  if (!counting.load() || fault_at.load() >= 0) return;
  std::lock_guard lock(event_kinds_mutex);
  event_kinds += kind;
}
// A message: 'd' on an operation's data tag, 'm' on the agreement's.
void on_post(int tag, bool receiving) {
  note_event(tag >= herd::detail::data_tag_base ? 'd' : 'm');
  if (counting.load() && !receiving && tag >= herd::detail::data_tag_base && late_send_armed.exchange(false)) stall(late_by);
  on_event();
}
void on_publish(std::uint64_t) {
  note_event('s');
  on_event();
}

// A rank whose own shrink fails: after it heard who stays (and said it stays), it waits until the
// others surely counted it, then raises.
std::atomic<bool> shrink_fail_armed{false};
void failing_shrink(int) {
  if (!shrink_fail_armed.exchange(false)) return;
  stall(1.0);
  throw herd::error("injected failure in this rank's own shrink");
}

struct hooks_installed {
  hooks_installed() {
    herd::detail::post_hook() = on_post;
    herd::detail::shm_step_hook() = on_publish;
  }
  ~hooks_installed() {
    herd::detail::post_hook() = nullptr;
    herd::detail::shm_step_hook() = nullptr;
    herd::detail::shrink_hook() = nullptr;
  }
};

// The step's own fault outside operations, at point `at` (0: before its first operation, 1: after
// its first one was issued, 2: after its last).
void step_point(int at) {
  if (outside_point != at) return;
  outside_point = -1;
  if (outside_kind == fault_kind::error_outside) throw herd::error("injected failure outside any operation");
  throw leaves_training();
}

// --- The training: integer-valued weights and gradients, summed over ranks.

float gradient(float w, int rank, std::int64_t step, std::size_t i) {
  const std::int64_t x = static_cast<std::int64_t>(w) * (rank + 1) + step * 5 + static_cast<std::int64_t>(i);
  return static_cast<float>(((x % 7) + 7) % 7 - 3);
}

// The fault-free result, without herd: every rank's gradient is known here. From step `switch_at`
// on, `later_ranks` ranks train (those that stay after ranks left, renumbered from 0).
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

herd::comm_options options_for(path p, double shutdown_seconds, bool big) {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = shutdown_seconds;
  o.end_job_if_unsettled = false;  // a peer that never resumes must not end the test's job
  o.ring_segment_bytes = big ? 256 << 10 : 4096;
  o.shm_slice_bytes = 4096;
  o.allreduce_algorithm = p == path::ring            ? herd::algorithm::ring
                          : p == path::hierarchical  ? herd::algorithm::hierarchical
                          : p == path::shared_memory ? herd::algorithm::shared_memory
                                                     : herd::algorithm::automatic;
  // Two nodes: of one rank each at 2 (and 3) ranks, the ring across them; of two ranks each at 4,
  // so that the shared-memory phase within a node runs (and is faulted) too.
  if (p == path::hierarchical) o.simulated_node_size = world_size() >= 4 ? 2 : 1;
  return o;
}

// The gradients of one step, in three tensors of unequal sizes.
struct step_gradients {
  std::vector<float> parts[3];
  std::vector<herd::buffer_view> views() { return herd::views(parts[0], parts[1], parts[2]); }
};

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
  double gave_up_seconds = 0;   // from the faulted step's start to that
  bool left = false;            // this rank left the training
  std::int64_t world_changed_at = -1;  // the step the survivors went on from, and their number
  int new_size = 0;
  std::vector<float> weights;
};

// Reduces one step's gradients on path `p`; step_point(1) runs once the first operation is issued.
void reduce(path p, herd::mpi_communicator& comm, step_gradients& g) {
  switch (p) {
    case path::ring:
    case path::shared_memory:
    case path::hierarchical:
      for (int k = 0; k < 3; ++k) {
        herd::allreduce(g.parts[k], comm);
        if (k == 0) step_point(1);
      }
      break;
    case path::async: {
      std::vector<herd::handle> handles;
      for (auto& part : g.parts) {
        handles.push_back(herd::allreduce_async(part, comm));
        if (handles.size() == 1) step_point(1);
      }
      std::string first;  // every handle is waited for, the first error raised after
      for (auto& h : handles) {
        const std::string e = error_of([&] { h.wait(); });
        if (first.empty() && e != "(no herd::error)") first = e;
      }
      if (!first.empty()) throw herd::error(first);
      break;
    }
    case path::grouped:
      herd::allreduce(g.views(), comm);
      step_point(1);
      break;
    case path::buckets: {
      herd::optimizer_options o;
      o.op = herd::reduce_op::sum;
      o.bucket_bytes = 8192;
      o.first_bucket_bytes = 4096;
      no_step inner;
      herd::distributed_optimizer opt(inner, g.views(), comm, o);
      for (int i = 2; i >= 0; --i) {
        opt.mark_ready(static_cast<std::size_t>(i));
        if (i == 2) step_point(1);
      }
      opt.step();
      break;
    }
  }
}

// Trains under run_elastic; `fault_event` >= 0 arms the cell's fault on this rank, at that event of
// the faulted step (or, outside operations, at that point of it). `events_seen` (if given) gets the
// number of events of the faulted step.
outcome train(const cell& c, int fault_event, int* events_seen = nullptr) {
  MPI_Barrier(MPI_COMM_WORLD);  // the last cell's stalled rank is back
  set_elements(c.big);
  const double cell_shutdown = c.shutdown > 0 ? c.shutdown : waits_for_watchdog(c.kind) ? shutdown : patient_shutdown;
  herd::mpi_communicator comm(MPI_COMM_WORLD, options_for(c.p, cell_shutdown, c.big));
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
  clock_type::time_point fault_start = clock_type::now();
  const bool armed_here = fault_event >= 0;
  try {
    herd::run_elastic(comm, state, [&](herd::mpi_communicator& cm) {
      ++out.attempts;
      current = &cm;
      while (step < steps) {
        for (int k = 0; k < 3; ++k) {
          g.parts[k].resize(part_begin[k + 1] - part_begin[k]);
          for (std::size_t i = part_begin[k]; i < part_begin[k + 1]; ++i) {
            g.parts[k][i - part_begin[k]] = gradient(w[i], cm.rank(), step, i);
          }
        }
        const bool faulted = step == fault_step && out.attempts == 1;
        bool raised_here_outside = false;
        if (faulted) {
          fault_start = clock_type::now();
          events = 0;
          {
            std::lock_guard lock(event_kinds_mutex);
            event_kinds.clear();
          }
          armed_kind = c.kind;
          late_send_armed = cm.rank() == c.late_sender;
          fault_at = armed_here && !outside(c.kind) ? fault_event : -1;
          counting = true;
          if (armed_here && outside(c.kind)) {
            outside_kind = c.kind;
            outside_point = fault_event;
            raised_here_outside = true;
          }
        }
        try {
          step_point(0);
          reduce(c.p, cm, g);
          step_point(2);
        } catch (const herd::error& e) {
          disarm();
          // The first error after the fault (a rank that completed the faulted operation raises in
          // a later one).
          if (out.attempts == 1 && step >= fault_step) {
            out.error = e.what();
            out.seconds = seconds_since(fault_start);
            // The communicator of a rank that raised outside operations is not aborted yet
            // (run_elastic does it): a probe would wait for peers that are not coming.
            if (!raised_here_outside) {
              out.refusal = error_of([&] {
                std::vector<float> probe(4);
                herd::allreduce(probe, cm);
              });
            }
            if (armed_here && c.kind == fault_kind::busy_after_error) stall(c.late_sender >= 0 ? busy_seconds_late : busy_seconds);
          }
          throw;
        }
        if (faulted) {
          disarm();
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
    out.gave_up_seconds = seconds_since(fault_start);
  } catch (const leaves_training&) {
    out.left = true;
  }
  disarm();
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

// herd's segments mapped in this process, anonymous ("/memfd:herd (deleted)") or named.
int herd_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:herd") != std::string::npos || line.find("/dev/shm/herd.") != std::string::npos) ++n;
  }
  return n;
}

constexpr path every_path[] = {path::ring, path::shared_memory, path::hierarchical, path::async, path::grouped, path::buckets};
constexpr phase every_phase[] = {phase::agreement, phase::mid_data, phase::last_step};

// The events of each rank in the faulted step of a fault-free run on path p (the same in every
// run), counted once per process. A fault-free run must give the expected bits.
std::map<std::pair<path, bool>, std::string> kinds_of_events;  // this rank's, in a fault-free run
const std::vector<int>& event_counts(path p, bool big) {
  static std::map<std::pair<path, bool>, std::vector<int>> counts;
  auto it = counts.find({p, big});
  if (it != counts.end()) return it->second;
  int count = 0;
  cell clean_cell{fault_kind::exception, p, phase::agreement, {}};
  clean_cell.big = big;
  const outcome clean = train(clean_cell, -1, &count);
  {
    std::lock_guard lock(event_kinds_mutex);
    kinds_of_events[{p, big}] = event_kinds;
  }
  REQUIRE(clean.weights == expected_weights(world_size()));
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  MPI_Allgather(&count, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int n : all) REQUIRE(n > 2);
  return counts[{p, big}] = all;
}

// The event (or, outside operations, the point) at which the cell faults on `rank`.
int fault_event_of(const cell& c, int rank) {
  if (outside(c.kind)) return static_cast<int>(c.ph);
  const int count = event_counts(c.p, c.big)[static_cast<std::size_t>(rank)];
  if (c.ph == phase::first_data_message) {
    const std::string& kinds = kinds_of_events[{c.p, c.big}];  // this rank's own
    REQUIRE(kinds.find('d') != std::string::npos);
    return static_cast<int>(kinds.find('d'));
  }
  return c.ph == phase::agreement ? 0 : c.ph == phase::mid_data ? count / 2 : count - 1;
}

// Whether some cell faulted a shared-memory step, and some a message, on the hierarchical path.
bool faulted_shm_step = false;
bool faulted_message = false;

// Runs one cell on every rank and checks what each rank saw.
void run_cell(const cell& c, int number) {
  const int rank = world_rank();
  const int size = world_size();
  const int leavers = leaves(c.kind) ? static_cast<int>(c.ranks.size()) : 0;
  const double cell_shutdown = c.shutdown > 0 ? c.shutdown : waits_for_watchdog(c.kind) ? shutdown : patient_shutdown;
  const double bound = cell_shutdown + 2;
  // A rank that raised or left told its peers (an abort, a departure): they raise at once, before
  // any watchdog could have fired; only a stall leaves them to the watchdog.
  const double told_bound = std::min(bound, told_within);
  std::string ranks_text;
  for (int r : c.ranks) ranks_text += (ranks_text.empty() ? "" : ",") + std::to_string(r);
  for (int r : c.ranks) (void)fault_event_of(c, r);  // counts first, on every rank alike
  const int at = c.faulted(rank) ? fault_event_of(c, rank) : -1;
  const std::string& kinds = kinds_of_events[{c.p, c.big}];
  const char what = outside(c.kind) || at < 0 || at >= static_cast<int>(kinds.size()) ? '-' : kinds[static_cast<std::size_t>(at)];
  if (c.p == path::hierarchical && what == 's') faulted_shm_step = true;
  if (c.p == path::hierarchical && (what == 'm' || what == 'd')) faulted_message = true;
  INFO("cell " << number << ": " << std::string(name(c.kind)) << " on rank(s) " << ranks_text << ", path "
               << std::string(name(c.p)) << ", phase " << std::string(name(c.ph)) << " (event " << at
               << std::string(what == 's' ? ", a shared-memory step" : what == 'm' || what == 'd' ? ", a message" : "") << ")"
               << (c.shrink_fails >= 0 ? ", then rank " + std::to_string(c.shrink_fails) + "'s own shrink fails" : "")
               << std::string(c.big ? ", big messages" : ""));
  int first_pid = static_cast<int>(::getpid());
  MPI_Bcast(&first_pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  // In the working directory (ctest's: the test's own folder), named by rank 0's process.
  given_up = "herd-fault-matrix." + std::to_string(first_pid) + "." + std::to_string(number);
  not_stalled.clear();
  for (int r = 0; r < size; ++r)
    if (!c.faulted(r)) not_stalled.push_back(r);
  tag_poster tags;
  poster = &tags;
  std::thread user;
  if (c.kind == fault_kind::reserved_tag && c.faulted(rank)) {
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
  if (rank == c.shrink_fails) {
    shrink_fail_armed = true;
    herd::detail::shrink_hook() = failing_shrink;
  }
  const outcome o = train(c, at);
  herd::detail::shrink_hook() = nullptr;
  shrink_fail_armed = false;
  if (user.joinable()) user.join();
  poster = nullptr;
  if (!c.faulted(rank) && c.kind == fault_kind::stall_that_never_resumes) std::ofstream{given_up_by(rank)} << "gave up\n";
  const std::vector<float> expected = expected_weights(size);  // of this cell's size (train set it)
  INFO("rank " << rank << ": error after " << o.seconds << " s: " << o.error << "; then " << o.gave_up);
  switch (c.kind) {
    case fault_kind::reserved_tag:
      CHECK(o.attempts == 1);
      CHECK(o.error.empty());
      if (c.faulted(rank)) CHECK(has(tags.answer, "is in herd's reserved range"));
      CHECK(o.weights == expected);
      break;
    case fault_kind::stall_that_never_resumes:
      // No recovery without the rank: run_elastic's renewal gives up too, on every rank. The
      // stalled rank resumes once the others gave up and left: a shrink that counts who is
      // still there leaves it alone, and it goes on as a world of one (a rank that said it
      // stays and then left is not counted), unless it heard of their departure too late.
      CHECK(!o.error.empty());
      CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
      if (!c.faulted(rank)) CHECK(!o.gave_up.empty());
      else CHECK((!o.gave_up.empty() || o.new_size == 1));
      if (!c.faulted(rank)) CHECK(o.seconds < bound);
      break;
    case fault_kind::rank_leaves:
    case fault_kind::leaves_outside:
      if (c.faulted(rank)) {
        CHECK(o.left);
        break;
      }
      if (c.shrink_fails >= 0) {
        // The ranks that stay had counted the failing rank when it left: none may go on without
        // it (their communicators would differ), so every one gives up, within the bound.
        CHECK(!o.error.empty());
        CHECK(!o.gave_up.empty());
        CHECK(o.gave_up_seconds < told_within + 1.0 + told_within);  // its shrink failed after 1 s
        if (rank == c.shrink_fails) CHECK(has(o.gave_up, "injected failure in this rank's own shrink"));
        // (It names the failing rank, or a rank that stays and gave up first for that reason.)
        else CHECK(has(o.gave_up, " left while the ranks that stay agreed on who they are"));
        break;
      }
      // The others raise at once, shrink to a communicator of their own and go on from the
      // last commit they hold: the result of a run that switches to fewer ranks there.
      CHECK(o.gave_up.empty());
      CHECK(o.attempts == 2);
      CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
      CHECK(o.seconds < told_bound);
      CHECK(o.new_size == size - leavers);
      CHECK((o.world_changed_at == 2 || o.world_changed_at == 4));  // commit #2, or #3 if step 3 completed here
      CHECK(o.weights == expected_weights(size, o.world_changed_at, size - leavers));
      break;
    case fault_kind::stall_that_resumes:
    case fault_kind::exception:
    case fault_kind::error_outside:
    case fault_kind::busy_after_error:
      CHECK(o.gave_up.empty());
      CHECK(o.attempts == 2);
      CHECK(!o.error.empty());
      if (!(c.kind == fault_kind::error_outside && c.faulted(rank))) {
        CHECK(has(o.refusal, "this communicator was aborted by an earlier error"));
      }
      // (A late sender learns of the fault only once it posted, late_by after it.)
      const double late = rank == c.late_sender ? late_by : 0.0;
      CHECK(o.seconds < (c.kind == fault_kind::stall_that_resumes ? bound : late + told_bound));
      if ((c.kind == fault_kind::exception || c.kind == fault_kind::busy_after_error) && c.faulted(rank)) {
        CHECK(has(o.error, "injected failure inside the operation"));
      }
      if (c.kind == fault_kind::error_outside) {
        CHECK(has(o.error, c.faulted(rank) ? "injected failure outside any operation" : "it raised outside any operation"));
      }
      // The busy rank's peers raise without its help, well before it is back.
      if (c.kind == fault_kind::busy_after_error && !c.faulted(rank)) {
        CHECK(o.seconds < late + busy_peers_raise_within);
      }
      CHECK(o.weights == expected);
      break;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (!c.faulted(rank)) ::unlink(given_up_by(rank).c_str());
  CHECK(herd_mappings() == 0);
}

void run_cells(const std::vector<cell>& cells) {
  set_timing(world_size());
  const std::vector<std::string> segments_before = herd_segments();
  hooks_installed hooks;
  int number = 0;
  for (const cell& c : cells) run_cell(c, ++number);
  CHECK(herd_segments() == segments_before);
}

// The row of `kind` at 2 ranks: every path, every phase, fault on rank 1.
std::vector<cell> full_row(fault_kind kind) {
  std::vector<cell> cells;
  for (path p : every_path)
    for (phase ph : every_phase) cells.push_back({kind, p, ph, {1}});
  return cells;
}

// The paths at 3 ranks (one node): all but the hierarchical one, whose nodes of one rank the
// 2-rank matrix covers.
constexpr path paths_3[] = {path::ring, path::shared_memory, path::async, path::grouped, path::buckets};
phase rotated(int i) { return every_phase[i % 3]; }

}  // namespace

HERD_MPI_TEST_CASE("fault matrix at 2 ranks: a stall that resumes, on every path and phase", 2) {
  run_cells(full_row(fault_kind::stall_that_resumes));
}
HERD_MPI_TEST_CASE("fault matrix at 2 ranks: a stall that never resumes, on every path and phase", 2) {
  run_cells(full_row(fault_kind::stall_that_never_resumes));
}
HERD_MPI_TEST_CASE("fault matrix at 2 ranks: an exception inside the operation, on every path and phase", 2) {
  run_cells(full_row(fault_kind::exception));
}
HERD_MPI_TEST_CASE("fault matrix at 2 ranks: a rank that leaves inside the operation, on every path and phase", 2) {
  run_cells(full_row(fault_kind::rank_leaves));
}
HERD_MPI_TEST_CASE("fault matrix at 2 ranks: a user's message on a reserved tag while an operation runs, on every path and phase", 2) {
  run_cells(full_row(fault_kind::reserved_tag));
}

// 3 ranks, one node. The exception on every path and every rank, the phase rotating (15 cells);
// the stalls on two cells and one; departures on every path, rank rotating (rank 0 among them).
HERD_MPI_TEST_CASE("fault matrix at 3 ranks: faults inside operations, on rank 0, 1 and 2", 3) {
  std::vector<cell> cells;
  for (int i = 0; i < 5; ++i)
    for (int r = 0; r < 3; ++r) cells.push_back({fault_kind::exception, paths_3[i], rotated(i + r), {r}});
  cells.push_back({fault_kind::stall_that_resumes, path::ring, phase::mid_data, {0}});
  cells.push_back({fault_kind::stall_that_resumes, path::buckets, phase::agreement, {2}});
  cells.push_back({fault_kind::stall_that_never_resumes, path::shared_memory, phase::mid_data, {0}});
  run_cells(cells);
}
HERD_MPI_TEST_CASE("fault matrix at 3 ranks: ranks that leave, inside and outside operations", 3) {
  std::vector<cell> cells;
  for (int i = 0; i < 5; ++i) cells.push_back({fault_kind::rank_leaves, paths_3[i], rotated(i), {i % 3}});
  cells.push_back({fault_kind::leaves_outside, path::ring, phase::mid_data, {2}});
  cells.push_back({fault_kind::leaves_outside, path::grouped, phase::agreement, {0}});
  cells.push_back({fault_kind::leaves_outside, path::buckets, phase::mid_data, {1}});
  run_cells(cells);
}
HERD_MPI_TEST_CASE("fault matrix at 3 ranks: a herd::error outside operations, and a rank busy after its error", 3) {
  std::vector<cell> cells;
  cells.push_back({fault_kind::error_outside, path::ring, phase::agreement, {1}});
  cells.push_back({fault_kind::error_outside, path::async, phase::mid_data, {0}});
  cells.push_back({fault_kind::error_outside, path::buckets, phase::last_step, {2}});
  cells.push_back({fault_kind::error_outside, path::shared_memory, phase::mid_data, {2}});
  cells.push_back({fault_kind::busy_after_error, path::shared_memory, phase::mid_data, {1}, -1, busy_shutdown});
  run_cells(cells);
}

// 4 ranks: the hierarchical path on two simulated nodes of 2 ranks ({0, 1}, {2, 3}); the others on
// one node. The fault on rank 0 (the first node's leader), 1 (a middle rank, no leader) and 2 (the
// second node's leader).
HERD_MPI_TEST_CASE("fault matrix at 4 ranks: faults inside operations, on a leader, a middle rank and the other leader", 4) {
  std::vector<cell> cells;
  for (int r = 0; r < 3; ++r)
    for (phase ph : every_phase) cells.push_back({fault_kind::exception, path::hierarchical, ph, {r}});
  cells.push_back({fault_kind::exception, path::ring, phase::mid_data, {3}});
  cells.push_back({fault_kind::exception, path::shared_memory, phase::last_step, {2}});
  cells.push_back({fault_kind::exception, path::async, phase::agreement, {1}});
  cells.push_back({fault_kind::exception, path::grouped, phase::mid_data, {0}});
  cells.push_back({fault_kind::exception, path::buckets, phase::last_step, {3}});
  cells.push_back({fault_kind::stall_that_resumes, path::hierarchical, phase::mid_data, {1}});
  cells.push_back({fault_kind::stall_that_resumes, path::hierarchical, phase::last_step, {2}});
  cells.push_back({fault_kind::stall_that_never_resumes, path::hierarchical, phase::mid_data, {2}});
  faulted_shm_step = faulted_message = false;
  run_cells(cells);
  // The hierarchical path's faults hit both its shared-memory phase and its messages across nodes.
  int hit[2] = {faulted_shm_step ? 1 : 0, faulted_message ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, hit, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(hit[0] == 1);
  CHECK(hit[1] == 1);
}
HERD_MPI_TEST_CASE("fault matrix at 4 ranks: faults outside operations, and a rank busy after its error", 4) {
  std::vector<cell> cells;
  cells.push_back({fault_kind::error_outside, path::hierarchical, phase::agreement, {1}});
  cells.push_back({fault_kind::error_outside, path::hierarchical, phase::last_step, {2}});
  cells.push_back({fault_kind::error_outside, path::async, phase::mid_data, {0}});
  cells.push_back({fault_kind::leaves_outside, path::hierarchical, phase::mid_data, {0}});
  cells.push_back({fault_kind::leaves_outside, path::buckets, phase::agreement, {2}});
  cells.push_back({fault_kind::busy_after_error, path::hierarchical, phase::mid_data, {0}, -1, busy_shutdown});
  // The busy rank's peers had sent it messages MPI completes only once it takes them: their aborts
  // wait for those sends, which its process must take while the rank is busy.
  cells.push_back({fault_kind::busy_after_error, path::hierarchical, phase::last_step, {1}, -1, busy_shutdown, true});
  cells.push_back({fault_kind::busy_after_error, path::ring, phase::mid_data, {2}, -1, busy_shutdown, true});
  // The first node's leader raises before its first message across nodes and goes away for 4 s;
  // the other leader posts its big message to it only after that (late_by): no wait of the busy
  // rank is left to take it, so its process must, or that leader's abort waits for it.
  cells.push_back({fault_kind::busy_after_error, path::hierarchical, phase::first_data_message, {0}, -1, busy_shutdown, true, 2});
  run_cells(cells);
}
// Departures: one rank of each kind on the hierarchical path (after which its nodes hold 2 and 1
// ranks, and the algorithm falls back to auto), two ranks at once, and a rank whose own shrink
// fails after it said it stays.
HERD_MPI_TEST_CASE("fault matrix at 4 ranks: shrink races", 4) {
  std::vector<cell> cells;
  cells.push_back({fault_kind::rank_leaves, path::hierarchical, phase::agreement, {0}});
  cells.push_back({fault_kind::rank_leaves, path::hierarchical, phase::mid_data, {1}});
  cells.push_back({fault_kind::rank_leaves, path::hierarchical, phase::last_step, {2}});
  cells.push_back({fault_kind::rank_leaves, path::hierarchical, phase::mid_data, {1, 2}});
  cells.push_back({fault_kind::rank_leaves, path::ring, phase::last_step, {0, 3}});
  cells.push_back({fault_kind::rank_leaves, path::hierarchical, phase::mid_data, {3}, 1});
  cells.push_back({fault_kind::rank_leaves, path::async, phase::agreement, {0}, 2});
  run_cells(cells);
}
