// Bad input on real MPI ranks: every rank raises herd::error within seconds, naming the problem.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using herd_test::has;

namespace {

// Runs fn, expecting herd::error; returns its message, and checks it came quickly.
template <class Fn> std::string error_of(Fn fn) {
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    fn();
  } catch (const herd::error& e) {
    message = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  return message;
}

}  // namespace

HERD_MPI_TEST_CASE("a count that differs on the last rank fails on every rank", 2) {
  herd::mpi_communicator comm;
  const bool last = comm.rank() == comm.size() - 1;
  const std::string message = error_of([&] {
    std::vector<float> v(last ? 9 : 10);
    herd::allreduce(v, comm);
  });
  INFO(message);
  CHECK(has(message, "herd::allreduce on rank " + std::to_string(comm.rank())));
  CHECK(has(message, "the element count differs across ranks"));
  CHECK(has(message, "rank " + std::to_string(comm.size() - 1) + ": 9"));
  // The communicator is still usable afterwards.
  std::vector<float> v(4, 1.0f);
  herd::allreduce(v, comm);
  CHECK(v[3] == static_cast<float>(comm.size()));
}

HERD_MPI_TEST_CASE("a dtype or op that differs fails on every rank", 2) {
  herd::mpi_communicator comm;
  const std::string dtype_message = error_of([&] {
    if (comm.rank() == 1) {
      std::vector<std::int64_t> v(10);
      herd::allreduce(v, comm);
    } else {
      std::vector<std::int32_t> v(10);
      herd::allreduce(v, comm);
    }
  });
  INFO(dtype_message);
  CHECK(has(dtype_message, "the dtype differs across ranks (rank 0: i32, rank 1: i64"));
  const std::string op_message = error_of([&] {
    std::vector<float> v(10);
    herd::allreduce(v, comm, comm.rank() == 0 ? herd::reduce_op::max : herd::reduce_op::min);
  });
  INFO(op_message);
  CHECK(has(op_message, "the reduce_op differs across ranks (rank 0: max, rank 1: min"));
}

HERD_MPI_TEST_CASE("a bad argument on one rank fails every rank", 2) {
  herd::mpi_communicator comm;
  const std::string message = error_of([&] {
    std::vector<float> v(10);
    herd::buffer_view view{v.data(), v.size(), herd::dtype::f32};
    if (comm.rank() == 1) view.data = nullptr;
    herd::allreduce(view, comm);
  });
  INFO(message);
  if (comm.rank() == 1) CHECK(has(message, "the input tensor has a null data pointer and 10 elements"));
  else CHECK(has(message, "rank 1 passed a null data pointer"));

  const std::string device_message = error_of([&] {
    std::vector<float> v(10);
    herd::buffer_view view{v.data(), v.size(), herd::dtype::f32, herd::device::cuda(0)};
    herd::allreduce(view, comm);
  });
  INFO(device_message);
  CHECK(has(device_message, "lives on cuda:0, which this communicator cannot reach"));

  const std::string pair_message = error_of([&] {
    std::vector<double> v(10);
    herd::allreduce(v, comm, herd::reduce_op::bxor);
  });
  CHECK(has(pair_message, "reduce_op::bxor is not defined on dtype f64"));
}

HERD_MPI_TEST_CASE("a second thread issuing an operation while another thread is in one of the same communicator: every rank raises", 2) {
  // Rank 0's main thread waits in an allreduce for the others, which come 1 s late; 200 ms in, a
  // second thread of rank 0 starts an allreduce of the same communicator.
  herd::mpi_communicator comm;
  std::string second;
  std::thread other;
  if (comm.rank() == 0) {
    other = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<float> b(1000, 100.0f);
      try {
        herd::allreduce(b, comm);
      } catch (const herd::error& e) {
        second = e.what();
      }
    });
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  std::vector<float> a(1000, 1.0f);
  std::string first;
  try {
    herd::allreduce(a, comm);
  } catch (const herd::error& e) {
    first = e.what();
  }
  if (other.joinable()) other.join();
  INFO(first);
  if (comm.rank() == 0) {
    CHECK(has(second, "herd::allreduce on rank 0 of " + std::to_string(comm.size()) +
                          ": another thread of this rank is issuing or running an operation of this communicator at the same time"));
    CHECK(has(first, "another thread of this rank issued an operation of this communicator while this one ran"));
  } else if (first.empty()) {  // it paired with rank 0's first allreduce, and ended before the abort
    CHECK(a[0] == static_cast<float>(comm.size()));
  }
  // Every rank raises by its next call at the latest.
  const std::string after = error_of([&] { herd::barrier(comm); });
  INFO(after);
  CHECK(has(after, "aborted"));
}

HERD_MPI_TEST_CASE("a rank waiting for a message that never comes gives up after the stall shutdown time", 2) {
  herd::comm_options options;
  options.stall_check_seconds = 0;
  options.stall_shutdown_seconds = 1;
  herd::mpi_communicator comm(MPI_COMM_WORLD, options);
  herd::mpi_communicator patient;  // the others wait here, longer than the shutdown time
  if (comm.rank() == 0) {
    const std::string message = error_of([&] {
      int x = 0;
      auto r = comm.irecv(&x, sizeof x, 1, 11);
      comm.wait(r);
    });
    INFO(message);
    CHECK(has(message, "rank 0 has waited 1.0 s to receive from rank 1 (tag 11)"));
  }
  herd::barrier(patient);
}

HERD_MPI_TEST_CASE("environment and communicator misuse", 1) {
  // The environment guard adopts the running MPI instead of initializing it again.
  herd::mpi::environment again;
  CHECK_FALSE(again.owns());
  herd::mpi_communicator comm;
  CHECK_THROWS_AS(comm.split(-1, 0), herd::error);
  int x = 0;
  CHECK_THROWS_AS(comm.isend(&x, sizeof x, comm.size(), 0), herd::error);
  CHECK_THROWS_AS(comm.irecv(nullptr, 4, 0, 0), herd::error);
}

// Run only by the ctest mpi_harness_fails_on_one_rank (doctest::skip keeps it out of normal runs):
// proves that a failure on rank 1 alone fails every rank's exit code and is printed by rank 1.
TEST_CASE("harness self-check: a check that fails on rank 1 only" * doctest::skip()) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CHECK(rank != 1);
}

HERD_MPI_TEST_CASE("local_rank and local_size: every rank of this one-node job is local", 1) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(herd::mpi::local_rank() == rank);
  CHECK(herd::mpi::local_size() == size);
  // Asked once on every rank, the answer is kept: a call on one rank alone does not wait for the
  // others (it used to run MPI_Comm_split_type, a collective, every time).
  if (rank == 0) {
    CHECK(herd::mpi::local_rank() == 0);
    CHECK(herd::mpi::local_size() == size);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

HERD_MPI_TEST_CASE("cuda_aware: what the MPI says, unless HERD_MPI_CUDA_AWARE overrides it", 1) {
  ::setenv("HERD_MPI_CUDA_AWARE", "1", 1);
  CHECK(herd::mpi::cuda_aware());
  CHECK(herd::mpi_communicator().cuda_aware());
  ::setenv("HERD_MPI_CUDA_AWARE", "0", 1);
  CHECK_FALSE(herd::mpi::cuda_aware());
  ::unsetenv("HERD_MPI_CUDA_AWARE");
  MESSAGE("this MPI reports CUDA awareness: " << herd::mpi::cuda_aware());
}

HERD_MPI_TEST_CASE("HERD_MPI_CUDA_AWARE neither 0 nor 1 is an error; on one rank, every rank's creation raises", 1) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::setenv("HERD_MPI_CUDA_AWARE", "off", 1);
  const std::string direct = error_of([] { (void)herd::mpi::cuda_aware(); });
  CHECK(has(direct, "HERD_MPI_CUDA_AWARE='off' is neither 0 nor 1"));
  if (rank != 0) ::unsetenv("HERD_MPI_CUDA_AWARE");
  const std::string created = error_of([] { herd::mpi_communicator comm; });
  ::unsetenv("HERD_MPI_CUDA_AWARE");
  INFO(created);
  CHECK(has(created, "HERD_MPI_CUDA_AWARE='off' is neither 0 nor 1"));
  herd::mpi_communicator comm;  // fine again
  CHECK(comm.size() >= 1);
}

HERD_MPI_TEST_CASE("wait() and test() on a communicator that was left raise herd::error, and the request still settles", 1) {
  herd::mpi_communicator comm;
  float word = 0;
  herd::mpi_communicator::request r = comm.irecv(&word, sizeof word, comm.rank(), 7);  // nothing ever comes
  comm.leave();
  const std::string waited = error_of([&] { comm.wait(r); });
  CHECK(has(waited, "this communicator is empty: it was moved from, or left (leave())"));
  const std::string tested = error_of([&] { (void)comm.test(r); });
  CHECK(has(tested, "this communicator is empty"));
  CHECK(r.pending());  // its destructor cancels the receive
}
