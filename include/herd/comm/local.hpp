#ifndef HERD_COMM_LOCAL_HPP
#define HERD_COMM_LOCAL_HPP
// herd::local_communicator: N ranks as threads of one process, passing messages through shared
// memory. For tests, and for single-node programs that want data parallelism without MPI.
//
//   herd::local::run(4, [](herd::local_communicator& comm) { ... });
//
// Waiting ranks block on a condition variable rather than spinning. Operations follow the rules
// of every herd communicator (comm/detail/operation.hpp): an operation that fails after its
// agreement aborts the communicator on every rank, and a rank whose function returns while the
// others wait for it makes them raise. If fn throws on any rank, every other rank's pending or
// later wait fails with herd::error, and run() rethrows the first exception once all threads have
// finished.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/failure.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/comm/detail/split.hpp>
#include <herd/comm/detail/watchdog.hpp>
#include <herd/core/config.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace herd {
namespace detail::local {

// One isend or irecv.
struct message {
  const void* send_data = nullptr;
  void* receive_data = nullptr;
  std::size_t bytes = 0;
  int owner = 0;  // the rank that posted it
  int peer = 0;
  int tag = 0;
  bool receiving = false;
  bool done = false;   // guarded by the owner's waiter mutex
  std::string failure;  // written before done
};
using message_ptr = std::shared_ptr<message>;

// Unmatched messages addressed to one rank, and that rank's unmatched receives.
struct mailbox {
  std::mutex mutex;
  std::deque<message_ptr> sends;
  std::deque<message_ptr> receives;
};

struct waiter {
  std::mutex mutex;
  std::condition_variable wake;
};

inline constexpr std::uint64_t never = std::numeric_limits<std::uint64_t>::max();

class world {
 public:
  explicit world(int size);

  int size() const noexcept { return size_; }

  // --- local::run's failure: every wait of this world and of the worlds split from it fails.
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  std::string failure();
  void fail(const std::string& reason);

  // --- One rank's operation `seq` aborted, or the rank left after issuing `issued` operations.
  void abort_operation(int rank, std::uint64_t seq, const std::string& reason);
  void depart(int rank, std::uint64_t issued);

  // Why rank `me`, in its operation `label`, waits in vain: a peer aborted that operation (or an
  // earlier one), or left before issuing it. Empty when there is hope.
  std::string hopeless(int me, const op_label& label);

  // --- shrink(): rank `rank` says it stays, in its shrink number `round` of this world.
  void stay(int rank, std::uint64_t round);
  // For each rank, what is known of it in shrink `round` (staying_answer: 1 stays, 0 left, -1
  // not yet known).
  std::vector<int> staying(std::uint64_t round);
  // Rank `rank` proposes the members it counted in shrink `round`; what is known of rank q's proposal.
  void propose(int rank, std::uint64_t round, members_digest members);
  member_news proposal_of(int q, std::uint64_t round);
  // The world of the ranks staying in shrink `round`, shared by them.
  std::shared_ptr<world> survivors_world(std::uint64_t round, int members);

  // Posts a message, completing it (and its partner) at once if its partner is already waiting.
  void post(const message_ptr& m);

  // Takes back a message nobody matched yet, so that nothing is read from or written into its
  // memory later; true if it was still unmatched.
  bool withdraw(const message_ptr& m);

  waiter& waiter_of(int rank) noexcept { return waiters_[static_cast<std::size_t>(rank)]; }

  // The world that ranks of this one calling their n-th split with `color` share. Every rank
  // calls it once per split; the first member creates it. A rank left out (no_color) gets none,
  // but its split is counted, so that its next split meets the others'.
  std::shared_ptr<world> split_world(int rank, int color, int members);

  // The world every rank's n-th renew() shares: the same ranks, with nothing in flight.
  std::shared_ptr<world> renewed_world(int rank);

 private:
  using pending = std::map<std::pair<int, int>, std::pair<std::shared_ptr<world>, int>>;

  std::shared_ptr<world> shared_world(pending& table, std::pair<int, int> key, int members);

  void wake_all();

  static void transfer(message& send, message& receive);

  void complete(message& m);

  int size_;
  std::deque<mailbox> boxes_;  // deque: mutexes neither copy nor move
  std::deque<waiter> waiters_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> events_{false};  // some rank aborted or departed
  std::mutex registry_mutex_;
  std::string failure_;
  std::vector<int> splits_;
  std::vector<int> renewals_;
  std::vector<std::uint64_t> aborted_at_;
  std::vector<std::string> abort_reasons_;
  std::vector<std::uint64_t> departed_at_;
  std::vector<std::uint64_t> present_in_;
  std::vector<std::pair<std::uint64_t, members_digest>> proposals_;
  pending pending_splits_;
  pending pending_shrinks_;
  std::vector<std::weak_ptr<world>> children_;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE world::world(int size)
    : size_(size), boxes_(static_cast<std::size_t>(size)), waiters_(static_cast<std::size_t>(size)),
      splits_(static_cast<std::size_t>(size), 0), renewals_(static_cast<std::size_t>(size), 0),
      aborted_at_(static_cast<std::size_t>(size), never), abort_reasons_(static_cast<std::size_t>(size)),
      departed_at_(static_cast<std::size_t>(size), never), present_in_(static_cast<std::size_t>(size), 0),
      proposals_(static_cast<std::size_t>(size)) {}

HERD_SEPARATE std::string world::failure() {
  std::lock_guard lock(registry_mutex_);
  return failure_;
}

HERD_SEPARATE void world::wake_all() {
  for (auto& w : waiters_) {
    { std::lock_guard lock(w.mutex); }
    w.wake.notify_all();
  }
}

HERD_SEPARATE void world::transfer(message& send, message& receive) {
  if (send.bytes > receive.bytes) {
    const std::string what = "a message of " + std::to_string(send.bytes) + " bytes from rank " +
                             std::to_string(send.owner) + " does not fit the " + std::to_string(receive.bytes) +
                             "-byte receive buffer of rank " + std::to_string(receive.owner);
    send.failure = what;
    receive.failure = what;
    return;
  }
  if (send.bytes != 0) std::memcpy(receive.receive_data, send.send_data, send.bytes);
}

HERD_SEPARATE void world::fail(const std::string& reason) {
  std::vector<std::shared_ptr<world>> children;
  {
    // Under the registry lock, so that a world split from this one right now sees the flag.
    std::lock_guard lock(registry_mutex_);
    if (failure_.empty()) failure_ = reason;
    failed_.store(true, std::memory_order_release);
    for (auto& weak : children_)
      if (auto child = weak.lock()) children.push_back(std::move(child));
  }
  wake_all();
  for (auto& child : children) child->fail(reason);
}

HERD_SEPARATE void world::abort_operation(int rank, std::uint64_t seq, const std::string& reason) {
  {
    std::lock_guard lock(registry_mutex_);
    auto& at = aborted_at_[static_cast<std::size_t>(rank)];
    if (at == never) {
      at = seq;
      abort_reasons_[static_cast<std::size_t>(rank)] = reason;
    }
    events_.store(true, std::memory_order_release);
  }
  wake_all();
}

HERD_SEPARATE void world::depart(int rank, std::uint64_t issued) {
  {
    std::lock_guard lock(registry_mutex_);
    departed_at_[static_cast<std::size_t>(rank)] = issued;
    events_.store(true, std::memory_order_release);
  }
  wake_all();
}

HERD_SEPARATE std::string world::hopeless(int me, const op_label& label) {
  if (!events_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(registry_mutex_);
  return hopeless_wait(
      size_, me, label.seq,
      [&](int q) {
        const auto at = static_cast<std::size_t>(q);
        return peer_news{departed_at_[at], aborted_at_[at], abort_reasons_[at]};
      },
      [](int q) { return q; }, label.str(), [](std::uint64_t at) { return "its operation #" + std::to_string(at); });
}

HERD_SEPARATE void world::stay(int rank, std::uint64_t round) {
  {
    std::lock_guard lock(registry_mutex_);
    present_in_[static_cast<std::size_t>(rank)] = round;
  }
  wake_all();
}

HERD_SEPARATE std::vector<int> world::staying(std::uint64_t round) {
  std::lock_guard lock(registry_mutex_);
  std::vector<int> result(static_cast<std::size_t>(size_), -1);
  for (std::size_t q = 0; q < result.size(); ++q) result[q] = staying_answer(present_in_[q], departed_at_[q] != never, round);
  return result;
}

HERD_SEPARATE void world::propose(int rank, std::uint64_t round, members_digest members) {
  {
    std::lock_guard lock(registry_mutex_);
    proposals_[static_cast<std::size_t>(rank)] = {round, members};
  }
  wake_all();
}

HERD_SEPARATE member_news world::proposal_of(int q, std::uint64_t round) {
  std::lock_guard lock(registry_mutex_);
  const auto& [proposed_in, proposal] = proposals_[static_cast<std::size_t>(q)];
  return {departed_at_[static_cast<std::size_t>(q)] != never, proposed_in == round, proposal};
}

HERD_SEPARATE std::shared_ptr<world> world::survivors_world(std::uint64_t round, int members) {
  std::lock_guard lock(registry_mutex_);
  return shared_world(pending_shrinks_, std::make_pair(static_cast<int>(round), 0), members);
}

HERD_SEPARATE void world::post(const message_ptr& m) {
  mailbox& box = boxes_[static_cast<std::size_t>(m->receiving ? m->owner : m->peer)];
  message_ptr partner;
  {
    std::lock_guard lock(box.mutex);
    auto& partners = m->receiving ? box.sends : box.receives;
    auto& mine = m->receiving ? box.receives : box.sends;
    // A receive matches the oldest send from its peer; a send, the oldest receive expecting it.
    auto match = std::find_if(partners.begin(), partners.end(), [&](const message_ptr& other) {
      return other->tag == m->tag && (m->receiving ? other->owner == m->peer : other->peer == m->owner);
    });
    if (match == partners.end()) {
      mine.push_back(m);
      return;
    }
    partner = *match;
    partners.erase(match);
    transfer(m->receiving ? *partner : *m, m->receiving ? *m : *partner);
  }
  complete(*partner);
  complete(*m);
}

HERD_SEPARATE bool world::withdraw(const message_ptr& m) {
  mailbox& box = boxes_[static_cast<std::size_t>(m->receiving ? m->owner : m->peer)];
  std::lock_guard lock(box.mutex);
  auto& mine = m->receiving ? box.receives : box.sends;
  auto it = std::find(mine.begin(), mine.end(), m);
  if (it == mine.end()) return false;
  mine.erase(it);
  return true;
}

HERD_SEPARATE std::shared_ptr<world> world::split_world(int rank, int color, int members) {
  std::lock_guard lock(registry_mutex_);
  const int n = splits_[static_cast<std::size_t>(rank)]++;
  if (color == no_color) return nullptr;
  return shared_world(pending_splits_, std::make_pair(n, color), members);
}

HERD_SEPARATE std::shared_ptr<world> world::renewed_world(int rank) {
  std::lock_guard lock(registry_mutex_);
  return shared_world(pending_splits_, std::make_pair(renewals_[static_cast<std::size_t>(rank)]++, -1), size_);
}

HERD_SEPARATE std::shared_ptr<world> world::shared_world(pending& table, std::pair<int, int> key, int members) {
  auto& entry = table[key];
  if (!entry.first) {
    entry.first = std::make_shared<world>(members);
    entry.second = members;
    children_.push_back(entry.first);
    if (failed()) entry.first->fail(failure_);
  }
  auto result = entry.first;
  if (--entry.second == 0) table.erase(key);
  return result;
}

HERD_SEPARATE void world::complete(message& m) {
  waiter& w = waiter_of(m.owner);
  {
    std::lock_guard lock(w.mutex);
    m.done = true;
  }
  w.wake.notify_all();
}

#endif

}  // namespace detail::local

class local_communicator {
 public:
  // A pending isend or irecv. Destroying one that is still pending withdraws it, so that nothing
  // is read from or written into its memory afterwards.
  class request {
   public:
    request() = default;
    request(request&&) noexcept = default;
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        world_ = std::move(other.world_);
        message_ = std::move(other.message_);
      }
      return *this;
    }
    ~request() { release(); }

    bool pending() const noexcept { return message_ != nullptr; }

   private:
    friend class local_communicator;
    void release() noexcept {
      if (message_) world_->withdraw(message_);
      message_.reset();
    }
    std::shared_ptr<detail::local::world> world_;
    detail::local::message_ptr message_;
  };

  // Rank `rank` of the world `w`; local::run makes these. Creating one is an operation: all ranks
  // of `w` create theirs together.
  local_communicator(std::shared_ptr<detail::local::world> w, int rank, comm_options options = {})
      : local_communicator(std::move(w), rank, options, nullptr) {}

  local_communicator(local_communicator&& other) noexcept { take(other); }
  local_communicator& operator=(local_communicator&& other) noexcept {
    if (this != &other) {
      leave();
      take(other);
    }
    return *this;
  }
  local_communicator(const local_communicator&) = delete;
  local_communicator& operator=(const local_communicator&) = delete;
  // Waits for this rank's queued operations, then tells the other ranks it has left.
  ~local_communicator() { leave(); }

  // A rank left out of a split gets a communicator it is not a member of: rank -1, size 0.
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return world_ ? world_->size() : member_ ? 1 : 0; }
  bool is_member() const noexcept { return member_; }
  const comm_options& options() const { return state().options(); }
  bool supports(device d) const noexcept { return d.is_cpu(); }
  detail::operation_state& operations() { return state(); }

  request isend(const void* data, std::size_t bytes, int peer, int tag);

  request irecv(void* data, std::size_t bytes, int peer, int tag);

  bool test(request& r);

  void wait(request& r);

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
  // rank passing herd::no_color gets one it is not a member of. An operation of this
  // communicator: every rank calls it.
  local_communicator split(int color, int key) const { return split_by(detail::op_kind::split, {color, key}, {}); }

  // The listed ranks, in the order listed, as a new communicator (Horovod's process set); the
  // others get one they are not members of. Every rank calls it, with the same list.
  local_communicator subset(const std::vector<int>& ranks) const;

  // A new communicator of the same ranks, with nothing in flight: how ranks go on after an
  // abort (as ncclCommAbort followed by a new ncclCommInitRank). Every rank calls it.
  // The ranks must have completed the same operations of this one (the failed operation may have
  // succeeded on some ranks before others gave up): if not, it raises on every rank, naming each
  // rank's last; renew(options, herd::rolled_back) is for ranks brought back to one state first.
  local_communicator renew() const { return renew(options()); }
  local_communicator renew(const comm_options& options) const;
  local_communicator renew(const comm_options& options, rolled_back_t) const;

  // A new communicator of the ranks that are still here, renumbered in their order here: how the
  // others go on when ranks left (their function returned, or they destroyed or left() their
  // communicator). Every staying rank calls it; as renew(options, herd::rolled_back), the caller
  // brings the ranks back to one state. The ranks agree on who stays, in two steps under the
  // watchdog (comm/detail/failure.hpp): each says it is here and waits until every rank has either
  // said so or left; then each proposes the ranks it counted and waits until all of them proposed
  // the same, or raises.
  local_communicator shrink() const { return shrink(options()); }
  local_communicator shrink(const comm_options& options) const;

  // Tells the other ranks that this rank leaves (as destroying the communicator does), after its
  // queued operations; the communicator is then empty, as one moved from. Their waits for this
  // rank raise at once, and they go on without it with shrink().
  void leave() noexcept;

  // Aborts the running operation: tells the peers (their waits for this rank raise at once). A
  // request of the operation still pending is withdrawn when its owner destroys it.
  void abort(std::string_view reason) noexcept;

 private:
  // `renewed`: this rank's last completed operation of the communicator it renews, or null.
  local_communicator(std::shared_ptr<detail::local::world> w, int rank, const comm_options& options,
                     const detail::op_label* renewed);
  struct adopt_tag {};
  local_communicator(std::shared_ptr<detail::local::world> w, int rank, const comm_options& options, adopt_tag);
  struct outside_tag {};
  explicit local_communicator(outside_tag) : rank_(-1), member_(false) {}

  // split and subset: a split operation of this communicator with this rank's request.
  local_communicator split_by(detail::op_kind kind, const detail::split_request& mine, std::span<const int> ranks) const;

  void take(local_communicator& other) noexcept;

  detail::error_site site() const { return detail::site_of(*ops_, "local_communicator", rank_, size()); }

  detail::operation_state& state() const {
    if (!member_) detail::raise_not_member("local_communicator");
    if (!ops_) {
      throw error("herd::local_communicator: this communicator is empty: it was moved from, or left (leave()). Use "
                  "the one it was moved to, or create a new one.");
    }
    return *ops_;
  }

  detail::local::message_ptr make_message(std::size_t bytes, int peer, int tag, bool receiving) const;

  request start(detail::local::message_ptr m);

  void finish(request& r);

  // The watched wait of this rank's shrink(): until done(), woken by any news of the world (or
  // every 20 ms: done() reads the news outside the waiter's mutex, so one may come unnoticed
  // between), raising at the first wake-up after local::run's failure, with the watchdog of
  // `options` saying what() it waits for.
  template <class Done, class What>
  void watched_wait(const comm_options& options, const detail::error_site& site, Done done, What what) const {
    detail::local::waiter& w = world_->waiter_of(rank_);
    detail::watched_wait(
        options, site,
        [&] {
          if (done()) return true;
          if (world_->failed()) fail_with_world();
          return false;
        },
        [] {}, what, detail::woken(w.mutex, w.wake, std::chrono::milliseconds(20), [] { return false; }));
  }

  [[noreturn]] void fail_with_world() const {
    detail::raise(site(), "stopped because " + world_->failure(), "See the first exception, which local::run rethrows");
  }

  std::shared_ptr<detail::local::world> world_;
  int rank_ = 0;
  bool member_ = true;
  mutable std::uint64_t shrinks_ = 0;  // shrink() calls on this communicator
  std::unique_ptr<detail::operation_state> ops_;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE local_communicator::local_communicator(std::shared_ptr<detail::local::world> w, int rank,
                                                     const comm_options& options, adopt_tag)
    : world_(std::move(w)), rank_(rank), ops_(std::make_unique<detail::operation_state>(options)) {}

HERD_SEPARATE void local_communicator::take(local_communicator& other) noexcept {
  if (other.ops_) other.ops_->drain();  // queued operations refer to the object that queued them
  world_ = std::move(other.world_);
  rank_ = other.rank_;
  member_ = other.member_;
  shrinks_ = other.shrinks_;
  ops_ = std::move(other.ops_);
}

HERD_SEPARATE local_communicator::local_communicator(std::shared_ptr<detail::local::world> w, int rank,
                                                   const comm_options& options, const detail::op_label* renewed)
    : world_(std::move(w)), rank_(rank), ops_(std::make_unique<detail::operation_state>(options)) {
  detail::agree_creation(*this, runtime::defaults().problem, renewed);
}

HERD_SEPARATE local_communicator::request local_communicator::isend(const void* data, std::size_t bytes, int peer, int tag) {
  detail::check_buffer("isend", rank_, size(), data, bytes);
  auto m = make_message(bytes, peer, tag, false);
  m->send_data = data;
  return start(std::move(m));
}

HERD_SEPARATE local_communicator::request local_communicator::irecv(void* data, std::size_t bytes, int peer, int tag) {
  detail::check_buffer("irecv", rank_, size(), data, bytes);
  auto m = make_message(bytes, peer, tag, true);
  m->receive_data = data;
  return start(std::move(m));
}

HERD_SEPARATE bool local_communicator::test(request& r) {
  if (!r.pending()) return true;
  (void)state();  // a communicator left is an error, not a crash
  {
    std::lock_guard lock(world_->waiter_of(rank_).mutex);
    if (!r.message_->done) {
      if (world_->failed()) fail_with_world();
      return false;
    }
  }
  finish(r);
  return true;
}

HERD_SEPARATE void local_communicator::wait(request& r) {
  if (!r.pending()) return;
  (void)state();  // a communicator left is an error, not a crash
  {
    // Inside an operation, time spent here is a phase of it in the timeline.
    const detail::trace::span phase(ops_->track(),
                                    ops_->in_operation() ? (r.message_->receiving ? "wait to receive" : "wait to send") : nullptr,
                                    {.extra_name = "peer", .extra = r.message_->peer});
    detail::local::waiter& w = world_->waiter_of(rank_);
    // Asleep until this rank's waiter is woken: by the message, by news that it never comes (a
    // failed world, a peer's abort or departure: check_peers raises, at the first wake-up after
    // it), or by other traffic on the waiter (a progress thread's messages).
    auto in_vain = [&] {
      return world_->failed() || (ops_->in_operation() && !world_->hopeless(rank_, ops_->current()).empty());
    };
    detail::watched_wait(
        options(), site(),
        [&] {
          {
            std::lock_guard lock(w.mutex);
            if (r.message_->done) return true;
          }
          if (in_vain()) check_peers();
          return false;
        },
        [] {}, [&] { return detail::waiting_for(*ops_, r.message_->peer, r.message_->receiving, r.message_->tag); },
        detail::woken(w.mutex, w.wake, std::chrono::milliseconds(250), [&] { return r.message_->done || in_vain(); }));
  }
  finish(r);
}

HERD_SEPARATE void local_communicator::check_peers() {
  state();
  if (world_->failed()) fail_with_world();
  if (!ops_->in_operation()) return;
  if (std::string why = world_->hopeless(rank_, ops_->current()); !why.empty()) {
    detail::raise(site(), why, "");
  }
}

HERD_SEPARATE local_communicator local_communicator::subset(const std::vector<int>& ranks) const {
  return split_by(detail::op_kind::subset, detail::subset_request(ranks, rank_), ranks);
}

HERD_SEPARATE local_communicator local_communicator::renew(const comm_options& options) const {
  state().drain();  // queued operations first: they decide which operation completed last
  const detail::op_label last = ops_->last_completed();
  return local_communicator(world_->renewed_world(rank_), rank_, options, &last);
}

HERD_SEPARATE local_communicator local_communicator::renew(const comm_options& options, rolled_back_t) const {
  state().drain();
  return local_communicator(world_->renewed_world(rank_), rank_, options, nullptr);
}

HERD_SEPARATE local_communicator local_communicator::shrink(const comm_options& options) const {
  state().drain();
  const std::uint64_t round = ++shrinks_;
  const detail::error_site site{"local_communicator::shrink", rank_, size()};
  world_->stay(rank_, round);
  std::vector<int> staying = world_->staying(round);
  auto unknown = [&] { return static_cast<int>(std::find(staying.begin(), staying.end(), -1) - staying.begin()); };
  watched_wait(options, site, [&] {
    staying = world_->staying(round);
    return unknown() == size();
  }, [&] { return "for rank " + std::to_string(unknown()) + " to say whether it stays or left"; });
  const std::vector<int> members = detail::staying_members(staying);
  const detail::members_digest mine = detail::members_digest::of(members);
  world_->propose(rank_, round, mine);
  detail::members_state agreed;
  watched_wait(options, site, [&] {
    agreed = detail::members_verdict(members, rank_, mine, [&](int q) { return world_->proposal_of(q, round); });
    return agreed.waiting_for < 0 || !agreed.problem.empty();
  }, [&] { return "for rank " + std::to_string(agreed.waiting_for) + " to say which ranks it counted as staying"; });
  if (!agreed.problem.empty()) detail::raise(site, agreed.problem, detail::shrink_advice());
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  return local_communicator(world_->survivors_world(round, static_cast<int>(members.size())), new_rank, options, nullptr);
}

HERD_SEPARATE void local_communicator::leave() noexcept {
  if (!ops_) return;
  ops_->drain();
  world_->depart(rank_, ops_->issued());
  ops_.reset();
}

HERD_SEPARATE void local_communicator::abort(std::string_view reason) noexcept {
  if (!ops_) return;
  ops_->mark_aborted(reason);
  try {
    world_->abort_operation(rank_, ops_->first_unfinished(), std::string(reason));
  } catch (...) {
    world_->fail("a rank could not record an abort (out of memory)");
  }
}

HERD_SEPARATE local_communicator local_communicator::split_by(detail::op_kind kind, const detail::split_request& mine,
                                                            std::span<const int> ranks) const {
  auto& self = const_cast<local_communicator&>(*this);
  std::shared_ptr<detail::local::world> part;
  int new_rank = -1;
  detail::run_operation(self, {kind}, [&] {
    const std::vector<detail::split_request> all = detail::agree_split(self, mine, ranks);
    const std::vector<int> members = detail::split_members(all, mine.color);
    new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    part = world_->split_world(rank_, mine.color, static_cast<int>(members.size()));
  });
  if (!part) return local_communicator(outside_tag{});
  return local_communicator(std::move(part), new_rank, options(), adopt_tag{});
}

HERD_SEPARATE detail::local::message_ptr local_communicator::make_message(std::size_t bytes, int peer, int tag,
                                                                        bool receiving) const {
  state();
  detail::check_peer(receiving ? "irecv" : "isend", rank_, size(), peer);
  detail::check_tag(receiving ? "irecv" : "isend", rank_, size(), tag);
  if (world_->failed()) fail_with_world();
  if (ops_->aborted() && !ops_->in_operation()) ops_->raise_aborted(receiving ? "irecv" : "isend", rank_, size());
  auto m = std::make_shared<detail::local::message>();
  m->bytes = bytes;
  m->owner = rank_;
  m->peer = peer;
  m->tag = tag;
  m->receiving = receiving;
  return m;
}

HERD_SEPARATE local_communicator::request local_communicator::start(detail::local::message_ptr m) {
  world_->post(m);
  request r;
  r.world_ = world_;
  r.message_ = std::move(m);
  return r;
}

HERD_SEPARATE void local_communicator::finish(request& r) {
  auto m = std::move(r.message_);
  if (!m->failure.empty()) {
    detail::raise({m->receiving ? "irecv" : "isend", rank_, size()}, m->failure,
                  "Post receive buffers at least as large as the messages sent to them");
  }
}

#endif

namespace local {

// Runs fn(local_communicator&) on n threads, one per rank, and returns when all have finished.
// The first exception thrown on any rank is rethrown here; the others ranks are released from
// their waits with herd::error so that none is left blocked.
template <class Fn> void run(int n, Fn&& fn, comm_options options = {}) {
  if (n < 1) {
    throw error("herd::local::run: the number of ranks is " + std::to_string(n) + ". Ask for at least 1.");
  }
  auto w = std::make_shared<detail::local::world>(n);
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(n));
  std::atomic<int> first_failure{-1};
  auto body = [&](int rank) {
    // Destroyed after the failure is recorded, so that the others learn of the failure rather
    // than of a departure.
    std::optional<local_communicator> comm;
    try {
      comm.emplace(w, rank, options);
      fn(*comm);
    } catch (...) {
      failures[static_cast<std::size_t>(rank)] = std::current_exception();
      int none = -1;
      if (first_failure.compare_exchange_strong(none, rank)) {
        std::string what = "rank " + std::to_string(rank) + " failed";
        try {
          throw;
        } catch (const std::exception& e) {
          what += ": ";
          what += e.what();
        } catch (...) {
        }
        w->fail(what);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  try {
    for (int rank = 1; rank < n; ++rank) threads.emplace_back(body, rank);
  } catch (...) {
    w->fail("local::run could not start a thread");
    for (auto& t : threads) t.join();
    throw;
  }
  body(0);  // rank 0 runs on the calling thread
  for (auto& t : threads) t.join();
  if (first_failure >= 0) std::rethrow_exception(failures[static_cast<std::size_t>(first_failure.load())]);
}

}  // namespace local
}  // namespace herd

#endif  // HERD_COMM_LOCAL_HPP
