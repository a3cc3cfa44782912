#ifndef HERD_COMM_DETAIL_MPI_FAILURE_HPP
#define HERD_COMM_DETAIL_MPI_FAILURE_HPP
// The failure protocol of herd::mpi_communicator (comm/mpi.hpp), and the state it works on.
//
// Notices. The ranks of a communicator tell each other about failures with small notices
// (mpi_notice, sent eagerly) on a tag of their own (notice_tag). Each communicator keeps one
// receive for them standing (mpi_state::listen); every wait inside an operation polls it and
// raises when mpi_state::hopeless says the wait is in vain. There are four kinds:
// - abort #k: the sender's operation #k failed after its agreement (detail::run_now calls
//   mpi_communicator::abort), sent to every peer. A peer waiting in operation k or later raises.
// - done #k: the sender has settled everything it had in flight in the aborted operation k.
// - closed n: the sender leaves the communicator (destroyed it, left() it, or MPI_Finalize ran)
//   after issuing n operations. A peer waiting in operation n or later raises.
// - present r: the sender is in its r-th shrink() of the communicator and stays.
// - members r: the ranks the sender counted as staying in its r-th shrink() (their number and a
//   hash of which: comm/detail/failure.hpp's members_digest).
// One tag, one receive: MPI keeps the order of one sender's notices, so a "present" arrives before
// the same sender's "closed".
//
// After an abort (announce_abort, settle_abort) the aborting rank cancels its own receives, drains
// the messages its peers sent it in that operation (and in any later one a peer reports it aborted
// in) so that their sends complete, waits until its own sends are complete, says "done", and waits
// for the "done" of every peer that told of its own abort. Only then does the error reach the
// caller: MPI never touches a buffer the caller may free after catching it (MPI cannot cancel a
// send once posted: the receiver must take it). Peers that said nothing (stalled, or not yet aware)
// are not waited for: the communicator goes on the unsettled list below.
//
// The bound: all this takes at most comm_options::stall_shutdown_seconds (none when 0; then a
// warning after a minute). A send of this rank still pending past it ends the job (MPI_Abort on
// MPI_COMM_WORLD: end_job, with
// a message naming the peer and the operation), as torch's NCCL watchdog does; with
// comm_options::end_job_if_unsettled off its request is left to MPI, and the error says that its
// buffer still belongs to MPI. Only peers' "done" still missing past the bound: the abort returns.
//
// A departing rank is told apart from an aborting one by its notice: "closed" carries the number
// of operations it issued, and hopeless() names a departure before any abort (which may only be
// another rank's report of that departure). shrink() counts a rank as staying when its "present"
// for that round came, as gone when its "closed" came (even after a "present": see failure.hpp),
// and creates the new communicator only once every member proposed the same members.
//
// The registries (mpi_registry), one per process:
// - live: the communicators alive. MPI_Finalize (at_finalize) tells their peers this rank leaves,
//   and drains them for up to ten seconds while the peers' departures arrive.
// - retired: destroyed communicators. Each takes in and throws away whatever still comes, notices
//   included, so that no peer's message is left unmatched, and goes once every peer has said it
//   left (after which nothing more can come), or at MPI_Finalize after those ten seconds.
// - unsettled: aborted communicators some of whose peers had not said "done" when the abort
//   returned. Every wait of this process drains them (tend), so that those peers' sends complete;
//   an entry goes once every peer has said "done" or left, or when its communicator is destroyed.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/failure.hpp>
#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/comm/detail/mpi_header.hpp>
#include <herd/comm/detail/operation_state.hpp>
#include <herd/comm/detail/shm.hpp>
#include <herd/comm/detail/watchdog.hpp>
#include <herd/core/config.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace herd::detail {

// Whether MPI can be called: initialized and not yet finalized (herd::mpi::is_initialized).
HERD_SEPARATE bool mpi_running();

class mpi_state;

// The communicators of this process (see the top of this file). MPI_Finalize reaches at_finalize
// through an attribute on MPI_COMM_SELF, whose delete callback MPI runs first thing.
struct mpi_registry {
  std::recursive_mutex mutex;  // a state destroyed under it takes itself off the lists
  std::vector<mpi_state*> live;
  std::vector<std::unique_ptr<mpi_state>> retired;
  // Aborted communicators some of whose peers had not settled their messages when this rank went
  // on: every wait of this process keeps draining them, so that those peers' sends complete.
  std::vector<mpi_state*> unsettled;
  std::atomic<bool> anything_to_tend{false};
  bool hooked = false;
  std::thread tender;           // the thread that tends while no wait of this process runs (start_tender)
  bool tender_running = false;  // it runs (it ends once nothing is left to tend)
  bool finalizing = false;      // MPI_Finalize began: that thread calls MPI no more, and ends
};
HERD_SEPARATE mpi_registry& registry();

// A committed datatype of `bytes` bytes made of pieces of `limit` bytes and a remainder, for a
// message whose byte count does not fit an int (MPI before version 4 counts in int).
HERD_SEPARATE int make_byte_type(std::size_t bytes, std::size_t limit, MPI_Datatype* type);

// A notice between the ranks of one communicator. Small enough to travel eagerly.
struct mpi_notice {
  enum type_t : std::uint8_t { abort = 1, done = 2, closed = 3, present = 4, members = 5 };
  std::uint32_t magic = 0x4e544345;  // "NTCE"
  std::uint8_t type = 0;
  std::uint8_t unused[3] = {};
  std::uint64_t seq = 0;  // abort: the failed operation; closed: the operations issued; present, members: the shrink
  char reason[1008] = {};
};

// What this rank has heard from a peer.
struct mpi_peer {
  std::uint64_t aborted_at = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t departed_at = std::numeric_limits<std::uint64_t>::max();
  bool done = false;  // settled everything it had in flight after an abort
  std::uint64_t present_in = 0;  // the last shrink it said it is in
  std::uint64_t proposed_in = 0;  // the last shrink it proposed members in, and what it proposed
  members_digest proposal;
  std::string reason;
};

// A request of an operation dropped while still pending (the operation is failing): the abort
// settles it.
struct mpi_orphan {
  MPI_Request handle = MPI_REQUEST_NULL;
  bool receiving = false;
  int peer = -1;
};

// Everything an mpi_communicator owns, at an address that moves of the communicator keep.
class mpi_state {
 public:
  static constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

  explicit mpi_state(const comm_options& options);
  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;

  ~mpi_state();

  // Gives back what MPI holds for this communicator.
  void release() noexcept;

  void listen();

  // --- What the peers said. Written under notice_mutex (the progress thread and the caller's
  // may both poll), read under it too.

  // Takes in the notices that arrived (unless another thread is doing so right now).
  void poll_notices();

  // Whether every peer has settled the messages of an abort (or left).
  bool all_settled();

  // Whether every peer that told of its own abort has also settled it (or left).
  bool answering_settled();

  // Whether every peer has said it left: then no message can come any more.
  bool all_departed();

  // Shrink number `round`: for each rank, what this rank knows of it (staying_answer).
  std::vector<int> staying(std::uint64_t round);
  // What this rank knows of rank q's proposal in shrink `round`.
  member_news proposal_of(int q, std::uint64_t round);

  // Why this rank, in operation `label`, waits in vain (empty when there is hope).
  // A departure is named before an abort, which may only be another rank's report of it.
  std::string hopeless(const op_label& label);

  // The hierarchical allreduce's communicator across nodes runs inside an operation of the
  // communicator that made it (`outer`): its waits listen to that one's notices too (a rank that
  // fails in the node phase tells only the outer one's peers), and its messages name ranks as the
  // user knows them (outer_ranks[q]: the outer rank of rank q here).
  mpi_state* outer = nullptr;
  std::vector<int> outer_ranks;
  int shown(int q) const { return outer != nullptr ? outer_ranks[static_cast<std::size_t>(q)] : q; }

  // --- Notices to the peers.

  // `to_departed` false: not to the peers known to have left (they may have finalized MPI).
  void notify_all(std::uint8_t type, std::uint64_t seq, std::string_view reason = {}, bool to_departed = true) noexcept;

  // Forgets the notices that were delivered; true while some are still in flight.
  bool reap_outgoing() noexcept;

  // --- Draining: taking, and throwing away, what peers sent, so that their sends complete.

  // After an abort: the agreements (control tag) and the data of the aborted operation, and of
  // any later one a peer reports it aborted in (it may have sent for that one already).
  void drain_aborted() noexcept;

  // A retired communicator: everything, notices included (taken in as notices).
  void drain_everything() noexcept;

  void drain_tag(int tag) noexcept;

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  bool cuda_aware = false;
  bool departed = false;
  bool finalized = false;  // MPI_Finalize ran (at_finalize): MPI may be called no more
  std::uint64_t aborted_seq = 0;  // the operation an abort settles
  std::uint64_t shrinks = 0;      // shrink() calls on this communicator
  operation_state ops;
  // The ranks of this node and their shared memory (comm/detail/shm.hpp), when the node holds more
  // than this rank and the memory could be mapped; whether that node is the whole communicator.
  std::unique_ptr<shm_node> node;
  bool node_is_everyone = false;
  std::vector<mpi_orphan> orphans;

 private:
  void record(const mpi_notice& notice, int from);

  // Receives a probed message whole (a receive into a smaller buffer is an error MPI may treat as
  // fatal); false if no buffer that large could be had, leaving it.
  bool take(MPI_Message& message, const MPI_Status& status) noexcept;

  std::vector<mpi_peer> peers;
  mpi_notice incoming;
  MPI_Request incoming_request = MPI_REQUEST_NULL;
  std::deque<std::pair<std::unique_ptr<mpi_notice>, MPI_Request>> outgoing;
  // The tending thread (start_tender) reaps the notices of an aborted communicator while its owner
  // may send more (a shrink's notices).
  std::mutex outgoing_mutex;
  std::vector<char> sink;  // where drained messages land
  std::mutex notice_mutex;
};

// Tells every peer that this rank leaves the communicator after the operations it issued.
HERD_SEPARATE void depart(mpi_state& s) noexcept;

// Frees the retired communicators that every peer has left; `all` frees the others too.
HERD_SEPARATE void tend_retired(mpi_registry& r, bool all) noexcept;

// Called now and then by every wait of this process: drains the aborted communicators whose
// peers have not all settled, and the retired ones (see mpi_registry), so that peers' sends to
// this rank complete even while it is busy with something else.
// The aborted communicators' part of tend (r.mutex held).
HERD_SEPARATE void tend_unsettled(mpi_registry& r) noexcept;

HERD_SEPARATE void tend() noexcept;

// Drains the aborted communicators (tend_unsettled) from a thread of its own, every millisecond
// while some are unsettled. The waits of this process tend too, but a rank whose error reached its
// caller may stay away from herd for a while (a step that raised, then work of the user's, or a
// sleep): a peer that sent it a message MPI completes only once it is taken (rendezvous) would then
// wait in its own abort, which must see its sends complete, until this rank called herd again or
// the shutdown time ran out, instead of raising at once (ctest mpi_fault_matrix_np4, "busy after
// its error" with big messages). Needs MPI_THREAD_MULTIPLE; without it only the waits tend. The
// destroyed (retired) communicators are left to the waits and to MPI_Finalize: freeing them
// (MPI_Comm_free) from this thread made MPICH 4.0.2's MPI_Finalize fail now and then
// ("pthread_mutex_destroy: Device or resource busy", 7 runs of 45 of a fault-matrix row; none of
// 20 without). The thread ends once none is unsettled, and before MPI_Finalize:
// stop_threads_before_finalize sets finalizing under the registry's lock, which the thread holds
// while it calls MPI, and joins it. Called under r.mutex.
HERD_SEPARATE void start_tender(mpi_registry& r) noexcept;

// Brings herd's own threads out of MPI for good, before MPI_Finalize: the operations queued on the
// communicators alive run to their end, and the tending thread ends. MPI forbids calls of other
// threads while MPI_Finalize runs, and MPICH stops locking as MPI_Finalize begins, before it runs
// at_finalize: a call of the tending thread that was inside MPI at that moment keeps MPICH's lock
// for good, and MPI_Finalize then fails ("pthread_mutex_destroy: Device or resource busy"). So this
// runs first (herd::mpi::finalize, herd::mpi::environment), not from at_finalize alone.
HERD_SEPARATE void stop_threads_before_finalize() noexcept;

HERD_SEPARATE void add_unsettled(mpi_state* s) noexcept;

HERD_SEPARATE int at_finalize(MPI_Comm, int, void*, void*);

HERD_SEPARATE void register_state(mpi_state* s);

// A communicator's state after its owner is gone: it tells the peers and stays retired until
// they have all left too.
HERD_SEPARATE void retire(std::unique_ptr<mpi_state> s) noexcept;

// Ends the whole job. MPI_Abort on MPI_COMM_WORLD, not on the communicator that failed: MPICH
// 4.0 (ch4) took the abort of a duplicate, or of a communicator of some ranks, as one of its
// processes only, leaving a peer that sleeps outside MPI, or that is in MPI_Finalize, running
// until it woke (ctest mpi_abort_job_*, measured from outside the job). The job is lost anyway:
// MPI may still read memory this process would free.
[[noreturn]] HERD_SEPARATE void end_job() noexcept;

HERD_SEPARATE void give_up_settling_or_throw(mpi_state& s, std::string_view reason);

// Past the shutdown time, a send of the aborted operation is still pending: its peer has not
// taken it, and MPI cannot cancel it, so MPI may read its buffer for as long as that lasts. As
// torch's NCCL watchdog does, herd then ends the job, naming the peer and the operation; with
// comm_options::end_job_if_unsettled off it returns instead, leaving the sends to MPI, and the
// error says that their buffers still belong to MPI.
HERD_SEPARATE void give_up_settling(mpi_state& s, std::string_view reason) noexcept;

// Begins the abort of the running operation (outside any: of the one aborted before, or else of
// the next one this rank would issue, which its peers may be waiting in): marks the communicator
// aborted, cancels this rank's receives of the operation and tells every peer. Returns the
// operation's number.
HERD_SEPARATE std::uint64_t announce_abort(mpi_state& s, std::string_view reason) noexcept;

// Settles abort #seq: returns once this rank's sends are complete and every peer that answered
// has said "done", within the bound (see the top of this file). Not the watched wait
// (watchdog.hpp): it never raises (it runs while an abort unwinds), its end is two conditions with
// a give-up of their own past the bound, and its warning says what settling needs.
HERD_SEPARATE void settle_abort(mpi_state& s, std::uint64_t seq, std::string_view reason) noexcept;

// The watched wait (watchdog.hpp) of every blocking step of an mpi_communicator: each tick first
// tends this process's aborted and retired communicators (tend), whose peers may still send to
// them, then runs on_tick (which raises when the wait is in vain).
template <class Done, class OnTick, class What>
void watched_mpi_wait(const comm_options& options, const error_site& site, Done done, OnTick on_tick, What what) {
  watched_wait(
      options, site, done,
      [&] {
        tend();
        on_tick();
      },
      what);
}

// A blocking MPI call that returns only once other ranks make it too (the creation of a
// communicator over some of them: MPI_Comm_create_group, MPI_Comm_split), watched: it runs on a
// thread of its own while this one waits under the watchdog; past the shutdown time this rank
// raises, and the call is left on that thread (it holds only what it shares with it). Ranks call
// it after an agreement that they all will, so only a rank that died or stalled since can make it
// wait. Without MPI_THREAD_MULTIPLE it runs here, unwatched. Returns the call's MPI code.
template <class Call>
int watched_mpi_call(const comm_options& options, const error_site& site, const std::string& what, MPI_Comm* result,
                     Call call) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) return call(result);
  struct shared {
    std::atomic<bool> done{false};
    int code = MPI_SUCCESS;
    MPI_Comm comm = MPI_COMM_NULL;
  };
  auto state = std::make_shared<shared>();
  std::thread([state, call] {
    state->code = call(&state->comm);
    state->done.store(true, std::memory_order_release);
  }).detach();
  watched_mpi_wait(options, site, [&] { return state->done.load(std::memory_order_acquire); }, [] {}, [&] { return what; });
  *result = state->comm;
  return state->code;
}

// shrink() number ++s.shrinks, its two steps (comm/detail/failure.hpp): says this rank stays and
// waits until it heard of every peer that it stays or left; then proposes the ranks it counted and
// waits until every one of them proposed the same. Returns them, in their order; raises (under the
// watchdog of `options`, or at once when they cannot agree) otherwise.
HERD_SEPARATE std::vector<int> agree_staying(mpi_state& s, const comm_options& options);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE mpi_state::mpi_state(const comm_options& options) : ops(options) {}

HERD_SEPARATE bool mpi_running() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

HERD_SEPARATE mpi_registry& registry() {
  static mpi_registry& r = *new mpi_registry;  // never destroyed: MPI_Finalize may come after static destructors
  return r;
}

HERD_SEPARATE int make_byte_type(std::size_t bytes, std::size_t limit, MPI_Datatype* type) {
  MPI_Datatype block = MPI_DATATYPE_NULL;
  int code = MPI_Type_contiguous(static_cast<int>(limit), MPI_BYTE, &block);
  if (code != MPI_SUCCESS) return code;
  int lengths[2] = {static_cast<int>(bytes / limit), static_cast<int>(bytes % limit)};
  MPI_Aint offsets[2] = {0, static_cast<MPI_Aint>(bytes / limit * limit)};
  MPI_Datatype types[2] = {block, MPI_BYTE};
  code = MPI_Type_create_struct(lengths[1] != 0 ? 2 : 1, lengths, offsets, types, type);
  MPI_Type_free(&block);  // the struct keeps what it needs
  return code == MPI_SUCCESS ? MPI_Type_commit(type) : code;
}

HERD_SEPARATE mpi_state::~mpi_state() {
  {
    auto& r = registry();
    std::lock_guard lock(r.mutex);
    r.live.erase(std::remove(r.live.begin(), r.live.end(), this), r.live.end());
    r.unsettled.erase(std::remove(r.unsettled.begin(), r.unsettled.end(), this), r.unsettled.end());
  }
  release();
}

HERD_SEPARATE void mpi_state::release() noexcept {
  if (!mpi_running()) return;
  if (incoming_request != MPI_REQUEST_NULL) {
    MPI_Cancel(&incoming_request);
    MPI_Wait(&incoming_request, MPI_STATUS_IGNORE);
  }
  // Notices are small and sent eagerly, so they complete at once; one that does not within a
  // second keeps its buffer (leaked on purpose) rather than free memory MPI may still read.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (reap_outgoing() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  for (auto& [buffer, request] : outgoing) {
    MPI_Request_free(&request);
    (void)buffer.release();
  }
  outgoing.clear();
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

HERD_SEPARATE void mpi_state::listen() {
  peers.assign(static_cast<std::size_t>(size), mpi_peer{});
  MPI_Irecv(&incoming, sizeof incoming, MPI_BYTE, MPI_ANY_SOURCE, notice_tag, comm, &incoming_request);
}

HERD_SEPARATE void mpi_state::poll_notices() {
  std::unique_lock lock(notice_mutex, std::try_to_lock);
  if (!lock || incoming_request == MPI_REQUEST_NULL) return;
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&incoming_request, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    record(incoming, status.MPI_SOURCE);
    MPI_Irecv(&incoming, sizeof incoming, MPI_BYTE, MPI_ANY_SOURCE, notice_tag, comm, &incoming_request);
  }
}

HERD_SEPARATE bool mpi_state::all_settled() {
  std::lock_guard lock(notice_mutex);
  for (int q = 0; q < size; ++q) {
    const mpi_peer& peer = peers[static_cast<std::size_t>(q)];
    if (q != rank && !peer.done && peer.departed_at == never) return false;
  }
  return true;
}

HERD_SEPARATE bool mpi_state::answering_settled() {
  std::lock_guard lock(notice_mutex);
  for (int q = 0; q < size; ++q) {
    const mpi_peer& peer = peers[static_cast<std::size_t>(q)];
    if (q != rank && peer.aborted_at != never && !peer.done && peer.departed_at == never) return false;
  }
  return true;
}

HERD_SEPARATE bool mpi_state::all_departed() {
  std::lock_guard lock(notice_mutex);
  for (int q = 0; q < size; ++q)
    if (q != rank && peers[static_cast<std::size_t>(q)].departed_at == never) return false;
  return true;
}

HERD_SEPARATE std::vector<int> mpi_state::staying(std::uint64_t round) {
  std::lock_guard lock(notice_mutex);
  std::vector<int> result(static_cast<std::size_t>(size), -1);
  for (int q = 0; q < size; ++q) {
    const mpi_peer& peer = peers[static_cast<std::size_t>(q)];
    result[static_cast<std::size_t>(q)] = q == rank ? 1 : staying_answer(peer.present_in, peer.departed_at != never, round);
  }
  return result;
}

HERD_SEPARATE member_news mpi_state::proposal_of(int q, std::uint64_t round) {
  std::lock_guard lock(notice_mutex);
  const mpi_peer& peer = peers[static_cast<std::size_t>(q)];
  return {peer.departed_at != never, peer.proposed_in == round, peer.proposal};
}

HERD_SEPARATE std::string mpi_state::hopeless(const op_label& label) {
  std::lock_guard lock(notice_mutex);
  return hopeless_wait(
      size, rank, label.seq,
      [&](int q) {
        const mpi_peer& peer = peers[static_cast<std::size_t>(q)];
        return peer_news{peer.departed_at, peer.aborted_at, peer.reason};
      },
      [&](int q) { return shown(q); },
      outer != nullptr ? outer->ops.current().str() + " (its part across nodes)" : label.str(),
      [&](std::uint64_t at) {
        return outer != nullptr ? std::string("its part across nodes") : "its operation #" + std::to_string(at);
      });
}

HERD_SEPARATE void mpi_state::notify_all(std::uint8_t type, std::uint64_t seq, std::string_view reason, bool to_departed) noexcept {
  for (int q = 0; q < size; ++q) {
    if (q == rank) continue;
    if (!to_departed) {
      std::lock_guard lock(notice_mutex);
      if (peers[static_cast<std::size_t>(q)].departed_at != never) continue;
    }
    try {
      auto notice = std::make_unique<mpi_notice>();
      notice->type = type;
      notice->seq = seq;
      const std::size_t n = std::min(reason.size(), sizeof notice->reason - 1);
      if (n != 0) std::memcpy(notice->reason, reason.data(), n);
      std::lock_guard lock(outgoing_mutex);
      outgoing.emplace_back(std::move(notice), MPI_REQUEST_NULL);
      auto& [buffer, request] = outgoing.back();
      MPI_Isend(buffer.get(), sizeof(mpi_notice), MPI_BYTE, q, notice_tag, comm, &request);
    } catch (...) {
      // Out of memory: that peer will notice through its own watchdog instead.
    }
  }
}

HERD_SEPARATE bool mpi_state::reap_outgoing() noexcept {
  std::lock_guard lock(outgoing_mutex);
  while (!outgoing.empty()) {
    int done = 0;
    MPI_Test(&outgoing.front().second, &done, MPI_STATUS_IGNORE);
    if (!done) return true;
    outgoing.pop_front();
  }
  return false;
}

HERD_SEPARATE void mpi_state::drain_aborted() noexcept {
  drain_tag(control_tag);
  drain_tag(data_tag(aborted_seq));
  std::uint64_t seen[8];
  int count = 0;
  {
    std::lock_guard lock(notice_mutex);
    for (const mpi_peer& peer : peers) {
      if (peer.aborted_at != never && peer.aborted_at != aborted_seq && count < 8) seen[count++] = peer.aborted_at;
    }
  }
  for (int i = 0; i < count; ++i) drain_tag(data_tag(seen[i]));
}

HERD_SEPARATE void mpi_state::drain_everything() noexcept {
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &message, &status) != MPI_SUCCESS || !flag) return;
    if (status.MPI_TAG == notice_tag) {
      mpi_notice notice;
      MPI_Mrecv(&notice, sizeof notice, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      std::lock_guard lock(notice_mutex);
      record(notice, status.MPI_SOURCE);
    } else if (!take(message, status)) {
      return;
    }
  }
}

HERD_SEPARATE void mpi_state::drain_tag(int tag) noexcept {
  for (;;) {
    int flag = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, tag, comm, &flag, &message, &status) != MPI_SUCCESS || !flag) return;
    if (!take(message, status)) return;
  }
}

HERD_SEPARATE void mpi_state::record(const mpi_notice& notice, int from) {
  if (notice.magic != mpi_notice{}.magic || from < 0 || from >= size || from == rank) return;
  mpi_peer& peer = peers[static_cast<std::size_t>(from)];
  if (notice.type == mpi_notice::abort && notice.seq < peer.aborted_at) {
    peer.aborted_at = notice.seq;
    try {
      peer.reason.assign(notice.reason, strnlen(notice.reason, sizeof notice.reason));
    } catch (...) {
    }
  } else if (notice.type == mpi_notice::done) {
    peer.done = true;
  } else if (notice.type == mpi_notice::closed) {
    peer.departed_at = notice.seq;
  } else if (notice.type == mpi_notice::present && notice.seq > peer.present_in) {
    peer.present_in = notice.seq;
  } else if (notice.type == mpi_notice::members && notice.seq > peer.proposed_in) {
    peer.proposed_in = notice.seq;
    std::memcpy(&peer.proposal.count, notice.reason, sizeof(std::uint64_t));
    std::memcpy(&peer.proposal.hash, notice.reason + sizeof(std::uint64_t), sizeof(std::uint64_t));
  }
}

HERD_SEPARATE bool mpi_state::take(MPI_Message& message, const MPI_Status& status) noexcept {
  MPI_Count bytes = 0;
  MPI_Get_elements_x(&status, MPI_BYTE, &bytes);
  try {
    if (static_cast<std::size_t>(bytes) > sink.size()) sink.resize(static_cast<std::size_t>(bytes));
  } catch (...) {
    return false;
  }
  if (bytes <= INT_MAX) {
    MPI_Mrecv(sink.data(), static_cast<int>(bytes), MPI_BYTE, &message, MPI_STATUS_IGNORE);
  } else {
    MPI_Datatype whole = MPI_DATATYPE_NULL;
    make_byte_type(static_cast<std::size_t>(bytes), std::size_t{1} << 30, &whole);
    MPI_Mrecv(sink.data(), 1, whole, &message, MPI_STATUS_IGNORE);
    MPI_Type_free(&whole);
  }
  return true;
}

HERD_SEPARATE void depart(mpi_state& s) noexcept {
  if (s.departed || s.comm == MPI_COMM_NULL || !mpi_running()) return;
  s.departed = true;
  std::uint64_t issued = 0;
  try {
    issued = s.ops.issued();
  } catch (...) {
    return;
  }
  s.notify_all(mpi_notice::closed, issued);
}

HERD_SEPARATE void tend_retired(mpi_registry& r, bool all) noexcept {
  for (auto it = r.retired.begin(); it != r.retired.end();) {
    mpi_state& s = **it;
    s.poll_notices();
    s.drain_everything();
    s.reap_outgoing();
    if (all || s.all_departed()) {
      it = r.retired.erase(it);
    } else {
      ++it;
    }
  }
}

HERD_SEPARATE void tend_unsettled(mpi_registry& r) noexcept {
  for (auto it = r.unsettled.begin(); it != r.unsettled.end();) {
    mpi_state& s = **it;
    s.poll_notices();
    s.drain_aborted();
    s.reap_outgoing();
    it = s.all_settled() ? r.unsettled.erase(it) : it + 1;
  }
}

HERD_SEPARATE void tend() noexcept {
  auto& r = registry();
  if (!r.anything_to_tend.load(std::memory_order_acquire)) return;
  std::unique_lock lock(r.mutex, std::try_to_lock);
  if (!lock) return;
  tend_unsettled(r);
  tend_retired(r, false);
  r.anything_to_tend.store(!r.unsettled.empty() || !r.retired.empty(), std::memory_order_release);
}

HERD_SEPARATE void start_tender(mpi_registry& r) noexcept {
  if (r.tender_running || r.finalizing) return;
  if (r.tender.joinable()) r.tender.join();  // the last one, which found nothing left to tend and ended
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) return;
  try {
    r.tender = std::thread([&r] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::unique_lock lock(r.mutex, std::try_to_lock);
        if (!lock) continue;
        if (!r.finalizing) tend_unsettled(r);
        if (r.finalizing || r.unsettled.empty()) {
          r.tender_running = false;
          return;
        }
      }
    });
    r.tender_running = true;
  } catch (...) {
    // No thread to be had: the waits tend, as without MPI_THREAD_MULTIPLE.
  }
}

HERD_SEPARATE void add_unsettled(mpi_state* s) noexcept {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  try {
    r.unsettled.push_back(s);
  } catch (...) {
    return;
  }
  r.anything_to_tend.store(true, std::memory_order_release);
  start_tender(r);
}

HERD_SEPARATE void stop_threads_before_finalize() noexcept {
  auto& r = registry();
  std::vector<mpi_state*> live;
  {
    std::lock_guard lock(r.mutex);
    try {
      live = r.live;
    } catch (...) {
    }
  }
  // Queued operations first: they still need MPI, and one that fails hands its communicator to the
  // tending thread. Outside the registry's lock: one that fails settles its abort on the progress
  // thread, which may list its communicator as unsettled under that lock (no communicator comes or
  // goes meanwhile: MPI_Finalize must not run beside other MPI calls).
  for (mpi_state* s : live) s->ops.drain();
  {
    std::lock_guard lock(r.mutex);
    r.finalizing = true;  // no tending thread starts from here on
  }
  if (r.tender.joinable()) r.tender.join();  // it sees finalizing and ends, outside MPI
}

HERD_SEPARATE int at_finalize(MPI_Comm, int, void*, void*) {
  // Too late to be safe where the program called MPI_Finalize itself with a tending thread at work
  // (see stop_threads_before_finalize); still the best left to do then.
  stop_threads_before_finalize();
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  for (mpi_state* s : r.live) {
    s->ops.drain();  // what the snapshot missed, had it not been had
    depart(*s);
  }
  // The peers' departures arrive as they destroy their communicators, normally within moments;
  // a peer that is stuck is given up on after ten seconds.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    tend_retired(r, false);
    bool waiting = !r.retired.empty();
    for (mpi_state* s : r.live) {
      s->poll_notices();
      s->drain_everything();
      waiting = waiting || !s->all_departed();
    }
    if (!waiting || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  tend_retired(r, true);
  for (mpi_state* s : r.live) {
    s->release();
    s->finalized = true;
  }
  r.anything_to_tend.store(false, std::memory_order_release);
  return MPI_SUCCESS;
}

HERD_SEPARATE void register_state(mpi_state* s) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  if (!r.hooked) {
    int key = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_finalize, &key, nullptr);
    MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
    r.hooked = true;
  }
  r.live.push_back(s);
}

HERD_SEPARATE void retire(std::unique_ptr<mpi_state> s) noexcept {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), s.get()), r.live.end());
  s->node.reset();  // unmapping is local: peers keep their own mappings
  if (!mpi_running() || s->comm == MPI_COMM_NULL) return;
  depart(*s);
  try {
    r.retired.push_back(std::move(s));
  } catch (...) {
    return;  // s is freed now, without waiting for the peers
  }
  r.anything_to_tend.store(true, std::memory_order_release);
  tend_retired(r, false);
  r.anything_to_tend.store(!r.unsettled.empty() || !r.retired.empty(), std::memory_order_release);
}

[[noreturn]] HERD_SEPARATE void end_job() noexcept {
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI_Abort does not return; should it, the process still ends
}

HERD_SEPARATE void give_up_settling_or_throw(mpi_state& s, std::string_view reason) {
  std::string peers;
  for (auto& o : s.orphans) {
    if (o.handle == MPI_REQUEST_NULL || o.receiving) continue;
    const std::string name = std::to_string(s.shown(o.peer));
    if (peers.find("rank " + name + ",") == std::string::npos) peers += "rank " + name + ", ";
  }
  if (!peers.empty()) peers.resize(peers.size() - 2);
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", s.ops.options().stall_shutdown_seconds);
  const std::string what = "rank " + std::to_string(s.shown(s.rank)) + " could not settle " +
                           (s.ops.in_operation() ? s.ops.current().str() : std::string("its aborted operation")) +
                           " within HERD_STALL_SHUTDOWN_TIME_SECONDS=" + seconds + " s: " + peers +
                           " did not take what it sent, and MPI cannot cancel a send";
  if (s.ops.options().end_job_if_unsettled) {
    std::fprintf(stderr, "herd: %s (the abort: %.*s). Ending the job with MPI_Abort, as MPI may still read "
                         "memory the program would free. (comm_options::end_job_if_unsettled = false raises "
                         "herd::error instead.)\n",
                 what.c_str(), static_cast<int>(std::min<std::size_t>(reason.size(), 2000)), reason.data());
    std::fflush(stderr);
    end_job();
  }
  s.ops.set_abort_note(" Moreover " + what + ": those buffers still belong to MPI, which reads them until the peer "
                       "takes them; do not free or reuse them before then.");
  std::fprintf(stderr, "herd warning: %s; its buffers still belong to MPI.\n", what.c_str());
}

HERD_SEPARATE void give_up_settling(mpi_state& s, std::string_view reason) noexcept {
  try {
    give_up_settling_or_throw(s, reason);
  } catch (...) {  // out of memory for the words: the decision stands
    if (s.ops.options().end_job_if_unsettled) end_job();
  }
  for (auto& o : s.orphans) {
    if (o.handle != MPI_REQUEST_NULL) MPI_Request_free(&o.handle);  // the send completes on its own
  }
}

HERD_SEPARATE std::uint64_t announce_abort(mpi_state& s, std::string_view reason) noexcept {
  const bool before = s.ops.aborted();
  s.ops.mark_aborted(reason);
  std::uint64_t seq = s.aborted_seq;
  if (s.ops.in_operation() || !before) {
    try {
      seq = s.ops.first_unfinished();
    } catch (...) {  // its lock failed: abort #0, which every peer's wait takes as hopeless
      seq = 0;
    }
  }
  s.aborted_seq = seq;
  for (auto& o : s.orphans) {
    if (o.receiving) MPI_Cancel(&o.handle);
  }
  s.notify_all(mpi_notice::abort, seq, reason);
  return seq;
}

HERD_SEPARATE void settle_abort(mpi_state& s, std::uint64_t seq, std::string_view reason) noexcept {
  // Settling is bounded by the shutdown time (none when it is 0). Peers are waited for only while
  // they answer: one that told of its own abort is about to say "done"; one that said nothing
  // (stalled, or not yet aware) is left to this process's later waits (tend).
  const double bound = s.ops.options().stall_shutdown_seconds;
  waiting watch(s.ops.options());
  bool said_done = false;
  bool warned = false;
  for (;;) {
    bool in_flight = false;
    for (auto& o : s.orphans) {
      int done = 0;
      if (o.handle != MPI_REQUEST_NULL) MPI_Test(&o.handle, &done, MPI_STATUS_IGNORE);
      in_flight = in_flight || o.handle != MPI_REQUEST_NULL;
    }
    if (!in_flight && !said_done) {
      s.notify_all(mpi_notice::done, seq);
      said_done = true;
    }
    s.poll_notices();
    s.drain_aborted();
    s.reap_outgoing();
    if (watch.tick()) tend();
    if (said_done && (s.answering_settled() || (bound > 0 && watch.seconds() > bound))) break;
    if (!said_done && bound > 0 && watch.seconds() > bound) {
      give_up_settling(s, reason);  // ends the job, or leaves the sends to MPI and says so
      break;
    }
    if (!warned && !said_done && watch.seconds() > 60) {  // only without a bound: the watchdog is off
      warned = true;
      std::fprintf(stderr, "herd warning: rank %d has waited %.0f s to settle the messages of operation #%llu after "
                           "an abort; its peers must take what it sent before it can return.\n",
                   s.rank, watch.seconds(), static_cast<unsigned long long>(seq));
    }
    watch.pause();
  }
  s.orphans.clear();
  if (!s.all_settled()) add_unsettled(&s);
}

HERD_SEPARATE std::vector<int> agree_staying(mpi_state& s, const comm_options& options) {
  const std::uint64_t round = ++s.shrinks;
  const error_site site{"mpi_communicator::shrink", s.rank, s.size};
  s.notify_all(mpi_notice::present, round, {}, false);
  std::vector<int> staying = s.staying(round);
  auto unknown = [&] { return static_cast<int>(std::find(staying.begin(), staying.end(), -1) - staying.begin()); };
  watched_mpi_wait(
      options, site,
      [&] {
        s.poll_notices();
        staying = s.staying(round);
        return unknown() == s.size;
      },
      [] {}, [&] { return "for rank " + std::to_string(unknown()) + " to say whether it stays or left"; });
  const std::vector<int> members = staying_members(staying);
  if (rank_hook hook = shrink_hook(); hook != nullptr) hook(s.rank);

  const members_digest mine = members_digest::of(members);
  char words[2 * sizeof(std::uint64_t)];
  std::memcpy(words, &mine.count, sizeof mine.count);
  std::memcpy(words + sizeof mine.count, &mine.hash, sizeof mine.hash);
  s.notify_all(mpi_notice::members, round, std::string_view(words, sizeof words), false);
  members_state state;
  auto verdict = [&] {
    s.poll_notices();
    state = members_verdict(members, s.rank, mine, [&](int q) { return s.proposal_of(q, round); });
    return state.waiting_for < 0 || !state.problem.empty();
  };
  watched_mpi_wait(
      options, site, verdict, [&] { if (!state.problem.empty()) raise(site, state.problem, shrink_advice()); },
      [&] { return "for rank " + std::to_string(state.waiting_for) + " to say which ranks it counted as staying"; });
  if (!state.problem.empty()) raise(site, state.problem, shrink_advice());
  return members;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_MPI_FAILURE_HPP
