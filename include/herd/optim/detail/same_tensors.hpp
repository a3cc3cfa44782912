#ifndef HERD_OPTIM_DETAIL_SAME_TENSORS_HPP
#define HERD_OPTIM_DETAIL_SAME_TENSORS_HPP
// Checks that every rank holds the same list of tensors (count, sizes, dtypes) before a sequence
// of collectives over them, so that a rank with a different model fails with a message on every
// rank instead of pairing its tensors with the wrong ones or waiting forever. A problem this rank
// found on its own (`local_fault`, e.g. gradients on two devices) travels in the same exchange and
// is raised on every rank too. `what` names one tensor, in the singular. Every rank raises at the
// same point, after the exchange: an agreed error (herd::argument_error), and the communicator
// stays usable.
//
// One allgather of a three-number summary per rank; only when the summaries differ does a second
// exchange gather the full lists, to say which tensor differs.

#include <herd/collectives/allgather.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

template <communicator C>
void require_same_tensors(const std::vector<buffer_view>& views, C& comm, const char* operation, const char* what,
                          const std::string& local_fault = {}) {
  const error_site site{operation, comm.rank(), comm.size()};
  std::vector<std::int64_t> mine;
  if (local_fault.empty()) {
    mine.reserve(views.size());
    for (const auto& v : views) mine.push_back(static_cast<std::int64_t>((v.count << 8) | static_cast<std::uint8_t>(v.type)));
  }
  std::uint64_t hash = 1469598103934665603ull;
  for (std::int64_t code : mine) hash = (hash ^ static_cast<std::uint64_t>(code)) * 1099511628211ull;
  const std::array<std::int64_t, 3> summary = {local_fault.empty() ? 0 : 1, static_cast<std::int64_t>(mine.size()),
                                               static_cast<std::int64_t>(hash)};
  std::vector<std::int64_t> summaries(3 * static_cast<std::size_t>(comm.size()));
  allgather(summary, summaries, control_of(comm));  // host numbers: over the control channel
  if (!local_fault.empty()) raise_agreed(site, local_fault, "Every rank stops so that none waits forever");
  bool same = true;
  for (std::size_t r = 0; r < static_cast<std::size_t>(comm.size()); ++r) {
    if (summaries[3 * r] != 0) {
      raise_agreed(site, "rank " + std::to_string(r) + " found a problem with its " + what + "s (its own error says which)",
                   "Fix it on that rank; every rank stops so that none waits forever");
    }
    same = same && summaries[3 * r + 1] == summaries[1] && summaries[3 * r + 2] == summaries[2];
  }
  if (same) return;
  std::vector<std::int64_t> all;
  const std::vector<std::size_t> counts = allgatherv(mine, all, control_of(comm));
  auto describe = [](std::int64_t code) {
    const auto u = static_cast<std::uint64_t>(code);
    return std::to_string(u >> 8) + " elements of " + std::string(name(static_cast<dtype>(u & 0xffu)));
  };
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); offset += counts[r], ++r) {
    if (counts[r] != counts[0]) {
      raise_agreed(site, "rank " + std::to_string(r) + " has " + std::to_string(counts[r]) + " " + what + "s but rank 0 has " +
                             std::to_string(counts[0]),
                   std::string("Every rank must pass the same list of ") + what + "s, in the same order");
    }
    for (std::size_t i = 0; i < counts[r]; ++i) {
      if (all[offset + i] != all[i]) {
        raise_agreed(site, std::string(what) + " " + std::to_string(i) + " is " + describe(all[i]) + " on rank 0 but " +
                               describe(all[offset + i]) + " on rank " + std::to_string(r),
                     std::string("Every rank must pass the same list of ") + what + "s, in the same order");
      }
    }
  }
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_SAME_TENSORS_HPP
