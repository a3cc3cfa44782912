#ifndef HERD_COLLECTIVES_DETAIL_STAGED_RING_HPP
#define HERD_COLLECTIVES_DETAIL_STAGED_RING_HPP
// herd's collectives on device memory over a communicator that moves host memory (MPI without
// CUDA awareness): every segment crosses through page-locked host slots, and reductions run on
// the device. Staging memory is bounded, as NCCL's and Gloo's are: `staged_window` slots of one
// segment (HERD_RING_SEGMENT_BYTES) for sending, as many for receiving, and as many on the device
// for reduce's incoming data, whatever the tensor's size (8 MiB of page-locked memory at the
// default 1 MiB segment), reused from call to call.
//
// The ring collectives (allreduce, reduce_scatter, allgather) are one sequence of items: item
// j = (step s, segment k) of a chunk sent right and one received from the left. A rank stages
// item j (a device-to-host copy into a send slot) once the item it forwards, j - m (m segments
// per step), has arrived and its device work is queued; sends it once that copy has landed;
// receives it into a receive slot, and, once item j itself is staged, queues its device work
// (host-to-device copy, reduction). Each condition looks only at smaller items or at this rank's
// own earlier work, so no ring of ranks can wait on itself; copies, transfers and reductions of
// different items overlap. The broadcast is a pipelined chain through the same slots.
//
// The device side is a backend that runs operations in order on one stream:
//   to_host(host, device, bytes), to_device(device, host, bytes), copy(device, device, bytes),
//   reduce(type, op, out, a, b, n, avg_ranks), mark() -> marker, done(marker), wait(marker),
//   finish(), host_buffer(bytes, which) (page-locked; which is 0 or 1), device_buffer(bytes).
// cuda/staging.hpp runs it on a CUDA stream; the tests run it on a worker thread over host memory.

#include <herd/collectives/detail/ring.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/watchdog.hpp>

#include <cstddef>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {

// The waiting of a loop that makes progress in steps: step() (true when it progressed) until
// finished(). A step that progresses ends one watched wait (comm/detail/watchdog.hpp, with the
// peers' notices checked on its ticks), and the next wait starts afresh, so that the pauses grow,
// and the watchdog counts, only with the time since the last progress. (One wait over a whole
// long collective would sleep a millisecond at every idle poll after its first 10 ms, and call a
// collective that progresses for longer than the shutdown time stalled.)
template <class C, class Finished, class Step, class What>
void watched_steps(C& comm, const error_site& site, Finished finished, Step step, What what) {
  while (!finished()) watched_wait(comm.options(), site, step, [&] { check_peers_of(comm); }, what);
}

// Segments in flight each way, per rank.
inline constexpr std::size_t staged_window = 4;

// Page-locked bytes the staged collectives hold at a given segment size (both directions).
inline constexpr std::size_t staged_host_bytes(std::size_t segment_bytes) { return 2 * staged_window * segment_bytes; }

// The shared loop of the ring collectives: `steps` steps of `segments` items each; a slot holds
// `slot_bytes`.
//   send_from(s, k)            -> {device pointer, bytes} item (s, k) sends (ready once item (s-1, k) is queued)
//   receive_bytes(s, k)        -> bytes item (s, k) receives
//   arrived(s, k, host, bytes, device_slot): queues the device work of an arrived item
template <communicator C, class Backend, class SendFrom, class ReceiveBytes, class Arrived>
void staged_ring_pipeline(C& comm, Backend& dev, const char* operation, int steps, std::size_t segments,
                          std::size_t slot_bytes, SendFrom send_from, ReceiveBytes receive_bytes, Arrived arrived) {
  const std::size_t total = static_cast<std::size_t>(steps) * segments;
  if (total == 0) return;
  const int p = comm.size();
  const int r = comm.rank();
  const int right = ring_mod(r + 1, p);
  const int left = ring_mod(r - 1, p);
  const int tag = comm.operations().data_tag();
  constexpr std::size_t W = staged_window;
  std::byte* send_slots = dev.host_buffer(W * slot_bytes, 0);
  std::byte* receive_slots = dev.host_buffer(W * slot_bytes, 1);
  std::byte* device_slots = dev.device_buffer(W * slot_bytes);
  using marker = typename Backend::marker;
  using request = typename C::request;
  std::vector<marker> staged_copy(W);  // the device-to-host copy of the item in each send slot
  std::vector<marker> drained(W);      // the last device work reading each receive slot
  std::vector<request> receives(W);
  std::deque<request> sends;  // in order, from item `sends_done`
  std::size_t staged = 0, sent = 0, sends_done = 0, posted = 0, arrivals = 0;
  auto step_of = [&](std::size_t j) { return static_cast<int>(j / segments); };

  // One step: whatever can move now; true if anything did.
  auto step = [&] {
    bool progress = false;
    // Receive slots free once the previous item's device work has read them.
    while (posted < total && posted < arrivals + W && (posted < W || dev.done(drained[posted % W]))) {
      receives[posted % W] = comm.irecv(receive_slots + (posted % W) * slot_bytes,
                                        receive_bytes(step_of(posted), posted % segments), left, tag);
      ++posted;
      progress = true;
    }
    // Stage what is final on the device into free send slots.
    while (staged < total && staged < sends_done + W && (staged < segments || staged - segments < arrivals)) {
      const auto [from, bytes] = send_from(step_of(staged), staged % segments);
      dev.to_host(send_slots + (staged % W) * slot_bytes, from, bytes);
      staged_copy[staged % W] = dev.mark();
      ++staged;
      progress = true;
    }
    while (sent < staged && dev.done(staged_copy[sent % W])) {
      const std::size_t bytes = send_from(step_of(sent), sent % segments).second;
      sends.push_back(comm.isend(send_slots + (sent % W) * slot_bytes, bytes, right, tag));
      ++sent;
      progress = true;
    }
    while (!sends.empty() && comm.test(sends.front())) {
      sends.pop_front();
      ++sends_done;
      progress = true;
    }
    // An arrival's device work waits until the item itself is staged: it may overwrite what that
    // copy reads.
    while (arrivals < posted && arrivals < staged && comm.test(receives[arrivals % W])) {
      const std::size_t slot = arrivals % W;
      const int s = step_of(arrivals);
      const std::size_t k = arrivals % segments;
      arrived(s, k, receive_slots + slot * slot_bytes, receive_bytes(s, k), device_slots + slot * slot_bytes);
      drained[slot] = dev.mark();
      ++arrivals;
      progress = true;
    }
    return progress;
  };
  watched_steps(
      comm, {operation, r, p}, [&] { return arrivals >= total && sends_done >= total; }, step, [&] {
        const bool receiving = arrivals < total;
        return waiting_for(comm.operations(), receiving ? left : right, receiving, tag);
      });
  dev.finish();
}

// Allreduce: the ring's reduce-scatter (steps 0..p-2: chunk r-s-1 out, r-s-2 in and reduced with
// this rank's part of it) and allgather (steps p-1..2p-3: chunk r-t out, r-t-1 in, t = s-p+1).
template <communicator C, class Backend>
void staged_ring_allreduce(C& comm, Backend& dev, dtype type, reduce_op op, const std::byte* in, std::byte* out,
                           std::size_t count, std::size_t segment_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  const std::size_t es = size_of(type);
  if (count == 0) return;
  if (p == 1) {
    if (out != in) dev.copy(out, in, count * es);
    dev.finish();
    return;
  }
  const chunk_layout chunks = chunk_layout::even(count, p);
  const segmentation seg(chunks, es, segment_bytes);
  const std::size_t stride = seg.elements * es;
  auto chunk_out = [&](int s) { return s < p - 1 ? ring_mod(r - s - 1, p) : ring_mod(r - (s - p + 1), p); };
  auto chunk_in = [&](int s) { return s < p - 1 ? ring_mod(r - s - 2, p) : ring_mod(r - (s - p + 1) - 1, p); };
  auto at = [&](int c, std::size_t k) { return chunks.offset[static_cast<std::size_t>(c)] * es + k * stride; };
  auto bytes_of = [&](int c, std::size_t k) { return seg.length(chunks.length[static_cast<std::size_t>(c)], k) * es; };
  staged_ring_pipeline(
      comm, dev, "allreduce", 2 * (p - 1), seg.count, stride,
      [&](int s, std::size_t k) {
        const int c = chunk_out(s);
        return std::pair<const std::byte*, std::size_t>((s == 0 ? in : out) + at(c, k), bytes_of(c, k));
      },
      [&](int s, std::size_t k) { return bytes_of(chunk_in(s), k); },
      [&](int s, std::size_t k, const std::byte* host, std::size_t bytes, std::byte* slot) {
        const std::size_t where = at(chunk_in(s), k);
        if (s >= p - 1) return dev.to_device(out + where, host, bytes);
        dev.to_device(slot, host, bytes);
        dev.reduce(type, op, out + where, in + where, slot, bytes / es, s == p - 2 && op == reduce_op::avg ? p : 0);
      });
}

// Reduce-scatter of `in` (p chunks of `count` elements) into `out` (this rank's chunk, disjoint
// from `in`): the ring's reduce-scatter with every step's partial sums in `out` itself, which the
// next step stages before it overwrites them.
template <communicator C, class Backend>
void staged_ring_reduce_scatter(C& comm, Backend& dev, dtype type, reduce_op op, const std::byte* in, std::byte* out,
                                std::size_t count, std::size_t segment_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  const std::size_t es = size_of(type);
  if (count == 0) return;
  if (p == 1) {
    dev.copy(out, in, count * es);
    dev.finish();
    return;
  }
  const chunk_layout chunks = chunk_layout::of_counts(std::vector<std::size_t>(static_cast<std::size_t>(p), count));
  const segmentation seg(chunks, es, segment_bytes);
  const std::size_t stride = seg.elements * es;
  auto bytes_of = [&](std::size_t k) { return seg.length(count, k) * es; };
  staged_ring_pipeline(
      comm, dev, "reduce_scatter", p - 1, seg.count, stride,
      [&](int s, std::size_t k) {
        const std::byte* from = s == 0 ? in + static_cast<std::size_t>(ring_mod(r - 1, p)) * count * es : out;
        return std::pair<const std::byte*, std::size_t>(from + k * stride, bytes_of(k));
      },
      [&](int, std::size_t k) { return bytes_of(k); },
      [&](int s, std::size_t k, const std::byte* host, std::size_t bytes, std::byte* slot) {
        const std::byte* mine = in + static_cast<std::size_t>(ring_mod(r - s - 2, p)) * count * es + k * stride;
        dev.to_device(slot, host, bytes);
        dev.reduce(type, op, out + k * stride, mine, slot, bytes / es, s == p - 2 && op == reduce_op::avg ? p : 0);
      });
}

// Allgather(v) into `base` (chunks by `counts`), this rank's chunk already at its place.
template <communicator C, class Backend>
void staged_ring_allgather(C& comm, Backend& dev, std::byte* base, std::size_t es, const chunk_layout& chunks,
                           std::size_t segment_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  if (p == 1) {
    dev.finish();
    return;
  }
  const segmentation seg(chunks, es, segment_bytes);
  const std::size_t stride = seg.elements * es;
  auto at = [&](int c, std::size_t k) { return chunks.offset[static_cast<std::size_t>(c)] * es + k * stride; };
  auto bytes_of = [&](int c, std::size_t k) { return seg.length(chunks.length[static_cast<std::size_t>(c)], k) * es; };
  staged_ring_pipeline(
      comm, dev, "allgather", p - 1, seg.count, stride,
      [&](int s, std::size_t k) {
        const int c = ring_mod(r - s, p);
        return std::pair<const std::byte*, std::size_t>(base + at(c, k), bytes_of(c, k));
      },
      [&](int s, std::size_t k) { return bytes_of(ring_mod(r - s - 1, p), k); },
      [&](int s, std::size_t k, const std::byte* host, std::size_t bytes, std::byte*) {
        dev.to_device(base + at(ring_mod(r - s - 1, p), k), host, bytes);
      });
}

// Broadcast as a pipelined chain root -> root+1 -> ...: the root stages its segments to the host
// and sends them; every other rank receives each into a slot, forwards it from there (but the
// last), and copies it to the device. A slot is reused once both its forward and its copy are done.
template <communicator C, class Backend>
void staged_chain_broadcast(C& comm, Backend& dev, std::byte* data, std::size_t bytes, int root,
                            std::size_t segment_bytes) {
  const int p = comm.size();
  const int r = comm.rank();
  if (bytes == 0 || p == 1) return;
  const int q = ring_mod(r - root, p);  // place in the chain
  const bool receives_from_left = q > 0;
  const bool forwards = q < p - 1;
  const int tag = comm.operations().data_tag();
  const std::size_t segments = (bytes + segment_bytes - 1) / segment_bytes;
  auto length = [&](std::size_t k) { return std::min(segment_bytes, bytes - k * segment_bytes); };
  constexpr std::size_t W = staged_window;
  std::byte* slots = dev.host_buffer(W * segment_bytes, receives_from_left ? 1 : 0);
  using marker = typename Backend::marker;
  using request = typename C::request;
  std::vector<marker> copied(W);  // the root's device-to-host copy, or the copy to the device
  std::vector<request> receives(W);
  std::deque<request> sends;
  std::size_t ready = 0, posted = 0, sent = 0, sends_done = 0;
  const int left = ring_mod(r - 1, p);
  const int right = ring_mod(r + 1, p);
  const std::size_t to_send = forwards ? segments : 0;
  // `ready`: segments in a slot (received, or staged by the root). Item j's slot is free once item
  // j - W is in it and has been sent onward (where it is) and copied.
  auto slot_free = [&](std::size_t j) {
    return j < W || (ready > j - W && (!forwards || sends_done > j - W) && dev.done(copied[j % W]));
  };
  // One step: whatever can move now; true if anything did.
  auto step = [&] {
    bool progress = false;
    if (!receives_from_left) {
      while (ready < segments && slot_free(ready)) {
        dev.to_host(slots + (ready % W) * segment_bytes, data + ready * segment_bytes, length(ready));
        copied[ready % W] = dev.mark();
        ++ready;
        progress = true;
      }
    } else {
      while (posted < segments && slot_free(posted)) {
        receives[posted % W] = comm.irecv(slots + (posted % W) * segment_bytes, length(posted), left, tag);
        ++posted;
        progress = true;
      }
      while (ready < posted && comm.test(receives[ready % W])) {
        dev.to_device(data + ready * segment_bytes, slots + (ready % W) * segment_bytes, length(ready));
        copied[ready % W] = dev.mark();
        ++ready;
        progress = true;
      }
    }
    // The root sends once its copy has landed; the others forward what arrived.
    while (sent < std::min(ready, to_send) && (receives_from_left || dev.done(copied[sent % W]))) {
      sends.push_back(comm.isend(slots + (sent % W) * segment_bytes, length(sent), right, tag));
      ++sent;
      progress = true;
    }
    while (!sends.empty() && comm.test(sends.front())) {
      sends.pop_front();
      ++sends_done;
      progress = true;
    }
    return progress;
  };
  watched_steps(
      comm, {"broadcast", r, p}, [&] { return ready >= segments && sends_done >= to_send; }, step, [&] {
        const bool receiving = receives_from_left && ready < segments;
        return waiting_for(comm.operations(), receiving ? left : right, receiving, tag);
      });
  dev.finish();
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_STAGED_RING_HPP
