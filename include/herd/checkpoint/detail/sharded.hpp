#ifndef HERD_CHECKPOINT_DETAIL_SHARDED_HPP
#define HERD_CHECKPOINT_DETAIL_SHARDED_HPP
// Tensors split over the ranks (optim/optimizer_state.hpp's sharded_view) in a checkpoint: the
// file holds each whole, so a save gathers the parts to the rank that writes and a load scatters
// to each rank its part of what the root read.

#include <herd/checkpoint/detail/file.hpp>
#include <herd/checkpoint/detail/safetensors.hpp>
#include <herd/collectives/allgather.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/gather.hpp>
#include <herd/collectives/scatter.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/dtype.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>
#include <herd/tensor/std.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace herd::detail::ckpt {

// On root, the whole tensor of `whole` elements whose part [offset, offset + part.count) this
// rank holds; an empty tensor elsewhere. Every rank calls it for the same tensors in the same
// order. The ranks' parts must follow one another in rank order and cover the whole: every rank
// sees every part's place, so every rank throws alike when they do not.
template <communicator C>
host_tensor gather_whole(const std::string& name, buffer_view part, std::size_t offset, std::size_t whole, C& comm,
                         int root) {
  std::int64_t mine[2] = {static_cast<std::int64_t>(offset), static_cast<std::int64_t>(part.count)};
  std::vector<std::int64_t> table(2 * static_cast<std::size_t>(comm.size()));
  allgather(buffer_view{mine, 2, dtype::i64}, table, comm);
  std::vector<std::size_t> counts;
  std::size_t next = 0;
  for (int r = 0; r < comm.size(); ++r) {
    const auto at = static_cast<std::size_t>(table[2 * static_cast<std::size_t>(r)]);
    const auto n = static_cast<std::size_t>(table[2 * static_cast<std::size_t>(r) + 1]);
    if (n != 0 && at != next) {
      throw failure{"rank " + std::to_string(r) + " holds elements [" + std::to_string(at) + ", " +
                        std::to_string(at + n) + ") of the split tensor " + safetensors::json_string(name) +
                        ", but the ranks before it end at element " + std::to_string(next),
                    "The parts of a split state tensor must follow one another in rank order"};
    }
    next += n;
    counts.push_back(n);
  }
  if (next != whole) {
    throw failure{"the ranks' parts of the split tensor " + safetensors::json_string(name) + " hold " +
                      std::to_string(next) + " of its " + std::to_string(whole) + " elements",
                  "The parts of a split state tensor must cover it once"};
  }
  host_tensor out(part.type, comm.rank() == root ? whole : 0);
  buffer_view out_view = out.view();
  gatherv(part, out_view, counts, comm, root);
  return out;
}

// Every rank's `part` (elements [offset, offset + part.count) of a tensor of `whole` elements)
// from the whole tensor, whose bytes root has at `root_bytes` (null elsewhere). Where the ranks'
// parts follow one another in rank order and cover the whole (zero_optimizer's shards), root
// scatters them: each rank receives its own part and no more. Parts laid out otherwise get the
// whole tensor, from which each rank keeps its part. Every rank sees every part's place (one
// small allgather), so every rank takes the same way.
template <communicator C>
void scatter_whole(const std::byte* root_bytes, buffer_view part, std::size_t offset, std::size_t whole, C& comm,
                   int root) {
  std::int64_t mine[2] = {static_cast<std::int64_t>(offset), static_cast<std::int64_t>(part.count)};
  std::vector<std::int64_t> table(2 * static_cast<std::size_t>(comm.size()));
  allgather(buffer_view{mine, 2, dtype::i64}, table, comm);
  std::vector<std::size_t> counts;
  std::size_t next = 0;
  bool in_rank_order = true;
  for (int r = 0; r < comm.size(); ++r) {
    const auto at = static_cast<std::size_t>(table[2 * static_cast<std::size_t>(r)]);
    const auto n = static_cast<std::size_t>(table[2 * static_cast<std::size_t>(r) + 1]);
    if (n != 0 && at != next) in_rank_order = false;
    next += n;
    counts.push_back(n);
  }
  if (in_rank_order && next == whole) {
    const const_buffer_view all(root_bytes, comm.rank() == root ? whole : 0, part.type);
    scatterv(all, part, counts, comm, root);
    return;
  }
  host_tensor all(part.type, whole);
  if (comm.rank() == root && all.bytes() != 0) std::memcpy(all.data(), root_bytes, all.bytes());
  buffer_view view = all.view();
  broadcast(view, comm, root);
  const auto* bytes = static_cast<const std::byte*>(all.data());
  if (part.count != 0) std::memcpy(part.data, bytes + offset * size_of(part.type), part.bytes());
}

}  // namespace herd::detail::ckpt

#endif  // HERD_CHECKPOINT_DETAIL_SHARDED_HPP
