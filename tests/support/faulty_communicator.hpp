#pragma once
// A communicator that forwards everything to another one, except that before its n-th data send
// (a message of a collective's data, not of its agreement) it runs a fault: a sleep, a SIGSTOP of
// its own process; made with before_receive(), before its n-th data receive is posted; or, made with
// after_wait(), right after its n-th completed wait (any tag): an exception once this rank has sent
// and received all an operation needs. For the fault-injection
// tests.

#include <herd/comm/communicator.hpp>

#include <functional>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace herd_test {

template <class C> class faulty_communicator {
 public:
  using request = typename C::request;

  // `fault` runs before data send number `at` (0-based) of this rank, once.
  faulty_communicator(C& inner, int at, std::function<void()> fault)
      : inner_(&inner), at_(at), fault_(std::move(fault)) {}

  // `fault` runs before data receive number `at` (0-based) of this rank is posted, once: what a peer
  // sends meanwhile finds no receive.
  static faulty_communicator before_receive(C& inner, int at, std::function<void()> fault) {
    faulty_communicator f(inner, -1, std::move(fault));
    f.receive_at_ = at;
    return f;
  }

  // `fault` runs after wait number `at` (0-based) of this rank returns, once.
  static faulty_communicator after_wait(C& inner, int at, std::function<void()> fault) {
    faulty_communicator f(inner, -1, std::move(fault));
    f.wait_at_ = at;
    return f;
  }

  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }
  const herd::comm_options& options() const { return inner_->options(); }
  herd::detail::operation_state& operations() { return inner_->operations(); }
  bool supports(herd::device d) const { return inner_->supports(d); }
  void abort(std::string_view reason) noexcept { inner_->abort(reason); }
  void check_peers() { inner_->check_peers(); }

  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    if (tag >= herd::detail::data_tag_base && data_sends_++ == at_ && fault_) {
      auto fault = std::exchange(fault_, nullptr);
      fault();
    }
    return inner_->isend(data, bytes, peer, tag);
  }
  request irecv(void* data, std::size_t bytes, int peer, int tag) {
    if (tag >= herd::detail::data_tag_base && data_receives_++ == receive_at_ && fault_) std::exchange(fault_, nullptr)();
    return inner_->irecv(data, bytes, peer, tag);
  }
  void wait(request& r) {
    inner_->wait(r);
    if (waits_++ == wait_at_ && fault_) std::exchange(fault_, nullptr)();
  }
  bool test(request& r) { return inner_->test(r); }
  void sendrecv(const void* s, std::size_t sn, int to, void* r, std::size_t rn, int from, int tag) {
    request rr = irecv(r, rn, from, tag);
    request sr = isend(s, sn, to, tag);
    wait(rr);
    wait(sr);
  }
  faulty_communicator split(int, int) const { throw std::logic_error("faulty_communicator cannot split"); }

  // Data sends and waits made so far.
  int data_sends() const { return data_sends_; }
  int waits() const { return waits_; }

 private:
  C* inner_;
  int at_;
  std::function<void()> fault_;
  int data_sends_ = 0;
  int wait_at_ = -1;
  int receive_at_ = -1;
  int data_receives_ = 0;
  int waits_ = 0;
};

}  // namespace herd_test
