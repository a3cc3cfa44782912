#ifndef HERD_OPTIM_DETAIL_JOIN_HPP
#define HERD_OPTIM_DETAIL_JOIN_HPP
// Uneven inputs (optimizer_options::uneven_inputs), as PyTorch's Join/Joinable/JoinHook: ranks
// may run out of batches at different steps. Every reducing step of a rank still training first
// agrees on who trains (join_roster::agree, one byte per rank); a rank with no batches left calls
// join(), which agrees with them round after round and, in each round, has every registered
// join_hook shadow the collectives its owner's step runs on the other ranks (with nothing to
// contribute), until every rank has joined.
//
// The byte also says how the ranks still training reduce in this round (join_mode), so that a
// joined rank runs the same collectives: at step() or in buckets during the backward pass.

#include <herd/collectives/allgather.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// A rank's word in each agreement (the largest over the ranks wins).
// no_reduction: a forward pass that no reduction follows (DDP's no_sync()); the joined ranks
// shadow what comes before the reduction only. first_check: distributed_optimizer's first backward
// pass, held back (backward_passes_per_step, no_sync), which checks the gradients on every rank
// (detail/gradient_checks.hpp) and reduces nothing; the joined ranks make that check with it.
enum class join_mode : std::uint8_t { joined = 0, no_reduction = 1, first_check = 2, at_step = 3, in_buckets = 4 };

// What a joined rank runs, for one joinable, in each round the others still train.
class join_hook {
 public:
  virtual ~join_hook() = default;
  // The ranks still training reduce `how` in this round: run the same collectives, with zeros.
  virtual void shadow(join_mode how) = 0;
};

// Who still trains, as the last agreement found.
class join_roster {
 public:
  // Every rank says how it reduces in this step (joined: not at all). Returns the largest mode
  // (joined: every rank has joined), remembering how many still train and the highest of them
  // (the last to join, once they all have).
  template <communicator C> join_mode agree(C& comm, join_mode mine) {
    const std::vector<std::uint8_t> word = {static_cast<std::uint8_t>(mine)};
    std::vector<std::uint8_t> all(static_cast<std::size_t>(comm.size()));
    herd::allgather(word, all, control_of(comm));
    int count = 0, highest = -1, largest = 0;
    for (int r = 0; r < comm.size(); ++r) {
      const int m = all[static_cast<std::size_t>(r)];
      if (m != 0) ++count, highest = r;
      largest = std::max(largest, m);
    }
    if (count > 0) {
      active_ranks_ = count;
      last_joined_ = highest;
    }
    return static_cast<join_mode>(largest);
  }

  // Ranks training in the last reducing step (0: none agreed yet), and the highest of them.
  int active_ranks() const noexcept { return active_ranks_; }
  int last_joined() const noexcept { return last_joined_; }
  // In join(): this rank's steps are shadows, agreed already.
  bool joined() const noexcept { return joined_; }

  // This rank has joined: shadows the others' rounds with `hooks` until every rank has joined.
  // Returns the last rank to join.
  template <communicator C> int join(C& comm, std::span<join_hook* const> hooks) {
    joined_ = true;
    try {
      for (join_mode how = agree(comm, join_mode::joined); how != join_mode::joined; how = agree(comm, join_mode::joined)) {
        for (join_hook* hook : hooks) hook->shadow(how);
      }
    } catch (...) {
      joined_ = false;
      throw;
    }
    joined_ = false;
    return last_joined_;
  }

 private:
  int active_ranks_ = 0;
  int last_joined_ = -1;
  bool joined_ = false;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_JOIN_HPP
