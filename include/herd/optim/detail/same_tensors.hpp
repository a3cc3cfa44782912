#pragma once
// Checks that every rank holds the same list of tensors (`what` names one, in the singular) (count, sizes, dtypes) before a sequence
// of collectives over them, so that a rank with a different model fails with a message on every
// rank instead of pairing its tensors with the wrong ones or waiting forever.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/detail/agreement.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C>
void require_same_tensors(const std::vector<buffer_view>& views, C& comm, const char* operation, const char* what) {
  std::vector<std::int64_t> mine;
  mine.reserve(views.size());
  for (const auto& v : views) mine.push_back(static_cast<std::int64_t>((v.count << 8) | static_cast<std::uint8_t>(v.type)));
  std::vector<std::int64_t> all;
  // Host vectors: over the communicator's control channel (nccl_communicator moves GPU memory only).
  const std::vector<std::size_t> counts = allgatherv(mine, all, control_of(comm));
  const error_site site{operation, comm.rank(), comm.size()};
  auto describe = [](std::int64_t code) {
    const auto u = static_cast<std::uint64_t>(code);
    return std::to_string(u >> 8) + " elements of " + std::string(name(static_cast<dtype>(u & 0xffu)));
  };
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); offset += counts[r], ++r) {
    if (counts[r] != counts[0]) {
      raise(site, "rank " + std::to_string(r) + " has " + std::to_string(counts[r]) + " " + what + "s but rank 0 has " +
                      std::to_string(counts[0]),
            std::string("Every rank must pass the same list of ") + what + "s, in the same order");
    }
    for (std::size_t i = 0; i < counts[r]; ++i) {
      if (all[offset + i] != all[i]) {
        raise(site, std::string(what) + " " + std::to_string(i) + " is " + describe(all[i]) + " on rank 0 but " +
                        describe(all[offset + i]) + " on rank " + std::to_string(r),
              std::string("Every rank must pass the same list of ") + what + "s, in the same order");
      }
    }
  }
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail
