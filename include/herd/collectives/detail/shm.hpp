#ifndef HERD_COLLECTIVES_DETAIL_SHM_HPP
#define HERD_COLLECTIVES_DETAIL_SHM_HPP
// Collectives through a node's shared memory (comm/detail/shm.hpp): for host tensors when every
// rank of the communicator is on one node, and as the two node-local halves of the hierarchical
// allreduce. Tensors are cut into slices that fit a rank's buffer, one step (ticket) per slice,
// so the memory stays bounded whatever the tensor's size.
//
// Every element of a reduction is computed once, by one rank, combining the ranks' values in rank
// order (x0 ∘ x1 ∘ ... ∘ x(p-1)) exactly as the small allreduce does; every other rank copies that
// result. So all ranks hold the same bits, and a run gives the same bits as the last. With
// reproducible sums (comm_options::reproducible), shm_allreduce computes each element with the
// order-free function of collectives/detail/reproducible.hpp instead, as every other path of the
// mode does: every rank's value of the element is in the node's memory at once.

#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/collectives/detail/reproducible.hpp>
#include <herd/collectives/detail/ring.hpp>
#include <herd/comm/detail/shm.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace herd::detail {

// n elements cut into `parts` pieces as evenly as possible, the first n % parts one longer.
struct even_pieces {
  std::size_t n;
  std::size_t parts;
  std::size_t offset(std::size_t k) const { return k * (n / parts) + std::min(k, n % parts); }
  std::size_t length(std::size_t k) const { return n / parts + (k < n % parts ? 1 : 0); }
};

// A host tensor made of consecutive parts of one dtype (a grouped allreduce's tensors, a
// distributed optimizer's gradients), addressed as one: element i of the whole is in the part
// whose range holds i.
class host_parts {
 public:
  host_parts(std::span<const buffer_view> parts, std::size_t element_bytes);
  // One contiguous tensor, input or output (an input's parts are only read).
  host_parts(const void* data, std::size_t count, dtype type);
  host_parts(const host_parts&) = delete;  // parts_ may point at one_
  host_parts& operator=(const host_parts&) = delete;

  // f(pointer, offset from begin, elements) for each contiguous run of [begin, begin + n).
  template <class F> void each(std::size_t begin, std::size_t n, F&& f) const {
    if (n == 0) return;
    auto k = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    for (std::size_t done = 0; done < n; ++k) {
      const std::size_t at = begin + done;
      const std::size_t run = std::min(starts_[k + 1] - at, n - done);
      if (run != 0) f(static_cast<std::byte*>(parts_[k].data) + (at - starts_[k]) * es_, done, run);
      done += run;
    }
  }

 private:
  buffer_view one_{};  // the part of a contiguous tensor
  std::span<const buffer_view> parts_;
  std::size_t es_;
  std::vector<std::size_t> starts_;
};

// shm_allreduce's pieces of a slice: the slice is cut into one piece per rank of the node, and
// piece g is the one rank g reduces.
struct shm_slice {
  std::size_t begin;  // the slice's first element
  std::size_t m;      // its elements
  std::size_t lo;     // this rank's piece: [lo, hi) within the slice
  std::size_t hi;

  shm_slice(const shm_node& node, std::size_t first, std::size_t count, std::size_t per_slice) : begin(first) {
    m = std::min(per_slice, count - first);
    const even_pieces pieces{m, static_cast<std::size_t>(node.size())};
    lo = pieces.offset(static_cast<std::size_t>(node.rank()));
    hi = lo + pieces.length(static_cast<std::size_t>(node.rank()));
  }
};

// The allreduce's slice (shm_node::allreduce_slice_bytes) in elements.
inline std::size_t shm_elements_per_slice(const shm_node& node, dtype type) {
  return std::max<std::size_t>(1, node.allreduce_slice_bytes() / size_of(type));
}

// The first half-step of shm_allreduce's slice: this rank copies into its buffer `mine` the
// pieces of its input that the others reduce, every piece but its own.
HERD_SEPARATE void shm_copy_in(std::uint32_t track, dtype type, const host_parts& in, const shm_slice& s,
                               std::byte* mine);

// Allreduce of `count` elements over every rank of the node, from `in` into `out` (the same
// parts when in place). Per slice: each rank copies the pieces of its input that the others
// reduce into its buffer (the slice's window of it: shm_node::window); after the first half-step
// rank g reduces piece g from every buffer (its own from its input) into the hole in its buffer;
// after the second, every rank copies every reduced piece out. `agreed` is the ticket of the
// agreement's step when the first slice's first half-step travelled in it (agree_with_step, with
// shm_copy_in of the first slice): 0 otherwise.
template <class C>
void shm_allreduce(C& comm, shm_node& node, dtype type, reduce_op op, const host_parts& in, const host_parts& out,
                   std::size_t count, std::uint64_t agreed = 0) {
  const std::size_t es = size_of(type);
  const int p = node.size();
  const auto g = static_cast<std::size_t>(node.rank());
  const std::size_t per_slice = shm_elements_per_slice(node, type);
  const bool reproducible = comm.options().reproducible;
  const std::uint32_t track = comm.operations().track();
  for (std::size_t begin = 0; begin < count; begin += per_slice) {
    const shm_slice slice(node, begin, count, per_slice);
    const std::size_t m = slice.m, lo = slice.lo, hi = slice.hi;
    std::uint64_t t = agreed;
    if (begin != 0 || agreed == 0) {
      t = node.next_ticket(comm);
      shm_copy_in(track, type, in, slice, node.window(node.rank(), t, m * es));
      node.publish(t);
      node.wait_all(comm, t);
    }
    std::byte* mine = node.window(node.rank(), t, m * es);
    {
      const trace::span phase(track, "reduction", trace::fields::elements(hi - lo, type));
      in.each(begin + lo, hi - lo, [&](const std::byte* own, std::size_t at, std::size_t run) {
        const std::size_t offset = (lo + at) * es;
        auto operand = [&](int q) {
          return static_cast<std::size_t>(q) == g ? own : node.window(q, t, m * es) + offset;
        };
        combine_ranks(reproducible, type, op, mine + offset, p, operand, run);
      });
    }
    node.publish(t, shm_node::reduced);
    const even_pieces pieces{m, static_cast<std::size_t>(p)};
    auto copy_out = [&](std::size_t c) {
      const std::size_t from = pieces.offset(c);
      const std::byte* reduced = node.window(static_cast<int>(c), t, m * es) + from * es;
      out.each(begin + from, pieces.length(c), [&](std::byte* dst, std::size_t at, std::size_t run) {
        std::memcpy(dst, reduced + at * es, run * es);
      });
    };
    {
      // This rank's own piece before the wait: it needs no peer (nobody reads `out`, and this
      // rank's input piece, which `out` may be, was read by its reduction only).
      const trace::span phase(track, "copy out", trace::fields::elements(hi - lo, type));
      copy_out(g);
    }
    node.wait_all(comm, t, shm_node::reduced);
    const trace::span phase(track, "copy out", trace::fields::elements(m - (hi - lo), type));
    for (std::size_t c = 0; c < static_cast<std::size_t>(p); ++c) {
      if (c != g) copy_out(c);
    }
  }
}

// The same for one contiguous tensor.
template <class C>
void shm_allreduce(C& comm, shm_node& node, dtype type, reduce_op op, const std::byte* in, std::byte* out,
                   std::size_t count) {
  shm_allreduce(comm, node, type, op, host_parts(in, count, type), host_parts(out, count, type), count);
}

// Reduce-scatter over the node: rank g ends with chunk g (chunks.length[g] elements at `mine`) of
// the reduction; `in_chunk(c)` is this rank's contribution to chunk c. `mine` may be in_chunk(g)
// itself (in place). Per slice each rank copies a piece of every other rank's chunk into its
// buffer; the owner reduces its piece straight out of the buffers (a reproducible sum with the
// mode's function, as shm_allreduce).
template <class C, class InChunk>
void shm_reduce_scatter(C& comm, shm_node& node, dtype type, reduce_op op, const chunk_layout& chunks,
                        InChunk in_chunk, std::byte* mine) {
  const std::size_t es = size_of(type);
  const int p = node.size();
  const int g = node.rank();
  const std::size_t piece = std::max<std::size_t>(1, node.slice_bytes() / (es * static_cast<std::size_t>(p)));
  const std::size_t longest = chunks.longest();
  auto piece_of = [&](int c, std::size_t begin) {
    const std::size_t length = chunks.length[static_cast<std::size_t>(c)];
    return begin >= length ? 0 : std::min(piece, length - begin);
  };
  const std::byte* own = in_chunk(g);
  const bool reproducible = comm.options().reproducible;
  const std::uint32_t track = comm.operations().track();
  for (std::size_t begin = 0; begin < longest; begin += piece) {
    const std::uint64_t t = node.next_ticket(comm);
    std::byte* buffer = node.buffer(g, t);
    {
      const trace::span phase(track, "copy in");
      for (int c = 0; c < p; ++c) {
        // A chunk already used up is skipped: `begin` would point past its end.
        if (const std::size_t n = piece_of(c, begin); c != g && n > 0) {
          std::memcpy(buffer + static_cast<std::size_t>(c) * piece * es, in_chunk(c) + begin * es, n * es);
        }
      }
    }
    node.publish(t);
    node.wait_all(comm, t);
    const std::size_t n = piece_of(g, begin);
    if (n == 0) continue;
    const trace::span phase(track, "reduction", trace::fields::elements(n, type));
    auto operand = [&](int q) {
      return q == g ? own + begin * es : node.buffer(q, t) + static_cast<std::size_t>(g) * piece * es;
    };
    std::byte* dst = mine + begin * es;
    if (dst == own + begin * es && g != 0) {
      // In place, this rank's own value is not the first operand: reduce into the buffer's free
      // piece (the one nobody copied in), then copy the result out.
      std::byte* scratch = buffer + static_cast<std::size_t>(g) * piece * es;
      combine_ranks(reproducible, type, op, scratch, p, operand, n);
      std::memcpy(dst, scratch, n * es);
    } else {
      combine_ranks(reproducible, type, op, dst, p, operand, n);
    }
  }
}

// Allgather over the node: chunk c of `base` (chunks.offset[c], chunks.length[c] elements) comes
// from rank c; this rank's is `mine` (which may already be at its place in base).
template <class C>
void shm_allgather(C& comm, shm_node& node, std::size_t element_bytes, const chunk_layout& chunks,
                   const std::byte* mine, std::byte* base) {
  const std::size_t es = element_bytes;
  const int p = node.size();
  const int g = node.rank();
  const std::size_t piece = std::max<std::size_t>(1, node.slice_bytes() / es);
  const std::size_t longest = chunks.longest();
  auto piece_of = [&](int c, std::size_t begin) {
    const std::size_t length = chunks.length[static_cast<std::size_t>(c)];
    return begin >= length ? 0 : std::min(piece, length - begin);
  };
  const std::uint32_t track = comm.operations().track();
  for (std::size_t begin = 0; begin < longest; begin += piece) {
    const std::uint64_t t = node.next_ticket(comm);
    {
      const trace::span phase(track, "copy in");
      if (const std::size_t n = piece_of(g, begin); n > 0) std::memcpy(node.buffer(g, t), mine + begin * es, n * es);
    }
    node.publish(t);
    node.wait_all(comm, t);
    const trace::span phase(track, "copy out");
    for (int c = 0; c < p; ++c) {
      const std::size_t n = piece_of(c, begin);
      if (c == g || n == 0) continue;
      std::memcpy(base + (chunks.offset[static_cast<std::size_t>(c)] + begin) * es, node.buffer(c, t), n * es);
    }
  }
}

// Broadcast over the node from node rank `root`.
template <class C> void shm_broadcast(C& comm, shm_node& node, std::byte* data, std::size_t bytes, int root) {
  const std::size_t slice = node.slice_bytes();
  for (std::size_t begin = 0; begin < bytes; begin += slice) {
    const std::size_t n = std::min(slice, bytes - begin);
    const std::uint64_t t = node.next_ticket(comm);
    if (node.rank() == root) {
      const trace::span phase(comm.operations().track(), "copy in");
      std::memcpy(node.buffer(root, t), data + begin, n);
    }
    node.publish(t);
    node.wait_all(comm, t);
    if (node.rank() != root) {
      const trace::span phase(comm.operations().track(), "copy out");
      std::memcpy(data + begin, node.buffer(root, t), n);
    }
  }
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE host_parts::host_parts(std::span<const buffer_view> parts, std::size_t element_bytes)
    : parts_(parts), es_(element_bytes) {
  starts_.reserve(parts.size() + 1);
  std::size_t at = 0;
  for (const buffer_view& v : parts) {
    starts_.push_back(at);
    at += v.count;
  }
  starts_.push_back(at);
}

HERD_SEPARATE host_parts::host_parts(const void* data, std::size_t count, dtype type)
    : one_{const_cast<void*>(data), count, type}, parts_(&one_, 1), es_(size_of(type)), starts_{0, count} {}

HERD_SEPARATE void shm_copy_in(std::uint32_t track, dtype type, const host_parts& in, const shm_slice& s,
                               std::byte* mine) {
  const std::size_t es = size_of(type);
  const trace::span phase(track, "copy in", trace::fields::elements(s.m - (s.hi - s.lo), type));
  auto copy_in = [&](std::size_t from, std::size_t n) {
    in.each(s.begin + from, n, [&](const std::byte* src, std::size_t at, std::size_t run) {
      std::memcpy(mine + (from + at) * es, src, run * es);
    });
  };
  copy_in(0, s.lo);
  copy_in(s.hi, s.m - s.hi);
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_SHM_HPP
