#pragma once
// A communicator shaped like nccl_communicator, without a GPU, for testing how herd treats
// communicators with native collectives.

#include <herd/comm/local.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace herd_test {

// Reaches cuda:0 only, like an nccl_communicator built on device 0; its argument checks travel
// over a local_communicator, and its native collectives only record what they were asked.
class native_stand_in {
 public:
  using request = herd::local_communicator::request;
  explicit native_stand_in(herd::local_communicator& host) : host_(&host) {}

  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }
  request isend(const void* d, std::size_t n, int peer, int tag) { return host_->isend(d, n, peer, tag); }
  request irecv(void* d, std::size_t n, int peer, int tag) { return host_->irecv(d, n, peer, tag); }
  void wait(request& r) { host_->wait(r); }
  bool test(request& r) { return host_->test(r); }
  void sendrecv(const void* s, std::size_t sn, int to, void* r, std::size_t rn, int from, int tag) {
    host_->sendrecv(s, sn, to, r, rn, from, tag);
  }
  native_stand_in split(int, int) const { return *this; }
  const herd::comm_options& options() const { return host_->options(); }
  herd::detail::operation_state& operations() { return host_->operations(); }
  void abort(std::string_view reason) noexcept { host_->abort(reason); }
  bool supports(herd::device d) const { return d == herd::device::cuda(0); }
  herd::local_communicator& control() { return *host_; }

  void native_allreduce(herd::const_buffer_view, herd::buffer_view, herd::reduce_op op) { calls.push_back("allreduce " + std::string(herd::name(op))); }
  void native_broadcast(herd::buffer_view, int root) { calls.push_back("broadcast " + std::to_string(root)); }
  void native_allgather(herd::const_buffer_view, herd::buffer_view) { calls.push_back("allgather"); }
  void native_reduce_scatter(herd::const_buffer_view, herd::buffer_view, herd::reduce_op) { calls.push_back("reduce_scatter"); }
  void synchronize() { calls.push_back("synchronize"); }

  std::vector<std::string> calls;

 private:
  herd::local_communicator* host_;
};

}  // namespace herd_test
