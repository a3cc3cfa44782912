#ifndef HERD_COMM_DETAIL_WATCHDOG_HPP
#define HERD_COMM_DETAIL_WATCHDOG_HPP
// How a rank waits: briefly spinning (an answer is usually microseconds away), then yielding the
// core (which lets a peer sharing it run: with more ranks than cores, a ring's segments arrive
// within this phase, and sleeping instead made 32-256 MiB allreduces at 4 ranks on 2 cores twice
// as slow), and after 10 ms sleeping in steps that grow with the time already waited (an eighth
// of it, at most a millisecond), so that a rank waiting for a late peer neither burns a core nor
// adds more than a small fraction to the wait. And while it waits, the watchdog: a warning
// after stall_check_seconds naming the operation and the peer, herd::error after
// stall_shutdown_seconds. watched_wait, below, is that loop, the one every blocking wait of
// herd's communicators runs.

#include <herd/comm/detail/operation_state.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace herd::detail {

class waiting {
 public:
  using clock = std::chrono::steady_clock;

  explicit waiting(const comm_options& options) : options_(options), start_(clock::now()), last_tick_(start_) {}

  // Gives the core away for a while, the longer the wait has lasted.
  void pause() {
    if (++polls_ < 64) return;
    const auto waited = clock::now() - start_;
    if (waited < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::min<clock::duration>(waited / 8, std::chrono::milliseconds(1)));
  }

  // True every few milliseconds: time for the slower checks (peers' notices, the watchdog). (A
  // wait that pauses in its own way, never calling pause(), passes the first test every time.)
  bool tick() {
    if ((polls_ & 15u) != 0) return false;
    const auto now = clock::now();
    if (now - last_tick_ < std::chrono::milliseconds(5)) return false;
    last_tick_ = now;
    return true;
  }

  double seconds() const { return std::chrono::duration<double>(clock::now() - start_).count(); }

  // Warns once after stall_check_seconds; raises after stall_shutdown_seconds. `what`: "in
  // allreduce #17 (4 MiB f32) to receive from rank 1".
  void watch(const error_site& site, const std::string& what);

 private:
  static std::string number(double x);

  comm_options options_;
  clock::time_point start_;
  clock::time_point last_tick_;
  unsigned polls_ = 0;
  bool warned_ = false;
};

// How a watched wait passes the time between its looks at done(), and when it ticks. The
// default: waiting's pause (spin, yield, then sleep), ticking every few milliseconds.
struct polled {
  bool tick(waiting& watch) const { return watch.tick(); }
  void pause(waiting& watch) const { watch.pause(); }
};

// Or asleep on a condition variable until notified, for at most `period`, unless ready() already
// (looked at under the mutex, which the notifier takes too: news since the last look is not
// missed). It ticks at most once a period, the first a period after the start, however often it
// is woken: other traffic on the condition variable neither keeps the watchdog quiet nor calls it
// at every wake-up. (What must be seen at once, a failure, is for done() to check.)
template <class Ready>
class woken {
 public:
  woken(std::mutex& mutex, std::condition_variable& wake, std::chrono::milliseconds period, Ready ready)
      : mutex_(mutex), wake_(wake), period_(period), ready_(ready) {}

  bool tick(waiting& watch) {
    const double now = watch.seconds();
    if (now - last_tick_ < std::chrono::duration<double>(period_).count()) return false;
    last_tick_ = now;
    return true;
  }
  void pause(waiting&) const {
    std::unique_lock lock(mutex_);
    if (!ready_()) wake_.wait_for(lock, period_);
  }

 private:
  std::mutex& mutex_;
  std::condition_variable& wake_;
  std::chrono::milliseconds period_;
  Ready ready_;
  double last_tick_ = 0;
};

// The watched wait: until done(), pausing as `pause` says (polled, or woken), and on each tick
// on_tick(), the place's own slower checks (tending aborted communicators, peers' notices: they
// raise when the wait is in vain), then the watchdog, which warns, then raises, naming `site` and
// what() it waits for (built only then). A check that must run at every look (NCCL's errors, a
// failed local world) is done()'s, which may raise too.
template <class Done, class OnTick, class What, class Pause = polled>
void watched_wait(const comm_options& options, const error_site& site, Done done, OnTick on_tick, What what,
                  Pause pause = {}) {
  waiting watch(options);
  while (!done()) {
    if (pause.tick(watch)) {
      on_tick();
      watch.watch(site, what());
    }
    pause.pause(watch);
  }
}

// "in allreduce #17 (4 MiB f32) to receive from rank 1", or outside operations "to receive from
// rank 1 (tag 11)".
HERD_SEPARATE std::string waiting_for(const operation_state& ops, int peer, bool receiving, int tag);

// The error site of the running operation ("allreduce"), or `fallback` outside operations.
inline error_site site_of(const operation_state& ops, const char* fallback, int rank, int size) {
  return {ops.in_operation() ? name(ops.current().kind) : fallback, rank, size};
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE void waiting::watch(const error_site& site, const std::string& what) {
  const double waited = seconds();
  char amount[32];
  std::snprintf(amount, sizeof amount, waited < 10 ? "%.1f" : "%.0f", waited);
  const std::string text = "rank " + std::to_string(site.rank) + " has waited " + amount + " s " + what;
  if (options_.stall_shutdown_seconds > 0 && waited >= options_.stall_shutdown_seconds) {
    raise(site,
          text + " and gives up (HERD_STALL_SHUTDOWN_TIME_SECONDS=" + number(options_.stall_shutdown_seconds) + ")",
          "Every rank must call the same collectives in the same order; check that no rank skipped one, "
          "ran out of data early, or is stuck elsewhere");
  }
  if (!warned_ && options_.stall_check_seconds > 0 && waited >= options_.stall_check_seconds) {
    warned_ = true;
    const std::string then =
        options_.stall_shutdown_seconds > 0
            ? "herd raises an error after HERD_STALL_SHUTDOWN_TIME_SECONDS=" + number(options_.stall_shutdown_seconds) +
                  " s"
            : "herd waits on (HERD_STALL_SHUTDOWN_TIME_SECONDS=0: it never gives up)";
    std::fprintf(stderr,
                 "herd warning: %s. A rank may have skipped a collective, called them in another order, or be "
                 "stuck; %s.\n",
                 text.c_str(), then.c_str());
    std::fflush(stderr);
  }
}

HERD_SEPARATE std::string waiting::number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

HERD_SEPARATE std::string waiting_for(const operation_state& ops, int peer, bool receiving, int tag) {
  std::string text;
  if (ops.in_operation()) text = "in " + ops.current().str() + " ";
  if (peer < 0) return text + "for the other ranks";
  text += std::string("to ") + (receiving ? "receive from" : "send to") + " rank " + std::to_string(peer);
  if (!ops.in_operation()) text += " (tag " + std::to_string(tag) + ")";
  return text;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_WATCHDOG_HPP
