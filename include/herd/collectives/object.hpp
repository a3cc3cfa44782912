#ifndef HERD_COLLECTIVES_OBJECT_HPP
#define HERD_COLLECTIVES_OBJECT_HPP
// herd::allgather_object and herd::broadcast_object: host values rather than tensors, as Horovod's
// functions of those names (which pickle; herd copies bytes).
//
//   std::vector<std::string> hosts = herd::allgather_object(my_host, comm);   // every rank's, in rank order
//   herd::broadcast_object(config, comm, /*root=*/0);                        // every rank ends with the root's
//
// A value is of a trivially copyable type (not a pointer), a std::string, or a std::vector of
// these (nested too); any other type fails to compile, saying so. Values travel as bytes
// (detail/serialize.hpp) in two operations, sizes then bytes (allgatherv; allgather and
// broadcast), so they are checked across ranks as those are; ranks that pass values of
// different types, or different roots, raise herd::error on every rank. On a communicator with
// native collectives (nccl_communicator) they go over its control channel.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/detail/serialize.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/detail/agreement.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/std.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

// True for the types objects may have; otherwise it stops the compilation with herd's words alone
// (the public functions compile their bodies only for those types).
template <class T> constexpr bool require_object() {
  static_assert(serializable<T>,
                "herd::allgather_object and herd::broadcast_object take values of trivially copyable types (not "
                "pointers), std::string, and std::vector of these; serialize other types into a std::string or a "
                "std::vector<std::byte> first");
  return serializable<T>;
}

template <class T, communicator C> std::vector<T> allgather_serialized(const T& value, C& comm) {
  const std::vector<std::byte> mine = object_bytes(value);
  std::vector<std::uint8_t> all;
  const std::vector<std::size_t> counts =
      allgatherv(const_buffer_view(mine.data(), mine.size(), dtype::u8), all, control_of(comm));
  const auto* bytes = reinterpret_cast<const std::byte*>(all.data());
  // Every rank holds the same bytes now, so every rank finds the same mismatch, if any.
  std::size_t at = 0;
  std::uint64_t first = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    const std::uint64_t fingerprint = fingerprint_of(bytes + at, counts[q]);
    if (q == 0) first = fingerprint;
    if (fingerprint != first) {
      raise_agreed({"allgather_object", comm.rank(), comm.size()},
                   "rank " + std::to_string(q) + " passed a value of another type than rank 0",
                   "Every rank must pass a value of the same type");
    }
    at += counts[q];
  }
  std::vector<T> values;
  values.reserve(counts.size());
  at = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    T v{};
    read_object(bytes + at, counts[q], v);
    values.push_back(std::move(v));
    at += counts[q];
  }
  return values;
}

template <class T, communicator C> void broadcast_serialized(T& value, C& comm, int root) {
  const int p = comm.size();
  std::vector<std::byte> bytes;
  if (comm.rank() == root) bytes = object_bytes(value);
  // Every rank's type, root, and (from the root) the size of the bytes, seen alike by every rank.
  const std::int64_t mine[3] = {static_cast<std::int64_t>(object_codec<T>::fingerprint), root,
                                static_cast<std::int64_t>(bytes.size())};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(p));
  allgather(const_buffer_view(mine, 3, dtype::i64), all, control_of(comm));
  const error_site site{"broadcast_object", comm.rank(), p};
  auto of = [&](int q, std::size_t field) { return all[3 * static_cast<std::size_t>(q) + field]; };
  for (int q = 1; q < p; ++q) {
    if (of(q, 1) != of(0, 1)) {
      std::string roots;
      for (int r = 0; r < p && r < 16; ++r) roots += (r ? ", rank " : "rank ") + std::to_string(r) + ": " + std::to_string(of(r, 1));
      raise_agreed(site, "the root differs across ranks (" + roots + (p > 16 ? ", ...)" : ")"),
                   "Every rank must pass the same root");
    }
  }
  if (root < 0 || root >= p) {
    raise_agreed(site, "root " + std::to_string(root) + " is out of range", "Pass a root in [0, " + std::to_string(p) + ")");
  }
  for (int q = 1; q < p; ++q) {
    if (of(q, 0) != of(0, 0)) {
      raise_agreed(site, "rank " + std::to_string(q) + " passed a value of another type than rank 0",
                   "Every rank must pass a value of the same type");
    }
  }
  bytes.resize(static_cast<std::size_t>(of(root, 2)));
  buffer_view wire{bytes.data(), bytes.size(), dtype::u8, device::cpu()};
  broadcast(wire, control_of(comm), root);
  if (comm.rank() != root) read_object(bytes.data(), bytes.size(), value);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// Every rank's `value`, in rank order.
template <class T, communicator C> std::vector<T> allgather_object(const T& value, C& comm) {
  if constexpr (detail::require_object<T>()) return detail::allgather_serialized(value, comm);
  else return {};
}

// `value` on every rank ends equal to `value` on `root`.
template <class T, communicator C> void broadcast_object(T& value, C& comm, int root = 0) {
  if constexpr (detail::require_object<T>()) detail::broadcast_serialized(value, comm, root);
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_OBJECT_HPP
