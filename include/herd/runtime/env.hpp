#pragma once
// herd's environment variables, read once per process. Each has a programmatic twin in the
// options of the object it affects; the variable only sets the default.
//
//   HERD_STALL_CHECK_TIME_SECONDS     warn on stderr when a rank has waited this long (60; 0 = never)
//   HERD_STALL_SHUTDOWN_TIME_SECONDS  raise herd::error after waiting this long (1800; 0 = wait forever)
//   HERD_RING_SEGMENT_BYTES           pipeline segment of the ring collectives (1048576)
//   HERD_CHECK_ARGUMENTS              1: collectives compare their arguments across ranks first (default); 0: skip
//   HERD_PROGRESS_THREAD              1: asynchronous operations progress on a thread of their own (default);
//                                     0: only inside handle::wait() and handle::test()
//   HERD_FUSION_THRESHOLD             bytes of one fusion buffer of the distributed optimizer (134217728; 0 = off)
//   HERD_BUCKET_BYTES                 bytes of a bucket of the distributed optimizer, with mark_ready (26214400)
//   HERD_BUCKET_BYTES                 bytes of a bucket of the distributed optimizer with mark_ready (26214400)
//
// A malformed value does not throw here: it is kept in settings::problem, and the next communicator
// created reports it on every rank (a rank that threw alone would leave the others waiting in the
// creation).

#include <herd/core/error.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace herd::runtime {

struct settings {
  double stall_check_seconds = 60;
  double stall_shutdown_seconds = 1800;  // 30 minutes, as torch.distributed's default timeout
  std::size_t ring_segment_bytes = std::size_t{1} << 20;
  bool check_arguments = true;
  bool progress_thread = true;
  std::size_t fusion_threshold_bytes = std::size_t{128} << 20;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::string problem;  // the first malformed variable, in words; empty when all are fine
};

// The variable as a number in [0, 1e15], or `fallback` when unset, empty or malformed (then
// `problem` says so, unless it already holds an earlier problem).
inline double env_number(const char* variable, double fallback, std::string& problem) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(value >= 0) || !(value <= 1e15)) {
    if (problem.empty()) {
      problem = std::string("environment variable ") + variable + "='" + text +
                "' is not a number between 0 and 1e15; unset it or give a number such as 60";
    }
    return fallback;
  }
  return value;
}

inline settings read_settings() {
  settings s;
  s.stall_check_seconds = env_number("HERD_STALL_CHECK_TIME_SECONDS", s.stall_check_seconds, s.problem);
  s.stall_shutdown_seconds = env_number("HERD_STALL_SHUTDOWN_TIME_SECONDS", s.stall_shutdown_seconds, s.problem);
  s.ring_segment_bytes = static_cast<std::size_t>(
      env_number("HERD_RING_SEGMENT_BYTES", static_cast<double>(s.ring_segment_bytes), s.problem));
  if (s.ring_segment_bytes == 0) s.ring_segment_bytes = settings{}.ring_segment_bytes;
  s.check_arguments = env_number("HERD_CHECK_ARGUMENTS", 1, s.problem) != 0;
  s.progress_thread = env_number("HERD_PROGRESS_THREAD", 1, s.problem) != 0;
  s.fusion_threshold_bytes = static_cast<std::size_t>(
      env_number("HERD_FUSION_THRESHOLD", static_cast<double>(s.fusion_threshold_bytes), s.problem));
  s.bucket_bytes = static_cast<std::size_t>(env_number("HERD_BUCKET_BYTES", static_cast<double>(s.bucket_bytes), s.problem));
  if (s.bucket_bytes == 0) s.bucket_bytes = settings{}.bucket_bytes;
  return s;
}

// The process-wide defaults, read from the environment on first use. A program (or a test) may
// change them before it creates a communicator, which copies them; every rank must then hold the
// same values (a communicator's creation checks that it does).
inline settings& defaults() {
  static settings s = read_settings();
  return s;
}

}  // namespace herd::runtime
