#ifndef HERD_COLLECTIVES_ALLTOALL_HPP
#define HERD_COLLECTIVES_ALLTOALL_HPP
// herd::alltoall and herd::alltoallv: every rank sends a block to every rank; rank i's output holds
// the blocks sent to it, in rank order (MPI_Alltoall, MPI_Alltoallv; Horovod's alltoall).
//
//   herd::alltoall(in, out, comm);                    // p equal blocks each way: in.size() == out.size()
//   herd::alltoallv(in, out, send_splits, receive_splits, comm);
//   auto received = herd::alltoallv(in, out_vector, send_splits, comm);   // learns the receive splits, resizes
//   herd::handle h = herd::alltoall_async(in, out, comm);                  // h.wait() finishes it
//
// Splits are Horovod's: rank r sends send_splits[i] elements to rank i, block after block of its
// input, and receives receive_splits[i] elements from rank i, laid out the same way in its
// output. Each rank's send splits travel with the agreement, so every rank learns what it
// receives, and a receive split that does not match what its sender sends is an error on every
// rank, naming both. Host tensors only; on nccl_communicator it does not compile.
//
// The data move in a pairwise exchange (detail/pairwise.hpp); this rank's own block is copied.

#include <herd/collectives/detail/agreement.hpp>
#include <herd/collectives/detail/host_only.hpp>
#include <herd/collectives/detail/launch.hpp>
#include <herd/collectives/detail/pairwise.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/comm/handle.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/std.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

struct alltoall_call {
  call_check check;
  const_buffer_view in;
  buffer_view out;
  std::vector<std::size_t> send;     // elements to each rank
  std::vector<std::size_t> receive;  // from each rank; empty when they are learnt

  op_label label() const { return tensor_label(check.kind(), in); }
};

// alltoallv with `receive` empty when the receive splits are learnt (the output is sized later).
template <communicator C>
alltoall_call prepare_alltoallv(call_check check, const_buffer_view in, buffer_view out, std::span<const std::size_t> send,
                                std::span<const std::size_t> receive, bool learn, C& comm) {
  const int p = comm.size();
  check.require_valid("input", in);
  check.require_valid("output", out);
  check.require_same_dtype(in, out);
  require_one_per_rank(check, "send splits", send, p);
  if (!learn) require_one_per_rank(check, "receive splits", receive, p);
  if (check.ok()) {
    check.require_count("input", in.count, std::accumulate(send.begin(), send.end(), std::size_t{0}),
                        "the sum of the send splits");
    if (!learn) {
      check.require_count("output", out.count, std::accumulate(receive.begin(), receive.end(), std::size_t{0}),
                          "the sum of the receive splits");
    }
  }
  const auto self = static_cast<std::size_t>(comm.rank());
  if (check.ok() && !learn && p == 1 && send[self] != receive[self]) {
    check.fail(20, "the receive split " + std::to_string(receive[self]) + " differs from the send split " +
                       std::to_string(send[self]) + " of this rank to itself",
               "Receive from each rank what it sends");
  }
  check.require_disjoint(in, out, nullptr, nullptr);
  require_host_tensor(check, "input", in, name(check.kind()));
  require_host_tensor(check, "output", out, name(check.kind()));
  return {std::move(check), in, out, {send.begin(), send.end()}, {receive.begin(), receive.end()}};
}

// alltoallv's agreement carries every rank's send splits, after a flag (whether this rank gave its
// receive splits) and a hash of those receive splits.
inline constexpr std::size_t alltoallv_header_words = 2;

// Up to how many ranks the splits may travel with the agreement, where they fit. (Tests lower it
// to exercise the pairwise exchange of splits; it must be the same on every rank.)
inline int& alltoallv_splits_max_ranks() {
  static int limit = std::numeric_limits<int>::max();
  return limit;
}

template <communicator C> bool splits_travel_with_agreement(C& comm) {
  return comm.size() <= alltoallv_splits_max_ranks() &&
         (static_cast<std::size_t>(comm.size()) + alltoallv_header_words) * sizeof(std::uint64_t) <= payload_capacity(comm);
}

// The receive splits of `rank`, from every rank's send splits, which came with the agreement.
// Every rank checks every rank's receive splits (those it gave) the same way, so a mismatch
// anywhere raises on every rank, naming the rank.
HERD_SEPARATE std::vector<std::size_t> receive_splits_of(const exchanged& all, int p, int rank, const error_site& site);

// With more ranks than the agreement holds splits for: the splits go pairwise, then a second
// agreement tells every rank whether any rank's receive splits differ from what it is sent.
template <communicator C>
std::vector<std::size_t> exchange_splits(C& comm, const signature& mine, const alltoall_call& call, bool learn) {
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  std::vector<std::uint64_t> sent(call.send.begin(), call.send.end());
  std::vector<std::uint64_t> received(static_cast<std::size_t>(p));
  received[r] = sent[r];
  constexpr std::size_t w = sizeof(std::uint64_t);
  pairwise_exchange(
      comm, [&](int to) { return std::pair<void*, std::size_t>(&sent[static_cast<std::size_t>(to)], w); },
      [&](int from) { return std::pair<void*, std::size_t>(&received[static_cast<std::size_t>(from)], w); });
  const std::vector<std::size_t> learnt(received.begin(), received.end());
  call_check matched(op_kind::alltoallv, comm.rank(), p);
  for (std::size_t q = 0; !learn && q < learnt.size(); ++q) {
    if (learnt[q] != call.receive[q]) {
      matched.fail(20, "the receive split for rank " + std::to_string(q) + " is " + std::to_string(call.receive[q]) +
                           ", but that rank sends " + std::to_string(learnt[q]) + " elements",
                   "This rank's receive_splits[i] must be rank i's send_splits[" + std::to_string(r) +
                       "]; or let alltoallv learn them (its std::vector form)");
    }
  }
  agree(comm, mine, matched);
  return learnt;
}

// `output(receive)` returns the output view once the receive splits are known (the learning
// form resizes its vector there).
template <communicator C, class Output> void run_alltoall(C& comm, const alltoall_call& call, Output output) {
  const auto& check = call.check;
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  signature mine;
  mine.type = call.in.type;
  mine.memory = call.in.device.type;
  const bool learn = call.receive.empty();
  std::vector<std::size_t> receive = call.receive;
  if (check.kind() == op_kind::alltoall) {
    mine.count = call.in.count;
    agree(comm, mine, check);
  } else if (p == 1) {
    agree(comm, mine, check);
    receive = call.send;
  } else if (splits_travel_with_agreement(comm)) {
    std::vector<std::uint64_t> words{learn ? 0u : 1u, learn ? 0u : hash_counts(call.receive)};
    words.insert(words.end(), call.send.begin(), call.send.end());
    const exchanged all = agree(comm, mine, check, true, words.data(), words.size() * sizeof(std::uint64_t));
    receive = receive_splits_of(all, p, comm.rank(), {name(op_kind::alltoallv), comm.rank(), p});
  } else {
    agree(comm, mine, check);
    receive = exchange_splits(comm, mine, call, learn);
  }
  const buffer_view out = output(std::span<const std::size_t>(receive));
  const std::size_t es = size_of(call.in.type);
  std::vector<std::size_t> sent_at(static_cast<std::size_t>(p) + 1, 0);
  std::vector<std::size_t> received_at(static_cast<std::size_t>(p) + 1, 0);
  for (std::size_t q = 0; q < static_cast<std::size_t>(p); ++q) {
    sent_at[q + 1] = sent_at[q] + call.send[q] * es;
    received_at[q + 1] = received_at[q] + receive[q] * es;
  }
  const auto* in = static_cast<const std::byte*>(call.in.data);
  auto* base = static_cast<std::byte*>(out.data);
  if (call.send[r] != 0) std::memcpy(base + received_at[r], in + sent_at[r], call.send[r] * es);
  pairwise_exchange(
      comm,
      [&](int to) {
        const auto q = static_cast<std::size_t>(to);
        return std::pair<void*, std::size_t>(const_cast<std::byte*>(in + sent_at[q]), sent_at[q + 1] - sent_at[q]);
      },
      [&](int from) {
        const auto q = static_cast<std::size_t>(from);
        return std::pair<void*, std::size_t>(base + received_at[q], received_at[q + 1] - received_at[q]);
      });
}

template <class In, class Out, communicator C> alltoall_call alltoall_call_of(const In& input, Out& output, C& comm) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::alltoall, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  const auto p = static_cast<std::size_t>(comm.size());
  if (check.ok() && in.count % p != 0) {
    check.fail(18, "the input's " + std::to_string(in.count) + " elements do not split into " + std::to_string(p) +
                       " equal blocks",
               "Pass a multiple of the number of ranks, or use alltoallv");
  }
  check.require_count("output", out.count, in.count, "alltoall receives as many elements as it sends");
  const std::vector<std::size_t> blocks(p, in.count / p);
  return prepare_alltoallv(std::move(check), in, out, blocks, blocks, false, comm);
}

template <class In, class Out, communicator C>
alltoall_call alltoallv_call_of(const In& input, Out& output, std::span<const std::size_t> send,
                                std::span<const std::size_t> receive, C& comm) {
  require_host_communicator<C>();
  require_tensor<In>();
  require_writable_tensor<Out>();
  call_check check(op_kind::alltoallv, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const buffer_view out = check.view("output", output);
  return prepare_alltoallv(std::move(check), in, out, send, receive, false, comm);
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::vector<std::size_t> receive_splits_of(const exchanged& all, int p, int rank,
                                                         const error_site& site) {
  auto word = [&](int q, std::size_t i) {
    std::uint64_t w = 0;
    std::memcpy(&w, all.payload(q) + i * sizeof w, sizeof w);
    return w;
  };
  std::vector<std::size_t> mine;
  std::vector<std::size_t> column(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) {  // what every rank sends rank q
    for (int from = 0; from < p; ++from) {
      column[static_cast<std::size_t>(from)] = word(from, alltoallv_header_words + static_cast<std::size_t>(q));
    }
    if (word(q, 0) != 0 && word(q, 1) != hash_counts(column)) {
      std::string sent;
      for (int from = 0; from < p && from < 16; ++from) {
        sent += (from ? ", " : "") + std::to_string(column[static_cast<std::size_t>(from)]);
      }
      raise_agreed(site,
                   "the receive splits of rank " + std::to_string(q) + " differ from what the ranks send it (" + sent +
                       (p > 16 ? ", ..." : "") + " elements from ranks 0, 1, ...)",
                   "Rank " + std::to_string(q) + "'s receive_splits[i] must be rank i's send_splits[" +
                       std::to_string(q) + "]; or let alltoallv learn them (its std::vector form)");
    }
    if (q == rank) mine = column;
  }
  return mine;
}

#endif  // HERD_SEPARATE_DEFINITIONS

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// `input` holds comm.size() equal blocks, block i for rank i; `output` (as large) receives block r
// of every rank, in rank order.
template <class In, class Out, communicator C> void alltoall(const In& input, Out& output, C& comm) {
  const auto call = detail::alltoall_call_of(input, output, comm);
  detail::run_collective(comm, call.label(), [&](bool) {
    detail::run_alltoall(comm, call, [&](std::span<const std::size_t>) { return call.out; });
  });
}

// Rank r sends send_splits[i] elements to rank i and receives receive_splits[i] from it.
template <class In, class Out, communicator C>
void alltoallv(const In& input, Out& output, std::span<const std::size_t> send_splits,
               std::span<const std::size_t> receive_splits, C& comm) {
  const auto call = detail::alltoallv_call_of(input, output, send_splits, receive_splits, comm);
  detail::run_collective(comm, call.label(), [&](bool) {
    detail::run_alltoall(comm, call, [&](std::span<const std::size_t>) { return call.out; });
  });
}

// Learns what every rank sends this one, resizes `output` to it, exchanges, and returns the
// receive splits.
template <class In, element T, class Allocator, communicator C>
std::vector<std::size_t> alltoallv(const In& input, std::vector<T, Allocator>& output,
                                   std::span<const std::size_t> send_splits, C& comm) {
  detail::require_host_communicator<C>();
  detail::require_tensor<In>();
  detail::call_check check(detail::op_kind::alltoallv, comm.rank(), comm.size());
  const const_buffer_view in = check.const_view("input", input);
  const auto call = detail::prepare_alltoallv(std::move(check), in, view_of(output), send_splits, {}, true, comm);
  std::vector<std::size_t> received;
  detail::run_collective(comm, call.label(), [&](bool) {
    detail::run_alltoall(comm, call, [&](std::span<const std::size_t> receive) {
      received.assign(receive.begin(), receive.end());
      output.resize(std::accumulate(receive.begin(), receive.end(), std::size_t{0}));
      return view_of(output);
    });
  });
  return received;
}

// Asynchronous forms: the operation starts, the handle finishes it (herd::handle).
template <class In, class Out, communicator C> [[nodiscard]] handle alltoall_async(const In& input, Out& output, C& comm) {
  auto call = detail::alltoall_call_of(input, output, comm);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) {
    detail::run_alltoall(comm, call, [&](std::span<const std::size_t>) { return call.out; });
  });
}

template <class In, class Out, communicator C>
[[nodiscard]] handle alltoallv_async(const In& input, Out& output, std::span<const std::size_t> send_splits,
                                     std::span<const std::size_t> receive_splits, C& comm) {
  auto call = detail::alltoallv_call_of(input, output, send_splits, receive_splits, comm);
  const auto label = call.label();
  return detail::start_collective(comm, label, [&comm, call = std::move(call)](bool) {
    detail::run_alltoall(comm, call, [&](std::span<const std::size_t>) { return call.out; });
  });
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_COLLECTIVES_ALLTOALL_HPP
