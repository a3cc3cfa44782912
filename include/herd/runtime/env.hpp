#pragma once
// herd's environment variables, read once per process. Each has a programmatic twin in the
// options of the object it affects; the variable only sets the default.
//
//   HERD_STALL_CHECK_TIME_SECONDS     warn on stderr when a rank has waited this long for a peer (60; 0 = never)
//   HERD_STALL_SHUTDOWN_TIME_SECONDS  raise herd::error after waiting this long (0 = wait forever, the default)
//   HERD_RING_SEGMENT_BYTES           pipeline segment of the ring collectives (1048576)
//   HERD_CHECK_ARGUMENTS              1: collectives compare their arguments across ranks first (default); 0: skip
//   HERD_FUSION_THRESHOLD             bytes of one fusion buffer of the distributed optimizer (134217728; 0 = off)

#include <herd/core/error.hpp>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace herd::runtime {

// The variable as a non-negative number, or `fallback` when unset or empty.
inline double env_number(const char* variable, double fallback) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(value >= 0) || !(value <= 1e15)) {
    throw error(std::string("herd: environment variable ") + variable + "='" + text +
                "' is not a number between 0 and 1e15. Unset it or give a number such as 60.");
  }
  return value;
}

struct settings {
  double stall_check_seconds = 60;
  double stall_shutdown_seconds = 0;
  std::size_t ring_segment_bytes = std::size_t{1} << 20;
  bool check_arguments = true;
  std::size_t fusion_threshold_bytes = std::size_t{128} << 20;
};

inline settings read_settings() {
  settings s;
  s.stall_check_seconds = env_number("HERD_STALL_CHECK_TIME_SECONDS", s.stall_check_seconds);
  s.stall_shutdown_seconds = env_number("HERD_STALL_SHUTDOWN_TIME_SECONDS", s.stall_shutdown_seconds);
  s.ring_segment_bytes = static_cast<std::size_t>(
      env_number("HERD_RING_SEGMENT_BYTES", static_cast<double>(s.ring_segment_bytes)));
  if (s.ring_segment_bytes == 0) s.ring_segment_bytes = settings{}.ring_segment_bytes;
  s.check_arguments = env_number("HERD_CHECK_ARGUMENTS", 1) != 0;
  s.fusion_threshold_bytes = static_cast<std::size_t>(
      env_number("HERD_FUSION_THRESHOLD", static_cast<double>(s.fusion_threshold_bytes)));
  return s;
}

// The process-wide defaults, read from the environment on first use. A program (or a test) may
// change them before its first collective; every rank must then hold the same values.
inline settings& defaults() {
  static settings s = read_settings();
  return s;
}

}  // namespace herd::runtime
