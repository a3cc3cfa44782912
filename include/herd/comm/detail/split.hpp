#ifndef HERD_COMM_DETAIL_SPLIT_HPP
#define HERD_COMM_DETAIL_SPLIT_HPP
// The agreement of split() and subset() (a split by a list of ranks): every rank learns every
// rank's color and key before anything is made, so that a bad color on one rank, or lists of ranks
// that differ, raise herd::error on every rank instead of leaving the others in MPI_Comm_split.

#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/operation.hpp>
#include <herd/core/config.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace herd::detail {

// What one rank asks of a split, as the others see it.
struct split_request {
  std::int32_t color = 0;
  std::int32_t key = 0;
  std::uint64_t list = 0;  // subset: a hash of its list of ranks, which must be the same on every rank
};

// subset(ranks) as a split: a listed rank takes color 0 and its place in the list as key, so the
// new ranks follow the list's order; a rank not listed takes no_color.
HERD_SEPARATE split_request subset_request(std::span<const int> ranks, int rank);

// The agreement of the running split or subset operation of comm: every rank's request, once
// they are known to be valid. `ranks` is a subset's list (ignored by split).
template <class C>
std::vector<split_request> agree_split(C& comm, const split_request& mine, std::span<const int> ranks) {
  const exchanged all = agree_identity(comm, &mine, sizeof mine);
  const int n = comm.size();
  const bool subset = comm.operations().current().kind == op_kind::subset;
  const error_site site{subset ? "subset" : "split", comm.rank(), n};
  std::vector<split_request> requests(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) std::memcpy(&requests[static_cast<std::size_t>(r)], all.payload(r), sizeof(split_request));
  if (!subset) {
    for (int r = 0; r < n; ++r) {
      const int color = requests[static_cast<std::size_t>(r)].color;
      if (color < 0 && color != no_color) {
        raise_agreed(site, "rank " + std::to_string(r) + " passed the negative color " + std::to_string(color),
                     "Pass a color >= 0 on every rank, or herd::no_color to leave a rank out; ranks with equal colors "
                     "end up in the same communicator");
      }
    }
    return requests;
  }
  for (int r = 1; r < n; ++r) {
    if (requests[static_cast<std::size_t>(r)].list != requests[0].list) {
      raise_agreed(site, "the list of ranks differs across ranks (rank " + std::to_string(r) + "'s is not rank 0's)",
                   "Pass the same list of ranks on every rank, the ranks left out included");
    }
  }
  // The same list on every rank: what is wrong with it, every rank sees alike.
  if (ranks.empty()) raise_agreed(site, "the list of ranks is empty", "List at least one rank");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= n) {
      raise_agreed(site, "the list of ranks names rank " + std::to_string(ranks[i]) + ", which is out of range",
                   "List ranks in [0, " + std::to_string(n) + ")");
    }
    if (std::find(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(i), ranks[i]) !=
        ranks.begin() + static_cast<std::ptrdiff_t>(i)) {
      raise_agreed(site, "the list of ranks names rank " + std::to_string(ranks[i]) + " twice", "List each rank once");
    }
  }
  return requests;
}

// The ranks that asked for `color`, in their new order: by key, then by rank. Only the
// communicators' split_by calls it, which is defined where HERD_SEPARATE_DEFINITIONS is (inline,
// or only in the implementation file: core/config.hpp), and so is it.
#if defined(HERD_SEPARATE_DEFINITIONS)
inline std::vector<int> split_members(std::span<const split_request> requests, int color) {
  std::vector<int> members;
  for (std::size_t r = 0; r < requests.size(); ++r)
    if (requests[r].color == color) members.push_back(static_cast<int>(r));
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return requests[static_cast<std::size_t>(a)].key < requests[static_cast<std::size_t>(b)].key;
  });
  return members;
}

HERD_SEPARATE split_request subset_request(std::span<const int> ranks, int rank) {
  split_request r;
  std::uint64_t h = 1469598103934665603ull ^ ranks.size();
  for (int x : ranks) h = (h ^ static_cast<std::uint32_t>(x)) * 1099511628211ull;
  r.list = h;
  const auto at = std::find(ranks.begin(), ranks.end(), rank);
  r.color = at == ranks.end() ? no_color : 0;
  r.key = static_cast<std::int32_t>(at - ranks.begin());
  return r;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_SPLIT_HPP
