#ifndef HERD_COLLECTIVES_DETAIL_ROOTED_HPP
#define HERD_COLLECTIVES_DETAIL_ROOTED_HPP
// Moving every rank's block to one root, or the root's blocks to every rank (gather, scatter, and
// reduce's last step). Blocks may differ in size, and every rank knows every size.
//
// Small: a binomial tree over the ranks relative to the root (q = rank - root, mod p). The
// parent of q is q without its lowest set bit; q's subtree is q .. q + lowbit(q) - 1 (the
// root's: every rank), whose blocks lie side by side in relative order, so each rank sends or
// receives its subtree's blocks in one message: ceil(log2 p) hops instead of p - 1 at the root.
// Large: straight between the root and each rank, at most ring_window messages in flight at
// the root, so that nothing is copied twice.

#include <herd/collectives/detail/ring.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <span>
#include <vector>

namespace herd::detail {

// Gathers and scatters of up to this many bytes in all take the tree.
inline constexpr std::size_t rooted_tree_max_bytes = std::size_t{64} << 10;

// The binomial tree of the ranks relative to `root`, with their blocks in relative order.
struct rooted_tree {
  int p;
  int root;
  int q;                            // this rank, relative to the root
  int span;                         // lowbit(q): q's subtree is q .. min(q + span, p) - 1; the root's spans all
  std::vector<std::size_t> offset;  // offset[j]: bytes before relative rank j's block; offset[p]: all

  rooted_tree(int size, int rank, int root_rank, std::span<const std::size_t> bytes);

  int absolute(int j) const { return (j + root) % p; }
  // Bytes of the blocks of relative ranks [from, to).
  std::size_t bytes(int from, int to) const {
    return offset[static_cast<std::size_t>(std::min(to, p))] - offset[static_cast<std::size_t>(from)];
  }
  std::size_t subtree_bytes() const { return bytes(q, q + span); }
  bool leaf() const { return q != 0 && (span == 1 || q + 1 >= p); }
  // Where relative rank j's block lies in this rank's subtree buffer.
  std::size_t at(int j) const { return bytes(q, j); }
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE rooted_tree::rooted_tree(int size, int rank, int root_rank, std::span<const std::size_t> bytes)
    : p(size), root(root_rank), q(ring_mod(rank - root_rank, size)), span(1),
      offset(static_cast<std::size_t>(size) + 1, 0) {
  while (span < p && (q & span) == 0) span <<= 1;
  for (int j = 0; j < p; ++j) {
    offset[static_cast<std::size_t>(j) + 1] =
        offset[static_cast<std::size_t>(j)] + bytes[static_cast<std::size_t>(absolute(j))];
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

// Every rank's block (`mine`, bytes[rank] bytes) to the root, where `gathered` receives them all in
// relative order (the root's own first, then root + 1, ...). Only the root's `gathered` is used.
template <communicator C>
void tree_gather(C& comm, int root, std::span<const std::size_t> bytes, const std::byte* mine, std::byte* gathered) {
  const rooted_tree t(comm.size(), comm.rank(), root, bytes);
  const int tag = comm.operations().data_tag();
  if (t.leaf()) {  // nothing to collect: its own block straight to its parent
    if (t.subtree_bytes() != 0) {
      auto s = comm.isend(mine, t.subtree_bytes(), t.absolute(t.q - t.span), tag);
      comm.wait(s);
    }
    return;
  }
  std::byte* buffer = t.q == 0 ? gathered : scratch(t.subtree_bytes(), scratch_slot::transit);
  const std::size_t own = bytes[static_cast<std::size_t>(comm.rank())];
  if (own != 0 && buffer != mine) std::memcpy(buffer, mine, own);
  std::vector<typename C::request> receives;
  for (int m = 1; m < t.span && t.q + m < t.p; m <<= 1) {
    const int child = t.q + m;  // its subtree: child .. child + m - 1
    if (const std::size_t n = t.bytes(child, child + m); n != 0) {
      receives.push_back(comm.irecv(buffer + t.at(child), n, t.absolute(child), tag));
    }
  }
  for (auto& r : receives) comm.wait(r);
  if (t.q != 0 && t.subtree_bytes() != 0) {
    auto s = comm.isend(buffer, t.subtree_bytes(), t.absolute(t.q - t.span), tag);
    comm.wait(s);
  }
}

// The root's blocks (`scattered`, in relative order) to every rank's `mine` (bytes[rank] bytes).
// Only the root's `scattered` is read.
template <communicator C>
void tree_scatter(C& comm, int root, std::span<const std::size_t> bytes, const std::byte* scattered, std::byte* mine) {
  const rooted_tree t(comm.size(), comm.rank(), root, bytes);
  const int tag = comm.operations().data_tag();
  const std::byte* buffer = scattered;
  if (t.q != 0) {
    // A leaf's is its own block.
    std::byte* received = t.leaf() ? mine : scratch(t.subtree_bytes(), scratch_slot::transit);
    if (t.subtree_bytes() != 0) {
      auto r = comm.irecv(received, t.subtree_bytes(), t.absolute(t.q - t.span), tag);
      comm.wait(r);
    }
    buffer = received;
  }
  std::vector<typename C::request> sends;
  for (int m = t.span / 2; m >= 1; m >>= 1) {  // the largest subtree first: it has the longest way to go
    const int child = t.q + m;
    if (child >= t.p) continue;
    if (const std::size_t n = t.bytes(child, child + m); n != 0) {
      sends.push_back(comm.isend(buffer + t.at(child), n, t.absolute(child), tag));
    }
  }
  const std::size_t own = bytes[static_cast<std::size_t>(comm.rank())];
  if (own != 0 && buffer != mine) std::memcpy(mine, buffer, own);
  for (auto& s : sends) comm.wait(s);
}

// Every other rank's block straight to the root, into at(q); the root's own is the caller's.
template <communicator C, class At>
void direct_gather(C& comm, int root, std::span<const std::size_t> bytes, const std::byte* mine, At at) {
  const int p = comm.size();
  const int r = comm.rank();
  const int tag = comm.operations().data_tag();
  if (r != root) {
    if (const std::size_t n = bytes[static_cast<std::size_t>(r)]; n != 0) {
      auto s = comm.isend(mine, n, root, tag);
      comm.wait(s);
    }
    return;
  }
  std::deque<typename C::request> receives;
  for (int k = 1; k < p; ++k) {
    const int q = (root + k) % p;
    const std::size_t n = bytes[static_cast<std::size_t>(q)];
    if (n == 0) continue;
    if (receives.size() == ring_window) {
      comm.wait(receives.front());
      receives.pop_front();
    }
    receives.push_back(comm.irecv(at(q), n, q, tag));
  }
  for (auto& rq : receives) comm.wait(rq);
}

// The root's block for every other rank, from at(q), straight to it; the root's own is the caller's.
template <communicator C, class At>
void direct_scatter(C& comm, int root, std::span<const std::size_t> bytes, std::byte* mine, At at) {
  const int p = comm.size();
  const int r = comm.rank();
  const int tag = comm.operations().data_tag();
  if (r != root) {
    if (const std::size_t n = bytes[static_cast<std::size_t>(r)]; n != 0) {
      auto rq = comm.irecv(mine, n, root, tag);
      comm.wait(rq);
    }
    return;
  }
  std::deque<typename C::request> sends;
  for (int k = 1; k < p; ++k) {
    const int q = (root + k) % p;
    const std::size_t n = bytes[static_cast<std::size_t>(q)];
    if (n == 0) continue;
    if (sends.size() == ring_window) {
      comm.wait(sends.front());
      sends.pop_front();
    }
    sends.push_back(comm.isend(at(q), n, q, tag));
  }
  for (auto& s : sends) comm.wait(s);
}

// The blocks of `bytes` (in rank order, at `from`) laid out in relative order from `root` at `to`,
// or back (relative_to_absolute): two copies, as relative order is rank order rotated by root.
inline void rotate_blocks(std::span<const std::size_t> bytes, int root, const std::byte* from, std::byte* to,
                          bool relative_to_absolute) {
  std::size_t before = 0;  // bytes of ranks 0 .. root - 1
  std::size_t total = 0;
  for (std::size_t q = 0; q < bytes.size(); ++q) {
    if (q < static_cast<std::size_t>(root)) before += bytes[q];
    total += bytes[q];
  }
  const std::size_t after = total - before;  // ranks root .. p - 1: the first in relative order
  if (relative_to_absolute) {
    if (after != 0) std::memcpy(to + before, from, after);
    if (before != 0) std::memcpy(to, from + after, before);
  } else {
    if (after != 0) std::memcpy(to, from + before, after);
    if (before != 0) std::memcpy(to + after, from, before);
  }
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_ROOTED_HPP
