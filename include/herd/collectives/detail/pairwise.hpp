#ifndef HERD_COLLECTIVES_DETAIL_PAIRWISE_HPP
#define HERD_COLLECTIVES_DETAIL_PAIRWISE_HPP
// The pairwise exchange of alltoall(v): in step k (1 <= k < p) rank r sends its block for rank
// r + k and receives the block of rank r - k, so every step pairs the ranks off and no rank is
// sent to by two others at once. At most ring_window steps are in flight; a block of no bytes
// is not sent (both sides know its size).

#include <herd/collectives/detail/ring.hpp>
#include <herd/comm/communicator.hpp>

#include <cstddef>
#include <deque>
#include <utility>

namespace herd::detail {

//   send_at(to)     -> {pointer, bytes}: this rank's block for rank `to`
//   receive_at(from) -> {pointer, bytes}: where rank `from`'s block goes
template <communicator C, class SendAt, class ReceiveAt>
void pairwise_exchange(C& comm, SendAt send_at, ReceiveAt receive_at) {
  const int p = comm.size();
  const int r = comm.rank();
  const int tag = comm.operations().data_tag();
  struct step {
    typename C::request receive;
    typename C::request send;
  };
  std::deque<step> steps;
  auto finish_oldest = [&] {
    comm.wait(steps.front().receive);
    comm.wait(steps.front().send);
    steps.pop_front();
  };
  for (int k = 1; k < p; ++k) {
    if (steps.size() == ring_window) finish_oldest();
    const int to = (r + k) % p;
    const int from = ring_mod(r - k, p);
    step s;
    if (const auto [at, bytes] = receive_at(from); bytes != 0) s.receive = comm.irecv(at, bytes, from, tag);
    if (const auto [at, bytes] = send_at(to); bytes != 0) s.send = comm.isend(at, bytes, to, tag);
    steps.push_back(std::move(s));
  }
  while (!steps.empty()) finish_oldest();
}

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_PAIRWISE_HPP
