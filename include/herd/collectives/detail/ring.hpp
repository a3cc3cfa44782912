#ifndef HERD_COLLECTIVES_DETAIL_RING_HPP
#define HERD_COLLECTIVES_DETAIL_RING_HPP
// The ring: p ranks in a circle, each sending to its right neighbour and receiving from its left.
// A buffer is cut into p chunks; each chunk into segments. Reduce-scatter and allgather each take
// p-1 steps, and every step moves one chunk per rank, segment by segment: a rank forwards a
// segment as soon as it has it, while the next segments are still in flight, so sending,
// receiving and reducing overlap. Each rank sends and receives 2(p-1)/p of the buffer in all,
// the least any allreduce can.

#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/collectives/detail/scratch.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/runtime/timeline.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <span>
#include <vector>

namespace herd::detail {

// How p chunks lie in a buffer, in elements.
struct chunk_layout {
  std::vector<std::size_t> offset;
  std::vector<std::size_t> length;

  // n elements as evenly as possible: the first n % p chunks get one more.
  static chunk_layout even(std::size_t n, int p) {
    chunk_layout c;
    const auto parts = static_cast<std::size_t>(p);
    std::size_t at = 0;
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t len = n / parts + (i < n % parts ? 1 : 0);
      c.offset.push_back(at);
      c.length.push_back(len);
      at += len;
    }
    return c;
  }

  static chunk_layout of_counts(std::span<const std::size_t> counts) {
    chunk_layout c;
    std::size_t at = 0;
    for (std::size_t len : counts) {
      c.offset.push_back(at);
      c.length.push_back(len);
      at += len;
    }
    return c;
  }

  std::size_t longest() const { return length.empty() ? 0 : *std::max_element(length.begin(), length.end()); }
};

// Every chunk is cut into the same number of segments (the shorter chunks' last ones may be
// short or empty), so that a step's sends and receives pair up one to one on every rank.
struct segmentation {
  std::size_t count = 0;     // segments per chunk
  std::size_t elements = 0;  // elements per full segment

  segmentation(const chunk_layout& chunks, std::size_t element_bytes, std::size_t segment_bytes) {
    const std::size_t longest = chunks.longest();
    if (longest == 0) return;
    const std::size_t per_segment = std::max<std::size_t>(1, segment_bytes / element_bytes);
    count = (longest + per_segment - 1) / per_segment;
    elements = (longest + count - 1) / count;
  }

  std::size_t begin(std::size_t k) const { return k * elements; }
  // Elements of segment k in a chunk of `length` elements.
  std::size_t length(std::size_t chunk_length, std::size_t k) const {
    const std::size_t b = begin(k);
    return b >= chunk_length ? 0 : std::min(elements, chunk_length - b);
  }
};

inline int ring_mod(int x, int p) { return ((x % p) + p) % p; }

// The pipeline both phases share: `steps` steps of `segments` segments each, in order. Item i
// is sent to the right before item i is awaited from the left, which keeps every rank of the
// ring moving; at most `window` receives and min(window, segments) sends are in flight. The
// send limit also guarantees that when item (s, k) arrives, the send of item (s-1, k) has
// completed, so a phase may overwrite what that send read.
//   send_at(s, k)        -> {pointer, bytes} to send to the right
//   receive_at(s, k, slot) -> {pointer, bytes} to receive into from the left
//   received(s, k, pointer, bytes) is called once item (s, k) has arrived
template <communicator C, class SendAt, class ReceiveAt, class Received>
void ring_pipeline(C& comm, int tag, int steps, std::size_t segments, std::size_t window, SendAt send_at,
                   ReceiveAt receive_at, Received received) {
  const std::size_t total = static_cast<std::size_t>(steps) * segments;
  if (total == 0) return;
  const int p = comm.size();
  const int right = ring_mod(comm.rank() + 1, p);
  const int left = ring_mod(comm.rank() - 1, p);
  const std::size_t send_window = std::min(window, segments);
  using request = typename C::request;
  std::vector<request> receives(window);
  std::vector<std::pair<void*, std::size_t>> targets(window);
  std::deque<request> sends;

  auto post_receive = [&](std::size_t i) {
    const std::size_t slot = i % window;
    targets[slot] = receive_at(static_cast<int>(i / segments), i % segments, slot);
    receives[slot] = comm.irecv(targets[slot].first, targets[slot].second, left, tag);
  };
  for (std::size_t i = 0; i < std::min(window, total); ++i) post_receive(i);
  for (std::size_t i = 0; i < total; ++i) {
    const int s = static_cast<int>(i / segments);
    const std::size_t k = i % segments;
    if (sends.size() == send_window) {
      comm.wait(sends.front());
      sends.pop_front();
    }
    const auto [data, bytes] = send_at(s, k);
    sends.push_back(comm.isend(data, bytes, right, tag));
    const std::size_t slot = i % window;
    comm.wait(receives[slot]);
    received(s, k, targets[slot].first, targets[slot].second);
    if (i + window < total) post_receive(i + window);
  }
  for (auto& r : sends) comm.wait(r);
}

inline constexpr std::size_t ring_window = 4;

// Ring reduce-scatter: afterwards chunk r of the reduction of every rank's `in` is at
// result(p-2, r) on rank r. At step s rank r sends chunk r-s-1 and receives chunk r-s-2, which
// it combines with its own part of that chunk into result(s, chunk). For avg, the last
// combination also divides by p.
//   in_chunk(c)        -> const std::byte*: this rank's contribution to chunk c
//   result(s, c)       -> std::byte*: where step s puts the combined chunk c
template <communicator C, class InChunk, class Result>
void ring_reduce_scatter(C& comm, dtype type, reduce_op op, const chunk_layout& chunks, std::size_t segment_bytes,
                         InChunk in_chunk, Result result) {
  const int p = comm.size();
  const int r = comm.rank();
  const std::size_t es = size_of(type);
  const segmentation seg(chunks, es, segment_bytes);
  const trace::span phase(comm.operations().track(), "ring reduce-scatter");
  std::byte* slots = scratch(ring_window * seg.elements * es, scratch_slot::transit);
  auto chunk_sent = [&](int s) { return ring_mod(r - s - 1, p); };
  auto chunk_received = [&](int s) { return ring_mod(r - s - 2, p); };
  ring_pipeline(
      comm, comm.operations().data_tag(), p - 1, seg.count, ring_window,
      [&](int s, std::size_t k) {
        const int c = chunk_sent(s);
        const std::byte* base = s == 0 ? in_chunk(c) : result(s - 1, c);
        return std::pair<void*, std::size_t>(const_cast<std::byte*>(base + seg.begin(k) * es),
                                             seg.length(chunks.length[static_cast<std::size_t>(c)], k) * es);
      },
      [&](int s, std::size_t k, std::size_t slot) {
        const int c = chunk_received(s);
        return std::pair<void*, std::size_t>(slots + slot * seg.elements * es,
                                             seg.length(chunks.length[static_cast<std::size_t>(c)], k) * es);
      },
      [&](int s, std::size_t k, void* data, std::size_t bytes) {
        const int c = chunk_received(s);
        const std::size_t offset = seg.begin(k) * es;
        const bool last = s == p - 2;
        const trace::span reducing(comm.operations().track(), "reduction", trace::fields::elements(bytes / es, type));
        host_reduce(type, op, result(s, c) + offset, in_chunk(c) + offset, data, bytes / es,
                    last && op == reduce_op::avg ? p : 0);
      });
}

// Ring allgather in place: rank r holds chunk r of `base` complete; afterwards every rank holds
// every chunk. At step s rank r sends chunk r-s and receives chunk r-s-1 straight into place.
template <communicator C>
void ring_allgather(C& comm, std::byte* base, std::size_t element_bytes, const chunk_layout& chunks,
                    std::size_t segment_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  const segmentation seg(chunks, element_bytes, segment_bytes);
  const trace::span phase(comm.operations().track(), "ring allgather");
  auto where = [&](int c, std::size_t k) {
    const auto chunk = static_cast<std::size_t>(c);
    return std::pair<void*, std::size_t>(base + (chunks.offset[chunk] + seg.begin(k)) * element_bytes,
                                         seg.length(chunks.length[chunk], k) * element_bytes);
  };
  ring_pipeline(
      comm, comm.operations().data_tag(), p - 1, seg.count, ring_window,
      [&](int s, std::size_t k) { return where(ring_mod(r - s, p), k); },
      [&](int s, std::size_t k, std::size_t) { return where(ring_mod(r - s - 1, p), k); },
      [](int, std::size_t, void*, std::size_t) {});
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_RING_HPP
