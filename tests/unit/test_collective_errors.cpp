// Bad input to a collective raises herd::error on every rank, with a message naming the problem,
// the rank it came from, and what to do; nothing hangs.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include "../support/local_errors.hpp"

#include <chrono>
#include <string>
#include <vector>

using herd_test::agreed_errors_per_rank;
using herd_test::check_all;
using herd_test::has;

TEST_CASE("null data with a non-zero count on one rank") {
  const auto messages = agreed_errors_per_rank(3, [](herd::local_communicator& comm) {
    std::vector<float> v(10, 1.0f);
    herd::buffer_view view{v.data(), v.size(), herd::dtype::f32};
    if (comm.rank() == 1) view.data = nullptr;
    herd::allreduce(view, comm);
  });
  INFO(messages[1]);
  CHECK(has(messages[1], "herd::allreduce on rank 1 of 3: the input tensor has a null data pointer and 10 elements"));
  CHECK(has(messages[1], "Pass allocated memory"));
  for (std::size_t r : {0u, 2u}) {
    INFO(messages[r]);
    CHECK(has(messages[r], "rank 1 passed a null data pointer with a non-zero element count"));
  }
}

TEST_CASE("a reduce_op the dtype does not support, an invalid dtype, an invalid op") {
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(4);
                              herd::allreduce(v, comm, herd::reduce_op::band);
                            }),
            {"reduce_op::band is not defined on dtype f32", "integer dtypes only"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(4);
                              herd::buffer_view view{v.data(), 4, static_cast<herd::dtype>(99)};
                              herd::allreduce(view, comm);
                            }),
            {"invalid dtype (value 99)"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<int> v(4);
                              herd::allreduce(v, comm, static_cast<herd::reduce_op>(42));
                            }),
            {"invalid reduce_op (value 42)"});
}

TEST_CASE("overlapping input and output buffers") {
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<double> buffer(20);
                              herd::const_buffer_view in(buffer.data(), 10, herd::dtype::f64);
                              herd::buffer_view out{buffer.data() + 5, 10, herd::dtype::f64};
                              herd::allreduce(in, out, comm);
                            }),
            {"the input and output buffers overlap", "in place"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<int> buffer(8);
                              herd::buffer_view out{buffer.data() + 4, 4, herd::dtype::i32};
                              herd::reduce_scatter(herd::const_buffer_view(buffer.data(), 8, herd::dtype::i32), out, comm);
                            }),
            {"the input and output buffers overlap"});
  // allgather may alias its output's own slot only, not another one.
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> all(8);
                              const std::size_t wrong_slot = comm.rank() == 0 ? 4 : 0;
                              herd::allgather(herd::const_buffer_view(all.data() + wrong_slot, 4, herd::dtype::f32), all, comm);
                            }),
            {"the input and output buffers overlap", "own slot"});
}

TEST_CASE("a device tensor handed to a host-only communicator") {
  const auto messages = agreed_errors_per_rank(2, [](herd::local_communicator& comm) {
    std::vector<float> v(4);
    herd::buffer_view view{v.data(), 4, herd::dtype::f32, comm.rank() == 0 ? herd::device::cuda(0) : herd::device::cpu()};
    herd::allreduce(view, comm);
  });
  CHECK(has(messages[0], "lives on cuda:0, which this communicator cannot reach"));
  CHECK(has(messages[0], "nvcc"));
  CHECK(has(messages[0], "nccl_communicator"));
  CHECK(has(messages[1], "rank 0 passed a tensor on a device the communicator cannot reach"));
}

TEST_CASE("element count, dtype or op that differ across ranks") {
  check_all(agreed_errors_per_rank(4,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(comm.rank() == 3 ? 7 : 8);
                              herd::allreduce(v, comm);
                            }),
            {"the element count differs across ranks (rank 0: 8, rank 1: 8, rank 2: 8, rank 3: 7)",
             "same number of elements"});
  check_all(agreed_errors_per_rank(3,
                            [](herd::local_communicator& comm) {
                              if (comm.rank() == 0) {
                                std::vector<double> v(8);
                                herd::allreduce(v, comm);
                              } else {
                                std::vector<float> v(8);
                                herd::allreduce(v, comm);
                              }
                            }),
            {"the dtype differs across ranks (rank 0: f64, rank 1: f32, rank 2: f32)"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(8);
                              herd::allreduce(v, comm, comm.rank() == 0 ? herd::reduce_op::sum : herd::reduce_op::avg);
                            }),
            {"the reduce_op differs across ranks (rank 0: sum, rank 1: avg)"});
}

TEST_CASE("ranks calling different collectives") {
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> v(8);
                              if (comm.rank() == 0) herd::allreduce(v, comm);
                              else herd::broadcast(v, comm, 0);
                            }),
            {"the ranks are in different operations: rank 0 is in allreduce #1 (32 B f32), rank 1 in broadcast #1 (32 B f32)"});
}

TEST_CASE("broadcast roots out of range or differing") {
  const auto out_of_range = agreed_errors_per_rank(3, [](herd::local_communicator& comm) {
    std::vector<int> v(3);
    herd::broadcast(v, comm, comm.rank() == 2 ? 3 : 0);
  });
  CHECK(has(out_of_range[2], "root 3 is out of range"));
  CHECK(has(out_of_range[0], "rank 2 passed a root out of range"));
  check_all(agreed_errors_per_rank(3,
                            [](herd::local_communicator& comm) {
                              std::vector<int> v(3);
                              herd::broadcast(v, comm, comm.rank() == 2 ? 1 : 0);
                            }),
            {"the root differs across ranks (rank 0: 0, rank 1: 0, rank 2: 1)"});
}

TEST_CASE("outputs of the wrong size and allgatherv counts that disagree") {
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(4);
                              std::vector<float> out(7);
                              herd::allgather(in, out, comm);
                            }),
            {"the output tensor has 7 elements but 8 are needed"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(6);
                              std::vector<float> out(4);
                              herd::reduce_scatter(in, out, comm);
                            }),
            {"the input tensor has 6 elements but 8 are needed"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(3);
                              std::vector<float> out(5);
                              const std::vector<std::size_t> counts =
                                  comm.rank() == 0 ? std::vector<std::size_t>{3, 2} : std::vector<std::size_t>{2, 3};
                              herd::allgatherv(in, out, counts, comm);
                            }),
            {"the per-rank counts differ across ranks"});
  check_all(agreed_errors_per_rank(2,
                            [](herd::local_communicator& comm) {
                              std::vector<float> in(3);
                              std::vector<float> out(3);
                              const std::vector<std::size_t> counts{3};
                              herd::allgatherv(in, out, counts, comm);
                            }),
            {"the list of per-rank counts has 1 entries for 2 ranks"});
}

TEST_CASE("after an error the communicator still works") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    std::vector<float> v(comm.rank() == 0 ? 5 : 6, 1.0f);
    CHECK_THROWS_AS(herd::allreduce(v, comm), herd::error);
    v.assign(6, 1.0f);
    herd::allreduce(v, comm);
    CHECK(v[5] == 3.0f);
  });
}
