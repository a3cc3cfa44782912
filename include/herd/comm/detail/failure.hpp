#ifndef HERD_COMM_DETAIL_FAILURE_HPP
#define HERD_COMM_DETAIL_FAILURE_HPP
// What keeps a failure from turning into a wrong result later, common to every communicator:
// - tags: a user's message may not take a tag of herd's own range, where it would be taken for a
//   collective's data (or take a collective's data as its own);
// - options: every number a communicator runs with is checked when it is created, whether it came
//   from code (comm_options) or from the environment (HERD_*), so that a bad one is an error on every
//   rank then rather than a crash (a segment of 0 bytes divides by zero) in some later collective;
// - renewal: after an abort, the ranks' outcomes of the failed operation may differ (one rank gave
//   up while another had already received all it needed and went on). renew() therefore compares
//   each rank's last completed operation of the old communicator and raises on every rank if they
//   differ: ranks that retried "the same step" from there would be in different steps, and the new
//   communicator's agreement, whose sequence numbers start again, could not tell.

#include <herd/comm/detail/agreement.hpp>
#include <herd/comm/detail/operation_state.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace herd {

// renew(options, herd::rolled_back): the caller has brought every rank back to one state (a
// checkpoint, or copies every rank took after the same step), so the ranks' last operations on the
// old communicator may differ.
struct rolled_back_t {
  explicit constexpr rolled_back_t() = default;
};
inline constexpr rolled_back_t rolled_back{};

namespace detail {

// Point-to-point calls of the user take tags in [0, reserved_tag_base); herd's operations send on
// tags at and above it (control, notices, data of operation k).
HERD_SEPARATE void check_tag(const char* operation, int rank, int size, int tag);

// What is wrong with `o`, in words naming the option and its variable; empty when nothing is.
HERD_SEPARATE std::string options_problem(const comm_options& o);

// What a rank brings to a communicator's creation (the payload of operation #0): when it renews
// one, that one's last completed operation; then, if it has one, its malformed setting in words.
struct creation_report {
  std::uint64_t last_seq = 0;
  std::uint64_t last_count = 0;
  op_kind last_kind = op_kind::create;
  dtype last_type = dtype::u8;
  std::uint8_t last_typed = 0;
  std::uint8_t renewing = 0;
  std::uint32_t unused = 0;
  char problem[payload_max_bytes - 24] = {};

  static constexpr std::size_t header_bytes = 24;

  creation_report(const std::string& text, const op_label* renewed);
  creation_report(const std::byte* payload, std::size_t bytes);
  std::size_t bytes() const noexcept { return header_bytes + std::strlen(problem); }
  op_label last() const { return {last_kind, last_seq, last_count, last_type, last_typed != 0}; }
  std::string last_text() const {
    return last_kind == op_kind::create ? "its creation (#0)" : last().str();
  }
};
static_assert(offsetof(creation_report, problem) == creation_report::header_bytes);

// Raises on every rank if ranks renewing a communicator last completed different operations of it.
HERD_SEPARATE void verify_renewal(const error_site& site, const std::vector<creation_report>& reports);

// What a rank has heard of a peer's failures, for hopeless_wait.
struct peer_news {
  std::uint64_t departed_at;  // it left after issuing this many operations (never: it has not)
  std::uint64_t aborted_at;   // the operation it aborted (never: none)
  const std::string& reason;  // the abort's
};

// Why rank `me`, waiting in operation #seq, waits in vain: a peer left before issuing it, or
// aborted it or an earlier one; empty when there is hope. A departure is named before an abort,
// which may only be another rank's report of it; a peer that aborted and then left (its program
// raised, and ended) is named with its abort's reason too. `news(q)` is what is known of rank q, `shown(q)`
// the number the error gives it, `in` the operation waited in and `aborted_what(at)` the words
// for a peer's aborted operation #at. Every communicator's waits ask this, in the same words.
template <class News, class Shown, class AbortedWhat>
std::string hopeless_wait(int size, int me, std::uint64_t seq, News news, Shown shown, const std::string& in,
                          AbortedWhat aborted_what) {
  for (int q = 0; q < size; ++q) {
    const peer_news peer = news(q);
    if (q != me && peer.departed_at <= seq) {
      std::string why = "rank " + std::to_string(shown(q)) + " finished (it left the communicator after operation #" +
                        std::to_string(peer.departed_at - 1) + ") while rank " + std::to_string(shown(me)) + " waits in " + in;
      if (peer.aborted_at <= seq) why += "; before it left, it aborted " + aborted_what(peer.aborted_at) + " (" + peer.reason + ")";
      return why;
    }
  }
  for (int q = 0; q < size; ++q) {
    const peer_news peer = news(q);
    if (q != me && peer.aborted_at <= seq) {
      return "rank " + std::to_string(shown(q)) + " aborted " + aborted_what(peer.aborted_at) + " (" + peer.reason +
             ") while rank " + std::to_string(shown(me)) + " waits in " + in;
    }
  }
  return {};
}

// shrink(), common to every communicator. It has two steps, each under the watchdog:
// 1. Presence: each rank that stays says so ("present" in shrink number `round`) and waits until
//    it has heard of every rank that it stays or that it left (staying_answer).
// 2. Members: each then proposes the ranks it counted, and goes on (to create the communicator of
//    those ranks, which needs them all) only once every one of them proposed the same
//    (members_verdict). Ranks whose news differed (one left just after saying it stays, and only
//    some heard of it in time) give up then, within the shutdown time, instead of creating
//    communicators of different ranks or waiting for one that will never come.
// A rank leaves the communicator it shrinks only after the new one was created (which needs every
// member past step 2) or after its shrink gave up: a departure heard during steps 1 and 2 always
// means that rank is gone, even after it said it stays.

// What this rank knows of peer q in shrink `round`: 1 it stays, 0 it left, -1 not yet known.
inline int staying_answer(std::uint64_t present_in, bool departed, std::uint64_t round) noexcept {
  if (departed) return 0;
  return present_in >= round ? 1 : -1;
}

// A list of ranks, as a shrink's proposal travels: how many, and a hash of which.
struct members_digest {
  std::uint64_t count = 0;
  std::uint64_t hash = 14695981039346656037ull;
  static members_digest of(const std::vector<int>& members) noexcept {
    members_digest d;
    d.count = members.size();
    for (int q : members) {
      d.hash ^= static_cast<std::uint64_t>(static_cast<std::uint32_t>(q));
      d.hash *= 1099511628211ull;
    }
    return d;
  }
  bool operator==(const members_digest&) const = default;
};

// What this rank knows of member q in step 2.
struct member_news {
  bool departed = false;
  bool proposed = false;  // its proposal for this round came
  members_digest proposal;
};

// Step 2's state, for this rank: `waiting_for` the first member whose proposal has not come
// (-1: none), or `problem`, why the members cannot agree. `news(q)` tells whether member q left,
// and its proposal for this round if it made one.
struct members_state {
  int waiting_for = -1;
  std::string problem;
};
template <class News>
members_state members_verdict(const std::vector<int>& members, int me, const members_digest& mine, News news) {
  members_state state;
  for (int q : members) {
    if (q == me) continue;
    const member_news heard = news(q);
    const members_digest& theirs = heard.proposal;
    if (heard.departed) {
      state.problem = "rank " + std::to_string(q) + " left while the ranks that stay agreed on who they are (it had "
                      "said it stays, and only some ranks heard that it left)";
      return state;
    }
    if (!heard.proposed) {
      if (state.waiting_for < 0) state.waiting_for = q;
      continue;
    }
    if (!(theirs == mine)) {
      state.problem = "rank " + std::to_string(q) + " counted " + std::to_string(theirs.count) +
                      " ranks that stay where rank " + std::to_string(me) + " counted " + std::to_string(mine.count) +
                      " (a rank left while they counted)";
      return state;
    }
  }
  return state;
}

// The ranks that stay, in their order: those whose answer is 1.
HERD_SEPARATE std::vector<int> staying_members(const std::vector<int>& answers);

inline const char* shrink_advice() noexcept {
  return "The ranks that stay could not agree on who they are within the shutdown time. Call shrink() again on "
         "the ranks still here, or end the job";
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE creation_report::creation_report(const std::string& text, const op_label* renewed) {
  if (renewed != nullptr) {
    renewing = 1;
    last_seq = renewed->seq;
    last_count = renewed->count;
    last_kind = renewed->kind;
    last_type = renewed->type;
    last_typed = renewed->typed ? 1 : 0;
  }
  std::memcpy(problem, text.data(), std::min(text.size(), sizeof problem - 1));
}

HERD_SEPARATE creation_report::creation_report(const std::byte* payload, std::size_t bytes) {
  std::memcpy(static_cast<void*>(this), payload, std::min(bytes, sizeof *this));
  if (bytes < sizeof *this) std::memset(reinterpret_cast<char*>(this) + bytes, 0, sizeof *this - bytes);
  problem[sizeof problem - 1] = '\0';
}

HERD_SEPARATE void check_tag(const char* operation, int rank, int size, int tag) {
  if (tag < 0) {
    raise({operation, rank, size}, "tag " + std::to_string(tag) + " is negative (MPI_ANY_TAG is not supported)",
          "Use a tag in [0, herd::reserved_tag_base) = [0, " + std::to_string(reserved_tag_base) + ")");
  }
  if (tag >= reserved_tag_base && !operation_state::any_running()) {
    raise({operation, rank, size},
          "tag " + std::to_string(tag) + " is in herd's reserved range [" + std::to_string(reserved_tag_base) +
              ", 32767], where collectives send their own messages (a message on it could be taken as a "
              "collective's data)",
          "Use a tag in [0, herd::reserved_tag_base) = [0, " + std::to_string(reserved_tag_base) + ")");
  }
}

HERD_SEPARATE std::string options_problem(const comm_options& o) {
  auto number = [](double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", x);
    return std::string(text);
  };
  auto seconds_bad = [](double x) { return !(x >= 0 && x <= 1e15); };  // NaN too
  if (seconds_bad(o.stall_check_seconds)) {
    return "comm_options::stall_check_seconds (HERD_STALL_CHECK_TIME_SECONDS) is " + number(o.stall_check_seconds) +
           "; give seconds between 0 (never warn) and 1e15";
  }
  // Below a tenth of a second every wait would give up before a peer could answer (the watchdog
  // looks every few milliseconds, and an abort's notices take about as long).
  if (seconds_bad(o.stall_shutdown_seconds) || (o.stall_shutdown_seconds > 0 && o.stall_shutdown_seconds < 0.1)) {
    return "comm_options::stall_shutdown_seconds (HERD_STALL_SHUTDOWN_TIME_SECONDS) is " +
           number(o.stall_shutdown_seconds) + "; give 0 (never give up) or seconds between 0.1 and 1e15";
  }
  if (o.ring_segment_bytes == 0) {
    return "comm_options::ring_segment_bytes (HERD_RING_SEGMENT_BYTES) is 0; give the ring's segment in bytes, at "
           "least 1 (the default is 1048576)";
  }
  if (o.shm_slice_bytes < 4096 || o.shm_slice_bytes > (std::size_t{1} << 30)) {
    return "comm_options::shm_slice_bytes (HERD_SHM_SLICE_BYTES) is " + std::to_string(o.shm_slice_bytes) +
           "; give bytes between 4096 and 1073741824";
  }
  if (o.simulated_node_size < 0 || o.simulated_node_size > 65536) {
    return "comm_options::simulated_node_size (HERD_SIMULATE_NODE_SIZE) is " + std::to_string(o.simulated_node_size) +
           "; give a number of ranks between 0 (the real nodes) and 65536";
  }
  switch (o.allreduce_algorithm) {
    case algorithm::automatic:
    case algorithm::ring:
    case algorithm::shared_memory:
    case algorithm::hierarchical: break;
    default:
      return "comm_options::allreduce_algorithm (HERD_ALLREDUCE_ALGORITHM) is " +
             std::to_string(static_cast<int>(o.allreduce_algorithm)) +
             ", not one of herd::algorithm's values; use automatic, ring, shared_memory or hierarchical";
  }
  return {};
}

HERD_SEPARATE void verify_renewal(const error_site& site, const std::vector<creation_report>& reports) {
  if (reports.empty() || !reports[0].renewing) return;
  bool differ = false;
  for (const creation_report& r : reports) differ = differ || r.last_seq != reports[0].last_seq;
  if (!differ) return;
  std::string text;
  for (std::size_t i = 0; i < reports.size() && i < 16; ++i) {
    text += (i == 0 ? "" : ", ") + std::string("rank ") + std::to_string(i) + ": " + reports[i].last_text();
  }
  if (reports.size() > 16) text += ", ...";
  raise_agreed(site,
               "the ranks last completed different operations of the communicator they renew (" + text +
                   "): the operation that failed succeeded on some ranks, so ranks that go on from where they stand "
                   "would be in different steps and mix their data",
               "Bring every rank back to one state first (load a checkpoint, or copies every rank took after the "
               "same step), then renew with comm.renew(options, herd::rolled_back)");
}

HERD_SEPARATE std::vector<int> staying_members(const std::vector<int>& answers) {
  std::vector<int> members;
  for (std::size_t q = 0; q < answers.size(); ++q)
    if (answers[q] == 1) members.push_back(static_cast<int>(q));
  return members;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail
}  // namespace herd

#endif  // HERD_COMM_DETAIL_FAILURE_HPP
