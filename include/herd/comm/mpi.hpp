#ifndef HERD_COMM_MPI_HPP
#define HERD_COMM_MPI_HPP
// herd::mpi::environment and herd::mpi_communicator: ranks as processes, over MPI.
//
// Besides moving bytes, an mpi_communicator keeps the rules every herd communicator follows
// (comm/detail/operation.hpp). What it does when an operation fails or a rank leaves (the notices
// ranks send each other, settling an abort within a bound, the communicators that go on draining
// after they are destroyed) is comm/detail/mpi_failure.hpp's.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/comm/detail/mpi_failure.hpp>
#include <herd/comm/detail/mpi_header.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/comm/detail/shm.hpp>
#include <herd/comm/detail/split.hpp>
#include <herd/comm/detail/watchdog.hpp>
#include <herd/core/config.hpp>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// mpi_communicator's members that create it, connect a node, post, wait, shrink, abort and settle
// are defined after the class, as HERD_SEPARATE (core/config.hpp): inline, or, with
// HERD_SEPARATE_COMPILATION, only in the program's implementation file, so that the other files
// compile none of them.

namespace herd {
namespace detail {

// Messages above this many bytes are sent as one message of a derived datatype, whose count fits
// an int: MPI before version 4 counts in int. (Tests lower it to exercise that path.)
inline std::size_t& mpi_message_limit() {
  static std::size_t limit = static_cast<std::size_t>(INT_MAX);
  return limit;
}
}  // namespace detail

namespace mpi {

inline bool is_initialized() { return herd::detail::mpi_running(); }

// MPI_Finalize, after herd's own threads are out of MPI for good: the operations queued on the
// communicators alive run to their end, and the thread that drains aborted communicators' messages
// (docs/failures.md) ends. Call this instead of MPI_Finalize in a program that initialized MPI
// itself: MPI forbids calls of other threads while MPI_Finalize runs, and MPICH 4.0.2 then fails
// in MPI_Finalize now and then. herd::mpi::environment calls it. Does nothing once MPI is finalized.
inline void finalize() {
  if (!is_initialized()) return;
  herd::detail::stop_threads_before_finalize();
  MPI_Finalize();
}

// Initializes MPI (asking for MPI_THREAD_MULTIPLE by default) unless the program already did, and
// finalizes it on destruction only if it was the one that initialized it.
class environment {
 public:
  environment() : environment(nullptr, nullptr) {}
  environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_MULTIPLE)
      : environment(&argc, &argv, required_thread_level) {}

  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  // finalize(): herd's threads leave MPI, then MPI_Finalize tells the peers of every communicator
  // still alive that this rank leaves.
  ~environment() {
    if (owns_) finalize();
  }

  // The thread support MPI provided (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return provided_; }
  // Whether this guard initialized MPI (and so will finalize it).
  bool owns() const noexcept { return owns_; }

 private:
  environment(int* argc, char*** argv, int required = MPI_THREAD_MULTIPLE);

  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE environment::environment(int* argc, char*** argv, int required) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&provided_);
    return;
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw error(
        "herd::mpi::environment: MPI was already finalized in this process and cannot be started again. "
        "Create the environment once, at the top of main.");
  }
  if (MPI_Init_thread(argc, argv, required, &provided_) != MPI_SUCCESS) {
    throw error(
        "herd::mpi::environment: MPI_Init_thread failed. Check that the program runs under mpiexec "
        "(or srun) of the same MPI it was built with.");
  }
  owns_ = true;
}
#endif  // HERD_SEPARATE_DEFINITIONS

namespace detail {
// What cuda_aware() answers; a malformed HERD_MPI_CUDA_AWARE (neither 0 nor 1) goes to `problem`
// and counts as unset, so that a communicator's creation reports it on every rank.
inline bool cuda_aware(std::string& problem) {
  const double forced = runtime::env_number("HERD_MPI_CUDA_AWARE", -1, problem, runtime::env_kind::flag);
  if (forced >= 0) return forced == 1;
#if defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS) return supported != 0;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() != 0;
#endif
  return false;
}
}  // namespace detail

// Whether this MPI moves CUDA device memory itself (is "CUDA-aware"): then herd's staged ring hands
// it device buffers instead of copying through page-locked host memory. HERD_MPI_CUDA_AWARE=0 or 1
// overrides what the MPI library says; any other value raises herd::error. Each rank decides for
// itself: it moves only where this rank's slots live, not what the messages hold.
inline bool cuda_aware() {
  std::string problem;
  const bool aware = detail::cuda_aware(problem);
  if (!problem.empty()) throw error("herd::mpi::cuda_aware: " + problem);
  return aware;
}

// This process's rank among the processes of `comm` on the same node, and their number (through
// MPI_COMM_TYPE_SHARED): what picks a GPU per process, like Horovod's local_rank().
namespace detail {
// (rank, size) within the processes of `comm` that share this node.
HERD_SEPARATE std::pair<int, int> node_rank_and_size(MPI_Comm comm, const char* operation);

// Of MPI_COMM_WORLD, asked once: the first call is collective (every rank calls it, as
// MPI_Comm_split_type), the later ones are local, as Horovod's local_rank() is. Of another
// communicator, every call is collective.
inline std::pair<int, int> world_node_rank_and_size(const char* operation) {
  static const std::pair<int, int> answer = node_rank_and_size(MPI_COMM_WORLD, operation);
  return answer;
}
#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE std::pair<int, int> node_rank_and_size(MPI_Comm comm, const char* operation) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
    throw error(std::string("herd::mpi::") + operation + ": MPI_Comm_split_type failed. Is MPI initialized?");
  }
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail

inline int local_rank(MPI_Comm comm = MPI_COMM_WORLD) {
  return comm == MPI_COMM_WORLD ? detail::world_node_rank_and_size("local_rank").first
                                : detail::node_rank_and_size(comm, "local_rank").first;
}
inline int local_size(MPI_Comm comm = MPI_COMM_WORLD) {
  return comm == MPI_COMM_WORLD ? detail::world_node_rank_and_size("local_size").second
                                : detail::node_rank_and_size(comm, "local_size").second;
}

}  // namespace mpi

class mpi_communicator {
 public:
  // A pending isend or irecv. Destroying one that is still pending cancels a receive and waits
  // for a send to complete, so that MPI never touches memory the caller may free next. (Inside a
  // failing operation the abort settles it instead.)
  class request {
   public:
    request() = default;
    request(request&& other) noexcept { *this = std::move(other); }
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        handle_ = std::exchange(other.handle_, MPI_REQUEST_NULL);
        owner_ = other.owner_;
        peer_ = other.peer_;
        tag_ = other.tag_;
        receiving_ = other.receiving_;
      }
      return *this;
    }
    ~request() { release(); }

    bool pending() const noexcept { return handle_ != MPI_REQUEST_NULL; }

   private:
    friend class mpi_communicator;
    void release() noexcept {
      if (handle_ == MPI_REQUEST_NULL || !mpi::is_initialized()) return;
      if (owner_ != nullptr && tag_ >= reserved_tag_base && owner_->ops.in_operation()) {
        try {
          owner_->orphans.push_back({handle_, receiving_, peer_});
          handle_ = MPI_REQUEST_NULL;
          return;
        } catch (...) {
        }
      }
      if (receiving_) MPI_Cancel(&handle_);
      settle(handle_);
    }

    MPI_Request handle_ = MPI_REQUEST_NULL;
    detail::mpi_state* owner_ = nullptr;
    int peer_ = -1;
    int tag_ = 0;
    bool receiving_ = false;
  };

  // Duplicates `comm`, so herd's messages never mix with the caller's own on it. Every rank of
  // `comm` creates its communicator together; the creation checks that all run the same wire
  // protocol (comm_options) and raises on every rank if any has a malformed HERD_* variable.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, comm_options options = {})
      : mpi_communicator(comm, std::move(options), nullptr) {}

  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& other) noexcept;
  mpi_communicator& operator=(mpi_communicator&& other) noexcept;
  // Waits for this rank's queued operations, then tells the other ranks it has left.
  ~mpi_communicator();

  // A rank left out of a split gets a communicator it is not a member of: rank -1, size 0, and
  // native() MPI_COMM_NULL, as MPI_Comm_split gives it.
  int rank() const noexcept { return s_ ? s_->rank : member_ ? 0 : -1; }
  int size() const noexcept { return s_ ? s_->size : member_ ? 1 : 0; }
  bool is_member() const noexcept { return member_; }
  MPI_Comm native() const noexcept { return s_ ? s_->comm : MPI_COMM_NULL; }
  const comm_options& options() const { return state().ops.options(); }
  detail::operation_state& operations() { return state().ops; }

  // Host memory only; device buffers go through herd's staging path or the NCCL communicator.
  bool supports(device d) const noexcept { return d.is_cpu(); }
  // Whether the staged path may hand MPI device memory directly (mpi::cuda_aware()).
  bool cuda_aware() const { return state().cuda_aware; }

  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    return post(const_cast<void*>(data), bytes, peer, tag, false);
  }

  request irecv(void* data, std::size_t bytes, int peer, int tag) { return post(data, bytes, peer, tag, true); }

  // True once the request completed (it is then no longer pending).
  bool test(request& r) {
    if (!r.pending()) return true;
    (void)state();  // a communicator left or finalized is an error, not a crash
    int done = 0;
    check(MPI_Test(&r.handle_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

  // Polls (spinning briefly, then yielding, then sleeping: detail::waiting) instead of MPI_Wait's
  // busy spin, so that with more ranks than cores the rank being waited for gets the core. Inside
  // an operation, raises at once when a peer aborted it or left; always watched (comm_options).
  void wait(request& r);

  // Shared memory (comm/detail/shm.hpp): the node of this rank when it is the whole communicator
  // (every collective may take it), else null.
  detail::shm_node* shared_node() const noexcept { return s_ && s_->node_is_everyone ? s_->node.get() : nullptr; }
  // The ranks of this node, when there are several and other nodes too: with across_nodes() (the
  // ranks of this rank's index on every node), what the hierarchical allreduce needs.
  detail::shm_node* node_part() const noexcept { return s_ && !s_->node_is_everyone ? s_->node.get() : nullptr; }
  mpi_communicator* across_nodes() const noexcept { return across_.get(); }

  // What a wait outside MPI (on shared memory) does now and then: completes what peers still send
  // to communicators of this process that were aborted or destroyed, and raises if a peer aborted
  // the running operation or left.
  void while_waiting() {
    detail::tend();
    if (s_->ops.in_operation()) check_peers();
  }

  // Raises if a peer aborted the running operation (or an earlier one), or left before it.
  void check_peers();

  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    request rr = irecv(receive, receive_bytes, source, tag);
    request sr = isend(send, send_bytes, destination, tag);
    wait(rr);
    wait(sr);
  }

  // Ranks passing the same color form a new communicator, ordered by key then by rank here; a
  // rank passing herd::no_color gets one it is not a member of (MPI_UNDEFINED). An operation of
  // this communicator: every rank calls it, and the colors are agreed first, so that a bad color
  // on one rank raises on every rank instead of leaving the others in MPI_Comm_split.
  mpi_communicator split(int color, int key) const { return split_by(detail::op_kind::split, {color, key}, {}); }

  // The listed ranks, in the order listed, as a new communicator (Horovod's process set); the
  // others get one they are not members of. Every rank calls it, with the same list.
  mpi_communicator subset(const std::vector<int>& ranks) const {
    return split_by(detail::op_kind::subset, detail::subset_request(ranks, rank()), ranks);
  }

  // A new communicator of the same ranks, with nothing in flight: how ranks go on after an abort
  // (as ncclCommAbort followed by a new ncclCommInitRank). Every rank calls it.
  // The ranks must have completed the same operations of this one (the failed operation may have
  // succeeded on some ranks before others gave up): if not, it raises on every rank, naming each
  // rank's last; renew(options, herd::rolled_back) is for ranks brought back to one state first.
  mpi_communicator renew() const { return renew(options()); }
  mpi_communicator renew(const comm_options& options) const;
  mpi_communicator renew(const comm_options& options, rolled_back_t) const;

  // A new communicator of the ranks that are still here, renumbered in their order here: how
  // the others go on when ranks left (returned from main, destroyed or left() their communicator,
  // MPI_Finalize). Every staying rank calls it, the ranks that left do not; as renew(options,
  // herd::rolled_back), the caller brings the ranks back to one state. The ranks agree on who
  // stays: each tells the others it is here, and waits until every rank has either said so or
  // said it left (under the watchdog: a rank that does neither, killed or stalled, is an error
  // after the shutdown time). Then MPI_Comm_create_group over them, collective over them alone.
  // With every rank still here, the result is renew(options, herd::rolled_back)'s.
  mpi_communicator shrink() const { return shrink(options()); }
  mpi_communicator shrink(const comm_options& options) const;

  // Tells the other ranks that this rank leaves (as destroying the communicator does), after its
  // queued operations; the communicator is then empty, as one moved from. Their waits for this
  // rank raise at once, and they go on without it with shrink().
  void leave() noexcept;

  // Aborts the running operation (detail::run_now calls it when an operation fails after its
  // agreement): tells the peers, cancels this rank's receives, drains what the peers sent, and
  // returns once this rank's sends are complete (only the peers can complete them: MPI cannot
  // cancel a send) and every peer that answered has said it is done (this process's later waits go
  // on draining for the others: detail::tend). All within the shutdown time; past it, see
  // detail::give_up_settling.
  void abort(std::string_view reason) noexcept;

 private:
  // A duplicate of `comm`; `renewed`: this rank's last completed operation of the communicator it
  // renews (the creation checks that every rank's is the same), or null. `fit`: an explicitly
  // chosen algorithm that does not fit the ranks falls back to auto with a warning (after a
  // shrink(), which the ranks cannot choose), instead of being an error.
  struct fit_algorithm_t {};
  static constexpr fit_algorithm_t fit_algorithm{};
  mpi_communicator(MPI_Comm comm, comm_options options, const detail::op_label* renewed, fit_algorithm_t);
  mpi_communicator(MPI_Comm comm, comm_options options, const detail::op_label* renewed);
  void create(MPI_Comm comm, comm_options options, const detail::op_label* renewed);

  struct adopt_tag {};
  mpi_communicator(MPI_Comm owned, const comm_options& options, adopt_tag);
  struct outside_tag {};
  explicit mpi_communicator(outside_tag) : member_(false) {}

  // split and subset: a split operation of this communicator with this rank's request.
  mpi_communicator split_by(detail::op_kind kind, const detail::split_request& mine, std::span<const int> ranks) const;

  // The creation's last part, after its agreement (every rank is here): finds the ranks that share
  // this node (MPI_COMM_TYPE_SHARED, or HERD_SIMULATE_NODE_SIZE in tests) and maps their shared
  // memory; with several nodes of equal size, also the communicator across nodes of the ranks with
  // this rank's index in its node (the hierarchical allreduce's). A rank that cannot map the memory
  // says so, and then no rank uses it: with HERD_ALLREDUCE_ALGORITHM=auto the ranks go on with
  // MPI messages alone (a warning says why), with shm or hierarchical every rank raises.
  void join_node();

  // MPI_Comm_split of this communicator, watched (every rank agreed to make it, in an operation).
  void split_watched(int color, int key, MPI_Comm* part) const;

  void make_state(comm_options options);

  void adopt(MPI_Comm comm);

  // Across nodes, errors name the operation and the ranks of the communicator the user called.
  detail::error_site site() const {
    if (const detail::mpi_state* outer = s_->outer) return detail::site_of(s_->ops, "mpi_communicator", s_->shown(rank()), outer->size);
    return detail::site_of(s_->ops, "mpi_communicator", rank(), size());
  }
  std::string waiting_text(const request& r) const;

  detail::mpi_state& state() const {
    if (!s_) {
      if (!member_) detail::raise_not_member("mpi_communicator");
      throw error("herd::mpi_communicator: this communicator is empty: it was moved from, or left (leave()). Use the "
                  "one it was moved to, or create a new one.");
    }
    if (s_->finalized) {
      detail::raise({"mpi_communicator", s_->rank, s_->size},
                    "MPI was finalized while this communicator existed, so it can be used no more",
                    "Use herd's communicators only before MPI_Finalize (herd::mpi::environment finalizes MPI when it "
                    "goes out of scope: create it first in main, so that it is destroyed last)");
    }
    return *s_;
  }

  request post(void* data, std::size_t bytes, int peer, int tag, bool receiving);

  // Completes a request outside any operation (a user's request destroyed while pending): never
  // frees one MPI may still use; warns while it waits. Not the watched wait (watchdog.hpp): it
  // runs in destructors, so it never raises, and it warns every minute in words of its own.
  static void settle(MPI_Request& handle) noexcept;

  void check(int code, const char* call) const;

  std::unique_ptr<detail::mpi_state> s_;
  std::unique_ptr<mpi_communicator> across_;  // the ranks of this rank's index on the other nodes
  bool member_ = true;
  bool fit_algorithm_ = false;  // made by shrink(): an algorithm that does not fit falls back
};

#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE mpi_communicator::mpi_communicator(MPI_Comm comm, comm_options options, const detail::op_label* renewed,
                                                fit_algorithm_t)
    : fit_algorithm_(true) {
  create(comm, std::move(options), renewed);
}

HERD_SEPARATE mpi_communicator::mpi_communicator(MPI_Comm comm, comm_options options,
                                                const detail::op_label* renewed) {
  create(comm, std::move(options), renewed);
}

HERD_SEPARATE mpi_communicator::mpi_communicator(mpi_communicator&& other) noexcept {
  if (other.s_) other.s_->ops.drain();  // queued operations refer to the object that queued them
  s_ = std::move(other.s_);
  across_ = std::move(other.across_);
  member_ = other.member_;
}

HERD_SEPARATE mpi_communicator& mpi_communicator::operator=(mpi_communicator&& other) noexcept {
  if (this != &other) {
    leave();
    if (other.s_) other.s_->ops.drain();
    s_ = std::move(other.s_);
    across_ = std::move(other.across_);
    member_ = other.member_;
  }
  return *this;
}

HERD_SEPARATE mpi_communicator::~mpi_communicator() { leave(); }

HERD_SEPARATE void mpi_communicator::wait(request& r) {
  if (test(r)) return;  // test() raises on a communicator left or finalized
  // Inside an operation, time spent here is a phase of it in the timeline.
  const detail::trace::span phase(s_->ops.in_operation() ? s_->ops.track() : 0,
                                  s_->ops.in_operation() ? (r.receiving_ ? "wait to receive" : "wait to send") : nullptr,
                                  {.extra_name = "peer", .extra = r.peer_});
  for (int i = 0; i < 31; ++i) {
    if (test(r)) return;
  }
  detail::watched_mpi_wait(
      options(), site(), [&] { return test(r); }, [&] { if (s_->ops.in_operation()) check_peers(); },
      [&] { return waiting_text(r); });
}

HERD_SEPARATE void mpi_communicator::check_peers() {
  if (detail::mpi_state* outer = state().outer) {
    outer->poll_notices();
    if (std::string why = outer->hopeless(outer->ops.current()); !why.empty()) detail::raise(site(), why, "");
  }
  s_->poll_notices();
  if (std::string why = s_->hopeless(s_->ops.current()); !why.empty()) {
    detail::raise(site(), why, "");
  }
}

HERD_SEPARATE mpi_communicator mpi_communicator::renew(const comm_options& options) const {
  state().ops.drain();  // queued operations first: they decide which operation completed last
  const detail::op_label last = s_->ops.last_completed();
  return mpi_communicator(native(), options, &last);
}

HERD_SEPARATE mpi_communicator mpi_communicator::renew(const comm_options& options, rolled_back_t) const {
  state().ops.drain();
  return mpi_communicator(native(), options, nullptr);
}

HERD_SEPARATE mpi_communicator mpi_communicator::shrink(const comm_options& options) const {
  detail::mpi_state& s = state();
  s.ops.drain();
  const std::vector<int> members = detail::agree_staying(s, options);
  if (static_cast<int>(members.size()) == size()) return mpi_communicator(native(), options, nullptr, fit_algorithm);
  MPI_Group all = MPI_GROUP_NULL;
  MPI_Group part = MPI_GROUP_NULL;
  check(MPI_Comm_group(native(), &all), "MPI_Comm_group");
  check(MPI_Group_incl(all, static_cast<int>(members.size()), members.data(), &part), "MPI_Group_incl");
  MPI_Group_free(&all);
  // Open MPI sends the creation's messages on this communicator with this tag: the highest one
  // MPI allows, above every tag herd and its users send on (a stale message of an aborted
  // operation, or the notices' standing receive, would otherwise take them).
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has_tag_ub);  // predefined there
  const int tag = has_tag_ub != 0 && tag_ub != nullptr ? *tag_ub : 32767;
  MPI_Comm survivors = MPI_COMM_NULL;
  // Every member agreed to come, but one may stall or die since: watched. (A call given up on
  // keeps the group, which it may still read.)
  const int code = detail::watched_mpi_call(
      options, {"mpi_communicator::shrink", rank(), size()},
      "in MPI_Comm_create_group for the " + std::to_string(members.size()) + " ranks that stay", &survivors,
      [parent = native(), part, tag](MPI_Comm* made) { return MPI_Comm_create_group(parent, part, tag, made); });
  MPI_Group_free(&part);
  check(code, "MPI_Comm_create_group");
  // A duplicate of it, created and agreed on like every communicator.
  struct freed {
    MPI_Comm& c;
    ~freed() { MPI_Comm_free(&c); }
  } free_survivors{survivors};
  return mpi_communicator(survivors, options, nullptr, fit_algorithm);
}

HERD_SEPARATE void mpi_communicator::leave() noexcept {
  if (!s_) return;
  s_->ops.drain();
  detail::retire(std::move(s_));
  across_.reset();
}

HERD_SEPARATE void mpi_communicator::abort(std::string_view reason) noexcept {
  if (!s_) return;
  detail::mpi_state& s = *s_;
  const std::uint64_t seq = detail::announce_abort(s, reason);
  // Ranks of other nodes may wait for this one in the hierarchical allreduce's ring, where they
  // hear that communicator: it is aborted too, after the peers here were told (a rank waiting in
  // its node's phase hears only this one) and before settling here.
  if (across_ && !across_->operations().aborted()) across_->abort(reason);
  detail::settle_abort(s, seq, reason);
}

HERD_SEPARATE void mpi_communicator::create(MPI_Comm comm, comm_options options, const detail::op_label* renewed) {
  if (!mpi::is_initialized()) {
    throw error("herd::mpi_communicator: MPI is not initialized. Create a herd::mpi::environment (or call "
                "MPI_Init_thread) before any communicator.");
  }
  if (comm == MPI_COMM_NULL) {
    throw error("herd::mpi_communicator: MPI_COMM_NULL is no communicator (MPI_Comm_split gives it to the ranks it "
                "leaves out). Create communicators only from one this rank belongs to.");
  }
  make_state(options);
  int parent_rank = 0;
  int parent_size = 1;
  check(MPI_Comm_rank(comm, &parent_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &parent_size), "MPI_Comm_size");
  // MPI writes the new communicator when the duplication completes, which may be after this
  // rank gave up on it: the handle and the request live on the heap, and are left to MPI (a few
  // bytes, on purpose) when the wait below raises.
  struct pending_dup {
    MPI_Comm copy = MPI_COMM_NULL;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  auto dup = std::make_unique<pending_dup>();
  check(MPI_Comm_idup(comm, &dup->copy, &dup->request), "MPI_Comm_idup");
  try {
    // Watched like every wait: a rank that never comes to the creation is reported, not waited
    // for forever. (A nonblocking collective cannot be cancelled: on that error it stays pending.)
    detail::watched_mpi_wait(
        options, {"mpi_communicator", parent_rank, parent_size},
        [&] {
          int done = 0;
          check(MPI_Test(&dup->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
          return done != 0;
        },
        [] {}, [] { return std::string("for the other ranks to create a communicator"); });
  } catch (...) {
    (void)dup.release();
    throw;
  }
  const MPI_Comm copy = dup->copy;
  adopt(copy);
  try {
    int world_rank = 0;
    check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
    detail::trace::start_from_environment(world_rank);  // HERD_TIMELINE, named by the rank MPI knows
    std::string problem = runtime::defaults().problem;
    if (problem.empty()) (void)mpi::detail::cuda_aware(problem);
    detail::agree_creation(*this, problem, renewed);
    join_node();
  } catch (...) {
    detail::retire(std::move(s_));  // peers may still send to it: it drains until they leave too
    throw;
  }
}

HERD_SEPARATE mpi_communicator::mpi_communicator(MPI_Comm owned, const comm_options& options, adopt_tag) {
  make_state(options);
  adopt(owned);
  try {
    join_node();
  } catch (...) {
    detail::retire(std::move(s_));
    throw;
  }
}

HERD_SEPARATE mpi_communicator mpi_communicator::split_by(detail::op_kind kind, const detail::split_request& mine,
                                                          std::span<const int> ranks) const {
  auto& self = const_cast<mpi_communicator&>(*this);
  MPI_Comm part = MPI_COMM_NULL;
  detail::run_operation(self, {kind}, [&] {
    detail::agree_split(self, mine, ranks);
    split_watched(mine.color == no_color ? MPI_UNDEFINED : mine.color, mine.key, &part);
  });
  if (part == MPI_COMM_NULL) return mpi_communicator(outside_tag{});
  return mpi_communicator(part, options(), adopt_tag{});
}

HERD_SEPARATE void mpi_communicator::join_node() {
  const comm_options& o = options();
  if (size() == 1 || o.allreduce_algorithm == algorithm::ring) return;
  auto body = [&] {
    const detail::error_site site{"communicator", rank(), size()};
    MPI_Comm node = MPI_COMM_NULL;
    if (o.simulated_node_size > 0) {
      split_watched(rank() / o.simulated_node_size, rank(), &node);
    } else {
      check(detail::watched_mpi_call(o, site, "in MPI_Comm_split_type for the ranks of this node", &node,
                                     [parent = native(), key = rank()](MPI_Comm* made) {
                                       return MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, made);
                                     }),
            "MPI_Comm_split_type");
    }
    int node_rank = 0;
    int node_size = 1;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &node_size);
    std::vector<int> local(static_cast<std::size_t>(node_size));
    std::vector<int> members(local.size());
    for (int i = 0; i < node_size; ++i) local[static_cast<std::size_t>(i)] = i;
    MPI_Group node_group = MPI_GROUP_NULL;
    MPI_Group all_group = MPI_GROUP_NULL;
    MPI_Comm_group(node, &node_group);
    MPI_Comm_group(native(), &all_group);
    MPI_Group_translate_ranks(node_group, node_size, local.data(), all_group, members.data());
    MPI_Group_free(&node_group);
    MPI_Group_free(&all_group);
    MPI_Comm_free(&node);

    // The node's first rank creates the segment and sends its name and identity; the others map
    // it and check the identity before any use; then every rank says whether that worked, and
    // the name goes (the memory stays while it is mapped). First through /proc (an anonymous
    // segment, which leaves nothing behind); if some rank could not attach that way (ranks in
    // separate PID namespaces, a creator that is not dumpable) every node tries once more with a
    // named segment in /dev/shm, removed as soon as its ranks have it.
    struct node_report {
      std::int32_t first = 0;  // the node's first rank: the node's identity
      std::int32_t size = 0;
      std::int32_t cores = 0;            // the node's processors online (first rank)
      detail::shm_segment::identity id;  // the segment's (first rank)
      char text[1024] = {};              // the segment's name (first rank), or what went wrong
    };
    // A slice holds at least one 8-byte element per rank (a reduce-scatter's pieces).
    const std::size_t slice = std::max(o.shm_slice_bytes, 8 * static_cast<std::size_t>(node_size));
    const std::size_t bytes = detail::shm_node::segment_bytes(node_size, slice);
    std::string problem;
    detail::shm_segment segment;
    std::vector<node_report> reports(static_cast<std::size_t>(size()));
    std::vector<std::string> names(static_cast<std::size_t>(size()));
    auto attach = [&](bool named) {
      problem.clear();
      segment = {};
      if (node_size > 1 && node_rank == 0) segment = detail::shm_segment::create(bytes, problem, named);
      node_report mine;
      mine.first = members[0];
      mine.size = node_size;
      mine.cores = static_cast<std::int32_t>(::sysconf(_SC_NPROCESSORS_ONLN));
      mine.id = segment.id();
      std::memcpy(mine.text, segment.name().data(), std::min(segment.name().size(), sizeof mine.text - 1));
      auto exchange_reports = [&] {
        const detail::exchanged all = detail::agree_identity(*this, &mine, sizeof mine);
        for (int r = 0; r < size(); ++r) std::memcpy(&reports[static_cast<std::size_t>(r)], all.payload(r), sizeof mine);
      };
      exchange_reports();
      for (int r = 0; r < size(); ++r) names[static_cast<std::size_t>(r)] = reports[static_cast<std::size_t>(r)].text;
      const node_report& creator = reports[static_cast<std::size_t>(members[0])];
      if (node_size > 1 && node_rank != 0 && !names[static_cast<std::size_t>(members[0])].empty()) {
        segment = detail::shm_segment::open(names[static_cast<std::size_t>(members[0])], bytes, creator.id, problem);
      }
      // Every rank's problem (the first rank's: creating the segment; the others': mapping it).
      std::memset(mine.text, 0, sizeof mine.text);
      std::memcpy(mine.text, problem.data(), std::min(problem.size(), sizeof mine.text - 1));
      exchange_reports();
    };
    attach(false);
    bool unreachable = false;  // a rank could not attach to its node's anonymous segment
    for (int r = 0; r < size(); ++r) {
      const node_report& report = reports[static_cast<std::size_t>(r)];
      unreachable = unreachable || (report.first != r && report.text[0] != '\0' &&
                                    names[static_cast<std::size_t>(report.first)].rfind("/proc/", 0) == 0);
    }
    if (unreachable) {
      segment.release_name();
      attach(true);
    }
    segment.release_name();

    std::string trouble;
    int nodes = 0;
    bool equal_sizes = true;
    for (int r = 0; r < size(); ++r) {
      const node_report& report = reports[static_cast<std::size_t>(r)];
      if (trouble.empty() && report.text[0] != '\0') {
        trouble = "rank " + std::to_string(r) + " could not share memory with its node: " + report.text;
      }
      nodes += report.first == r ? 1 : 0;
      equal_sizes = equal_sizes && report.size == reports[0].size;
    }
    const bool one_node = nodes == 1;
    const bool fits = (o.allreduce_algorithm != algorithm::shared_memory || one_node) &&
                      (o.allreduce_algorithm != algorithm::hierarchical || equal_sizes);
    if (!fits && fit_algorithm_) {  // every rank sees the same reports: every rank falls back
      std::fprintf(stderr,
                   "herd warning (rank %d of %d): HERD_ALLREDUCE_ALGORITHM=%s does not fit the ranks left after "
                   "shrink() (%d nodes, %s ranks on each); this communicator uses auto.\n",
                   rank(), size(), herd::name(o.allreduce_algorithm), nodes, equal_sizes ? "as many" : "not as many");
      s_->ops.options().allreduce_algorithm = algorithm::automatic;
    }
    if (o.allreduce_algorithm == algorithm::shared_memory && !one_node) {
      detail::raise_agreed(site, "HERD_ALLREDUCE_ALGORITHM=shm needs every rank on one node, but the ranks are on " +
                                     std::to_string(nodes) + " nodes",
                           "Use auto (shared memory within nodes where it can) or hierarchical");
    }
    if (o.allreduce_algorithm == algorithm::hierarchical && !equal_sizes) {
      detail::raise_agreed(site, "HERD_ALLREDUCE_ALGORITHM=hierarchical needs the same number of ranks on every node",
                           "Start as many ranks on every node, or use auto");
    }
    if (!trouble.empty()) {
      if (o.allreduce_algorithm != algorithm::automatic) {
        detail::raise_agreed(site, trouble,
                             "The node's ranks could not share memory, for the reason above (through /proc, and "
                             "then, where that failed, through a named segment in /dev/shm); use "
                             "HERD_ALLREDUCE_ALGORITHM=auto (which falls back to messages) or ring");
      }
      // Every rank says it: each falls back, and a rank's log may be the only one its user reads.
      std::fprintf(stderr, "herd warning (rank %d of %d): %s; this communicator moves data with MPI messages only.\n",
                   rank(), size(), trouble.c_str());
      return;
    }
    if (node_size > 1) {
      const int cores = reports[static_cast<std::size_t>(members[0])].cores;  // one value for the node
      s_->node = std::make_unique<detail::shm_node>(std::move(segment), node_rank, members, slice, cores);
      s_->node_is_everyone = one_node;
    }
    if (!one_node && equal_sizes && (node_size > 1 || o.allreduce_algorithm == algorithm::hierarchical)) {
      MPI_Comm part = MPI_COMM_NULL;
      split_watched(node_rank, rank(), &part);
      comm_options across = o;
      across.allreduce_algorithm = algorithm::ring;
      across_.reset(new mpi_communicator(part, across, adopt_tag{}));
      detail::mpi_state& a = *across_->s_;
      a.outer_ranks.resize(static_cast<std::size_t>(a.size));
      std::vector<int> here(a.outer_ranks.size());
      for (int i = 0; i < a.size; ++i) here[static_cast<std::size_t>(i)] = i;
      MPI_Group across_group = MPI_GROUP_NULL;
      MPI_Group outer_group = MPI_GROUP_NULL;
      MPI_Comm_group(a.comm, &across_group);
      MPI_Comm_group(native(), &outer_group);
      MPI_Group_translate_ranks(across_group, a.size, here.data(), outer_group, a.outer_ranks.data());
      MPI_Group_free(&across_group);
      MPI_Group_free(&outer_group);
      a.outer = s_.get();
    }
  };
  detail::run_now(*this, {detail::op_kind::create, 0}, body);
}

HERD_SEPARATE void mpi_communicator::split_watched(int color, int key, MPI_Comm* part) const {
  check(detail::watched_mpi_call(options(), {"mpi_communicator", rank(), size()}, "in MPI_Comm_split", part,
                                 [parent = native(), color, key](MPI_Comm* made) {
                                   return MPI_Comm_split(parent, color, key, made);
                                 }),
        "MPI_Comm_split");
}

HERD_SEPARATE void mpi_communicator::make_state(comm_options options) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  // A progress thread calls MPI while the caller may too: that needs MPI_THREAD_MULTIPLE.
  if (level < MPI_THREAD_MULTIPLE) options.progress_thread = false;
  s_ = std::make_unique<detail::mpi_state>(options);
}

HERD_SEPARATE void mpi_communicator::adopt(MPI_Comm comm) {
  s_->comm = comm;
  std::string problem;  // a malformed HERD_MPI_CUDA_AWARE: the creation's agreement reports it
  s_->cuda_aware = mpi::detail::cuda_aware(problem);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &s_->rank);
  MPI_Comm_size(comm, &s_->size);
  s_->listen();
  detail::register_state(s_.get());
}

HERD_SEPARATE std::string mpi_communicator::waiting_text(const request& r) const {
  if (const detail::mpi_state* outer = s_->outer; outer != nullptr && s_->ops.in_operation()) {
    return "in " + outer->ops.current().str() + ", across nodes, to " + (r.receiving_ ? "receive from" : "send to") +
           " rank " + std::to_string(s_->shown(r.peer_));
  }
  return detail::waiting_for(s_->ops, r.peer_, r.receiving_, r.tag_);
}

HERD_SEPARATE mpi_communicator::request mpi_communicator::post(void* data, std::size_t bytes, int peer, int tag,
                                                               bool receiving) {
  const char* what = receiving ? "irecv" : "isend";
  state();
  detail::check_peer(what, rank(), size(), peer);
  detail::check_buffer(what, rank(), size(), data, bytes);
  detail::check_tag(what, rank(), size(), tag);
  if (s_->ops.aborted() && !s_->ops.in_operation()) s_->ops.raise_aborted(what, rank(), size());
  if (detail::message_hook hook = detail::post_hook(); hook != nullptr && tag >= reserved_tag_base) hook(tag, receiving);
  request r;
  r.owner_ = s_.get();
  r.peer_ = peer;
  r.tag_ = tag;
  r.receiving_ = receiving;
  if (bytes <= detail::mpi_message_limit()) {
    const int count = static_cast<int>(bytes);
    check(receiving ? MPI_Irecv(data, count, MPI_BYTE, peer, tag, native(), &r.handle_)
                    : MPI_Isend(data, count, MPI_BYTE, peer, tag, native(), &r.handle_),
          receiving ? "MPI_Irecv" : "MPI_Isend");
    return r;
  }
  // One message of `blocks` pieces of `limit` bytes and a remainder, so that every count fits an int.
  const std::size_t limit = detail::mpi_message_limit();
  const std::size_t blocks = bytes / limit;
  if (blocks > static_cast<std::size_t>(INT_MAX)) {
    detail::raise({what, rank(), size()}, "a message of " + std::to_string(bytes) + " bytes is too large for MPI",
                  "Split the tensor");
  }
  MPI_Datatype whole = MPI_DATATYPE_NULL;
  check(detail::make_byte_type(bytes, limit, &whole), "MPI_Type_create_struct");
  const int code = receiving ? MPI_Irecv(data, 1, whole, peer, tag, native(), &r.handle_)
                             : MPI_Isend(data, 1, whole, peer, tag, native(), &r.handle_);
  MPI_Type_free(&whole);  // MPI keeps what a posted operation still needs
  check(code, receiving ? "MPI_Irecv" : "MPI_Isend");
  return r;
}

HERD_SEPARATE void mpi_communicator::settle(MPI_Request& handle) noexcept {
  detail::waiting watch(comm_options{});
  for (;;) {
    int done = 0;
    if (MPI_Test(&handle, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) break;
    if (watch.tick()) {
      detail::tend();
      if (watch.seconds() > 60) {
        std::fprintf(stderr, "herd warning: a send was dropped while still pending; herd waits for it to complete "
                             "(its receiver must post a matching receive), because MPI may still read its buffer.\n");
        watch = detail::waiting(comm_options{});
      }
    }
    watch.pause();
  }
  handle = MPI_REQUEST_NULL;
}

HERD_SEPARATE void mpi_communicator::check(int code, const char* call) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  detail::raise({"mpi_communicator", rank(), size()}, std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(length)),
                "This is an error inside MPI; check the MPI installation and that every rank is alive");
}
#endif

}  // namespace herd

#endif  // HERD_COMM_MPI_HPP
