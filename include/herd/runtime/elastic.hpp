#ifndef HERD_RUNTIME_ELASTIC_HPP
#define HERD_RUNTIME_ELASTIC_HPP
// Training that rolls back and goes on after a failure, as Horovod elastic's State and run do.
//
// A failure inside an operation aborts the communicator, and the ranks' outcomes of that operation
// may differ (a rank that gave up may have sent all a peer needed, so the peer completed it): going
// on from where each rank stands would mix their steps. So every rank goes back to one state. An
// elastic_state references what a step changes (parameters, optimizer state, a sampler's position,
// the step counter, any value of the loop) and keeps an in-memory copy of it at every commit();
// run_elastic(comm, state, fn) calls fn(comm), and when it raises herd::error renews the
// communicator, agrees with the other ranks on the last commit they all hold, writes it back on
// every rank and calls fn again, which goes on from there.
//
// Every rank commits after the same steps. A rank can be at most one commit ahead of another (it
// completed the operation the other failed in, and committed after it), so each keeps its last two
// commits, and the ranks take the oldest last commit among them.
//
// A rank that leaves (returns, raises an exception other than herd::error, leaves its
// communicator) makes the others fail too; they then shrink the communicator to the ranks still
// there (as Horovod elastic's reset), agree on the commit, restore it and call the state's
// on_world_change callbacks, which re-shard the data (distributed_sampler::reshard) and rescale
// what depends on the number of ranks, before fn goes on at the smaller size.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/comm/detail/failure.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/std.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string_view>
#include <string>
#include <type_traits>
#include <vector>

namespace herd {

class elastic_state {
 public:
  // What a rollback writes back: `bytes` at `data`, which must stay there while the state is used.
  void track(void* data, std::size_t bytes);
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void track(T& value) {
    track(&value, sizeof value);
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void track(std::vector<T>& values) {
    track(values.data(), values.size() * sizeof(T));
  }
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void track(std::span<T> values) {
    track(values.data(), values.size_bytes());
  }

  // Copies everything tracked, as commit number commits() + 1.
  void commit();

  // Called, in the order given, after a rollback to a commit made at another number of ranks than
  // the communicator now has, with that number and the new one; the tracked memory holds the
  // agreed commit then, and the communicator is the new one (its rank() is this rank's new rank).
  void on_world_change(std::function<void(int old_size, int new_size)> fn);
  void world_changed(int old_size, int new_size) const;

  // The commits made so far (the last one's number).
  std::uint64_t commits() const noexcept { return commits_; }

  // The number of ranks commit `id` (this rank's last or the one before) was made at; 0 for one
  // made before run_elastic told the state (in_world).
  int world_size_at(std::uint64_t id) const noexcept { return ids_[id % 2] == id ? sizes_[id % 2] : 0; }
  // run_elastic's: the number of ranks that train from now on. Commits made before it was known
  // are taken to be of this one.
  void in_world(int size) noexcept {
    world_size_ = size;
    for (int& s : sizes_) s = s == 0 ? size : s;
  }

  // Writes commit `id` back; it must be this rank's last or the one before.
  void restore(std::uint64_t id);

 private:
  struct region {
    std::byte* data;
    std::size_t bytes;
  };
  std::size_t total_bytes() const noexcept {
    std::size_t n = 0;
    for (const region& r : regions_) n += r.bytes;
    return n;
  }

  std::vector<region> regions_;
  std::vector<std::byte> copies_[2];  // the commits with even and odd numbers
  std::uint64_t ids_[2] = {0, 0};
  int sizes_[2] = {0, 0};  // the number of ranks of each commit: what a rollback restores is of that world
  int world_size_ = 0;
  std::uint64_t commits_ = 0;
  std::vector<std::function<void(int, int)>> world_changes_;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void elastic_state::track(void* data, std::size_t bytes) {
  regions_.push_back({static_cast<std::byte*>(data), bytes});
}

HERD_SEPARATE void elastic_state::commit() {
  const std::uint64_t id = commits_ + 1;
  std::vector<std::byte>& copy = copies_[id % 2];
  copy.resize(total_bytes());
  std::size_t at = 0;
  for (const region& r : regions_) {
    if (r.bytes != 0) std::memcpy(copy.data() + at, r.data, r.bytes);
    at += r.bytes;
  }
  ids_[id % 2] = id;
  sizes_[id % 2] = world_size_;
  commits_ = id;
}

HERD_SEPARATE void elastic_state::on_world_change(std::function<void(int old_size, int new_size)> fn) {
  world_changes_.push_back(std::move(fn));
}

HERD_SEPARATE void elastic_state::world_changed(int old_size, int new_size) const {
  for (const auto& fn : world_changes_) fn(old_size, new_size);
}

HERD_SEPARATE void elastic_state::restore(std::uint64_t id) {
  if (id == 0 || ids_[id % 2] != id || copies_[id % 2].size() != total_bytes()) {
    throw error("herd::elastic_state: this rank cannot go back to commit #" + std::to_string(id) + ": it holds #" +
                std::to_string(ids_[commits_ % 2]) + " and #" + std::to_string(ids_[(commits_ + 1) % 2]) +
                ". Commit on every rank after the same steps, and track the same things before the first commit.");
  }
  const std::vector<std::byte>& copy = copies_[id % 2];
  std::size_t at = 0;
  for (const region& r : regions_) {
    if (r.bytes != 0) std::memcpy(r.data, copy.data() + at, r.bytes);
    at += r.bytes;
  }
  commits_ = id;
}

#endif  // HERD_SEPARATE_DEFINITIONS

namespace detail {

// A failure that reached run_elastic outside any operation (fn raised between collectives, or an
// error of this rank's own) has told no peer: they would wait for this rank in their next
// operation until the watchdog gives up. Aborting the communicator tells them at once, so that
// every rank goes on to the renewal or shrink together. A failure inside an operation aborted it
// already. Queued operations run first, so that the abort names the first one this rank has not
// completed.
template <communicator C> void announce_failure(C& comm, std::string_view what) noexcept {
  try {
    if constexpr (requires { comm.is_member(); }) {
      if (!comm.is_member()) return;
    }
    if (comm.size() <= 1) return;
    operation_state& ops = comm.operations();
    ops.drain();
    if (ops.aborted()) return;
    comm.abort(std::string("it raised outside any operation: ") + std::string(what.substr(0, 900)));
  } catch (...) {
    // A communicator moved from, or no memory for the words: the peers' watchdog tells them.
  }
}

}  // namespace detail

// Calls fn(comm) until it returns. When it raises herd::error (a stall past the shutdown time, a
// failure inside an operation, a peer's abort, or one raised between operations on one rank: its
// peers are told by an abort of the communicator), every rank renews `comm` (in place), agrees on the
// last commit every rank holds and restores it, and calls fn again; after `max_failures` failures
// the error is rethrown. It commits `state` first if nothing was committed yet. Errors every rank
// raises alike in an agreement (bad arguments) are rethrown at once: a retry would repeat them; so
// are exceptions that are not herd::error, after the abort that tells the peers (the rank then
// leaves when its communicator is destroyed, and the others shrink without it). Where the communicator can shrink() (MPI, local), the
// ranks that left are left out of the new one, and the state's world-change callbacks run.
template <communicator C, class Fn>
void run_elastic(C& comm, elastic_state& state, Fn&& fn, int max_failures = 16) {
  state.in_world(static_cast<int>(comm.size()));
  if (state.commits() == 0) state.commit();
  for (int failures = 0;; ++failures) {
    try {
      fn(comm);
      return;
    } catch (const detail::agreed_error&) {
      throw;
    } catch (const error& e) {
      detail::announce_failure(comm, e.what());
      if (failures >= max_failures) throw;
    } catch (const std::exception& e) {
      detail::announce_failure(comm, e.what());
      throw;
    } catch (...) {
      detail::announce_failure(comm, "an exception that is not a std::exception");
      throw;
    }
    if constexpr (requires { comm.shrink(comm.options()); }) {
      comm = comm.shrink(comm.options());
    } else {
      comm = comm.renew(comm.options(), rolled_back);
    }
    std::vector<std::int64_t> last{static_cast<std::int64_t>(state.commits())};
    allreduce(last, comm, reduce_op::min);
    const auto agreed = static_cast<std::uint64_t>(last[0]);
    state.restore(agreed);
    // What was restored is of the world that commit was made at, which may be larger than the one
    // before this failure: a shrink since that commit, then a failure before the next one.
    const int committed_at = state.world_size_at(agreed);
    const int now = static_cast<int>(comm.size());
    state.in_world(now);
    if (committed_at != now) state.world_changed(committed_at, now);
  }
}

}  // namespace herd

#endif  // HERD_RUNTIME_ELASTIC_HPP
