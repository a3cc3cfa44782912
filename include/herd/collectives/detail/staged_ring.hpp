#pragma once
// Ring allreduce of device memory over a communicator that moves host memory (MPI without CUDA
// awareness): every segment crosses through page-locked host buffers, and the reductions run on
// the device. A step of the reduce-scatter copies the outgoing chunk to the host segment by
// segment and sends each segment as soon as its copy has landed, while the incoming segments
// are copied to the device and reduced as they arrive; copies, transfers and reductions of
// different segments overlap. The allgather forwards what it received straight from the host
// buffer, so only its first step copies device memory to the host.
//
// The device side is a backend that runs operations in order on one stream:
//   to_host(host, device, bytes), to_device(device, host, bytes), copy(device, device, bytes),
//   reduce(type, op, out, a, b, n, avg_ranks), mark() -> marker, done(marker), wait(marker),
//   finish(), host_buffer(bytes, which) (page-locked), device_buffer(bytes).
// cuda/staging.hpp runs it on a CUDA stream; the tests run it on a worker thread over host memory.

#include <herd/collectives/detail/ring.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/watchdog.hpp>

#include <cstddef>
#include <vector>

namespace herd::detail {

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
  const std::size_t m = seg.count;
  const std::size_t stride = seg.elements * es;  // bytes between segment starts
  const std::size_t chunk_bytes = m * stride;
  std::byte* send_stage = dev.host_buffer(chunk_bytes, 0);
  std::byte* recv_stage[2] = {dev.host_buffer(chunk_bytes, 1), dev.host_buffer(chunk_bytes, 2)};
  std::byte* incoming = dev.device_buffer(chunk_bytes);
  const int right = ring_mod(r + 1, p);
  const int left = ring_mod(r - 1, p);
  const int tag = comm.operations().data_tag();
  using marker = typename Backend::marker;
  std::vector<marker> staged(m);
  marker drained[2] = {};  // the last copy out of each receive buffer
  bool used[2] = {false, false};
  auto bytes_of = [&](int chunk, std::size_t k) {
    return seg.length(chunks.length[static_cast<std::size_t>(chunk)], k) * es;
  };
  auto offset_of = [&](int chunk) { return chunks.offset[static_cast<std::size_t>(chunk)] * es; };

  // One step: send `send_from` (host memory, after `staged` when stage_sends), receive chunk
  // `incoming_chunk` into a receive buffer and hand each segment to `arrived`.
  int step_index = 0;
  auto step = [&](int outgoing_chunk, const std::byte* send_from, bool stage_sends, int incoming_chunk, auto arrived) {
    const int parity = step_index++ % 2;
    std::byte* landing = recv_stage[parity];
    if (used[parity]) dev.wait(drained[parity]);  // its previous contents are on the device already
    using request = typename C::request;
    std::vector<request> receives(m);
    std::vector<request> sends;
    sends.reserve(m);
    for (std::size_t k = 0; k < m; ++k) {
      receives[k] = comm.irecv(landing + k * stride, bytes_of(incoming_chunk, k), left, tag);
    }
    waiting watch(comm.options());
    std::size_t sent = 0;
    std::size_t received = 0;
    for (; sent < m || received < m;) {
      bool progress = false;
      if (sent < m && (!stage_sends || dev.done(staged[sent]))) {
        sends.push_back(comm.isend(send_from + sent * stride, bytes_of(outgoing_chunk, sent), right, tag));
        ++sent;
        progress = true;
      }
      if (received < m && comm.test(receives[received])) {
        arrived(received, landing + received * stride, bytes_of(incoming_chunk, received));
        ++received;
        progress = true;
      }
      if (!progress) {
        if (watch.tick()) {
          check_peers_of(comm);
          const bool receiving = received < m;
          watch.watch({"allreduce", r, p}, waiting_for(comm.operations(), receiving ? left : right, receiving, tag));
        }
        watch.pause();
      }
    }
    for (auto& s : sends) comm.wait(s);
    drained[parity] = dev.mark();
    used[parity] = true;
  };

  // Reduce-scatter: as the host ring (ring.hpp), with chunk r-s-1 going out and r-s-2 coming in.
  for (int s = 0; s < p - 1; ++s) {
    const int outgoing = ring_mod(r - s - 1, p);
    const int arriving = ring_mod(r - s - 2, p);
    const std::byte* source = (s == 0 ? in : out) + offset_of(outgoing);
    for (std::size_t k = 0; k < m; ++k) {
      dev.to_host(send_stage + k * stride, source + k * stride, bytes_of(outgoing, k));
      staged[k] = dev.mark();
    }
    const bool last = s == p - 2;
    step(outgoing, send_stage, true, arriving, [&](std::size_t k, const std::byte* data, std::size_t bytes) {
      const std::size_t at = offset_of(arriving) + k * stride;
      dev.to_device(incoming + k * stride, data, bytes);
      dev.reduce(type, op, out + at, in + at, incoming + k * stride, bytes / es,
                 last && op == reduce_op::avg ? p : 0);
    });
  }
  // Allgather: chunk r-s goes out, r-s-1 comes in and is copied to its place on the device.
  const std::byte* previous_landing = nullptr;
  for (int s = 0; s < p - 1; ++s) {
    const int outgoing = ring_mod(r - s, p);
    const int arriving = ring_mod(r - s - 1, p);
    if (s == 0) {
      for (std::size_t k = 0; k < m; ++k) {
        dev.to_host(send_stage + k * stride, out + offset_of(outgoing) + k * stride, bytes_of(outgoing, k));
        staged[k] = dev.mark();
      }
    }
    const int parity = step_index % 2;
    step(outgoing, s == 0 ? send_stage : previous_landing, s == 0, arriving,
         [&](std::size_t k, const std::byte* data, std::size_t bytes) {
           dev.to_device(out + offset_of(arriving) + k * stride, data, bytes);
         });
    previous_landing = recv_stage[parity];
  }
  dev.finish();
}

}  // namespace herd::detail
