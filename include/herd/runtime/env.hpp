#ifndef HERD_RUNTIME_ENV_HPP
#define HERD_RUNTIME_ENV_HPP
// herd's environment variables, read once per process. Each has a programmatic twin in the
// options of the object it affects; the variable only sets the default.
//
//   HERD_STALL_CHECK_TIME_SECONDS     warn on stderr when a rank has waited this long (60; 0 = never)
//   HERD_STALL_SHUTDOWN_TIME_SECONDS  raise herd::error after waiting this long (1800; 0 = wait forever;
//                                     else at least 0.1)
//   HERD_RING_SEGMENT_BYTES           pipeline segment of the ring collectives, and the hierarchical
//                                     allreduce's piece (1048576)
//   HERD_CHECK_ARGUMENTS              1: collectives compare their arguments across ranks first (default); 0: skip
//   HERD_PROGRESS_THREAD              1: asynchronous operations progress on a thread of their own (default);
//                                     0: only inside handle::wait() and handle::test()
//   HERD_FUSION_THRESHOLD             bytes of one fusion buffer of the distributed optimizer (134217728; 0 = off)
//   HERD_BUCKET_BYTES                 bytes of a bucket of the distributed optimizer, with mark_ready (26214400;
//                                     at least 1)
//   HERD_ALLREDUCE_ALGORITHM          auto (default): shared memory among ranks of one node, hierarchical
//                                     across nodes, the ring otherwise; ring: MPI messages only; shm; hierarchical
//   HERD_SHM_SLICE_BYTES              bytes of each of a rank's two shared-memory buffers: the pipelines' slice,
//                                     the allreduce's being half of it unless ranks outnumber cores (1048576)
//   HERD_REPRODUCIBLE                 1: float sums and averages whose bits depend on the ranks' values only, not on
//                                     the algorithm, layout, bucket split or rank order (0, the default)
//   HERD_SIMULATE_NODE_SIZE           tests and benchmarks only: treat each run of this many consecutive ranks
//                                     as one node (0, the default: MPI_COMM_TYPE_SHARED decides)
//   HERD_TIMELINE                     write a timeline to this path, a file per rank (runtime/timeline.hpp)
//
// Byte counts and rank counts are whole numbers, flags 0 or 1, times seconds (fractions allowed).
// A malformed value does not throw here: it is kept in settings::problem, and the next communicator
// created reports it on every rank (a rank that threw alone would leave the others waiting in the
// creation).

#include <herd/core/config.hpp>
#include <herd/core/error.hpp>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace herd {

// How collectives move host tensors between the processes of an mpi_communicator.
enum class algorithm : std::uint8_t {
  automatic,      // shared memory when every rank is on one node; hierarchical across nodes; else the ring
  ring,           // MPI messages only (herd's ring, tree and chain), no shared memory
  shared_memory,  // every collective through shared memory: all ranks must share one node
  hierarchical,   // allreduce: shared memory within nodes, ring across them (equal ranks per node)
};

constexpr const char* name(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "auto";
    case algorithm::ring: return "ring";
    case algorithm::shared_memory: return "shm";
    case algorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

}  // namespace herd

namespace herd::runtime {

struct settings {
  double stall_check_seconds = 60;
  double stall_shutdown_seconds = 1800;  // 30 minutes, as torch.distributed's default timeout
  std::size_t ring_segment_bytes = std::size_t{1} << 20;
  bool check_arguments = true;
  bool progress_thread = true;
  std::size_t fusion_threshold_bytes = std::size_t{128} << 20;
  std::size_t bucket_bytes = std::size_t{25} << 20;
  algorithm allreduce_algorithm = algorithm::automatic;
  std::size_t shm_slice_bytes = std::size_t{1} << 20;
  bool reproducible = false;
  int simulated_node_size = 0;
  std::string problem;  // the first malformed variable, in words; empty when all are fine
};

// What a variable holds: seconds (a fraction is fine), a whole number (bytes, ranks), or a flag.
enum class env_kind : std::uint8_t { seconds, whole, flag };

// The variable as a number in [0, 1e15] (a whole one unless `kind` is seconds, 0 or 1 for a flag),
// or `fallback` when unset, empty or malformed (then `problem` says what is wrong and what to give,
// unless it already holds an earlier problem).
HERD_SEPARATE double env_number(const char* variable, double fallback, std::string& problem,
                                env_kind kind = env_kind::seconds);

// HERD_ALLREDUCE_ALGORITHM: auto, ring, shm or hierarchical.
HERD_SEPARATE algorithm env_algorithm(std::string& problem);

HERD_SEPARATE settings read_settings();

// The process-wide defaults, read from the environment on first use. A program (or a test) may
// change them before it creates a communicator, which copies them; every rank must then hold the
// same values (a communicator's creation checks that it does).
inline settings& defaults() {
  static settings s = read_settings();
  return s;
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE double env_number(const char* variable, double fallback, std::string& problem, env_kind kind) {
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return fallback;
  // Decimal only, as the table of docs/environment.md shows them: strtod alone would also take
  // leading blanks, a sign, hexadecimal ("0x10", "0x1p4"), "inf" and "nan".
  const std::string_view digits(text);
  const bool decimal = (std::isdigit(static_cast<unsigned char>(digits[0])) != 0 || digits[0] == '.') &&
                       digits.find_first_not_of("0123456789.eE+-") == std::string_view::npos;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  const bool number = decimal && errno == 0 && end != text && *end == '\0' && value >= 0 && value <= 1e15;
  const bool fits = number && (kind == env_kind::seconds || value == static_cast<double>(static_cast<std::uint64_t>(value))) &&
                    (kind != env_kind::flag || value <= 1);
  if (!fits) {
    if (problem.empty()) {
      const std::string head = std::string("environment variable ") + variable + "='" + text + "' ";
      switch (kind) {
        case env_kind::seconds:
          problem = head + "is not a number of seconds between 0 and 1e15; unset it or give one such as 60";
          break;
        case env_kind::whole:
          problem = head + "is not a whole number between 0 and 1e15; unset it or give one such as " +
                    std::to_string(static_cast<std::uint64_t>(fallback));
          break;
        case env_kind::flag: problem = head + "is neither 0 nor 1; unset it, or give 1 (on) or 0 (off)"; break;
      }
    }
    return fallback;
  }
  return value;
}

HERD_SEPARATE algorithm env_algorithm(std::string& problem) {
  const char* text = std::getenv("HERD_ALLREDUCE_ALGORITHM");
  if (text == nullptr || *text == '\0') return algorithm::automatic;
  for (algorithm a : {algorithm::automatic, algorithm::ring, algorithm::shared_memory, algorithm::hierarchical}) {
    if (std::string(text) == name(a)) return a;
  }
  if (problem.empty()) {
    problem = std::string("environment variable HERD_ALLREDUCE_ALGORITHM='") + text +
              "' is not one of auto, ring, shm, hierarchical";
  }
  return algorithm::automatic;
}

HERD_SEPARATE settings read_settings() {
  settings s;
  auto bytes = [&](const char* variable, std::size_t fallback) {
    return static_cast<std::size_t>(env_number(variable, static_cast<double>(fallback), s.problem, env_kind::whole));
  };
  s.stall_check_seconds = env_number("HERD_STALL_CHECK_TIME_SECONDS", s.stall_check_seconds, s.problem);
  s.stall_shutdown_seconds = env_number("HERD_STALL_SHUTDOWN_TIME_SECONDS", s.stall_shutdown_seconds, s.problem);
  s.ring_segment_bytes = bytes("HERD_RING_SEGMENT_BYTES", s.ring_segment_bytes);
  s.check_arguments = env_number("HERD_CHECK_ARGUMENTS", 1, s.problem, env_kind::flag) != 0;
  s.progress_thread = env_number("HERD_PROGRESS_THREAD", 1, s.problem, env_kind::flag) != 0;
  s.fusion_threshold_bytes = bytes("HERD_FUSION_THRESHOLD", s.fusion_threshold_bytes);
  s.bucket_bytes = bytes("HERD_BUCKET_BYTES", s.bucket_bytes);
  if (s.bucket_bytes == 0) {
    if (s.problem.empty()) {
      s.problem = "environment variable HERD_BUCKET_BYTES=0 leaves no room in a bucket; unset it for the default "
                  "(26214400), or give the bytes of a bucket, at least 1";
    }
    s.bucket_bytes = settings{}.bucket_bytes;
  }
  s.allreduce_algorithm = env_algorithm(s.problem);
  s.shm_slice_bytes = bytes("HERD_SHM_SLICE_BYTES", s.shm_slice_bytes);
  if (s.shm_slice_bytes < 4096 || s.shm_slice_bytes > (std::size_t{1} << 30)) {
    if (s.problem.empty()) {
      s.problem = "environment variable HERD_SHM_SLICE_BYTES=" + std::to_string(s.shm_slice_bytes) +
                  " is out of range; give a number of bytes between 4096 and 1073741824";
    }
    s.shm_slice_bytes = settings{}.shm_slice_bytes;
  }
  s.reproducible = env_number("HERD_REPRODUCIBLE", 0, s.problem, env_kind::flag) != 0;
  const double node_size = env_number("HERD_SIMULATE_NODE_SIZE", 0, s.problem, env_kind::whole);
  if (node_size > 65536 && s.problem.empty()) {
    s.problem = "environment variable HERD_SIMULATE_NODE_SIZE is above 65536; give a number of ranks between 0 (the "
                "real nodes) and 65536";
  }
  s.simulated_node_size = node_size > 65536 ? 0 : static_cast<int>(node_size);
  return s;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::runtime

#endif  // HERD_RUNTIME_ENV_HPP
