// Faults on real MPI ranks: a rank delayed or stopped (SIGSTOP) in the middle of a ring, a rank
// that leaves, operations that do not match, protocol options that differ. Every rank must get
// herd::error within seconds, the old communicator must refuse further use, a renewed one must
// compute the right bits, and memory freed right after the error must not crash a peer.

#include <herd/herd.hpp>

#include <herd/runtime/elastic.hpp>

#include "../support/elastic_training.hpp"
#include "../support/faulty_communicator.hpp"
#include "../support/mpi_test.hpp"

#include <signal.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

template <class Fn> std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const herd::error& e) {
    return e.what();
  }
  return "(no error)";
}

// Integer-valued floats: every order of summation gives the same bits.
std::vector<float> ramp(std::size_t n, int rank) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i % 1000) - 500 + 7 * rank);
  return v;
}

std::vector<float> ramp_sum(std::size_t n, int p) {
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < p; ++r) {
    const auto v = ramp(n, r);
    for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

herd::comm_options impatient(double shutdown) {
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = shutdown;
  o.ring_segment_bytes = 256 << 10;  // many segments: the fault lands mid-ring
  return o;
}

// Every rank's pid, through plain MPI.
std::vector<int> pids() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> all(static_cast<std::size_t>(size));
  const int mine = static_cast<int>(::getpid());
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return all;
}

bool stopped(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string skip, state;
  stat >> skip >> skip >> state;  // pid, (name), state
  return state == "T";
}

// After a fault: the old communicator refuses, a renewed one computes the exact sum.
void check_recovery(herd::mpi_communicator& comm, std::size_t n) {
  const std::string later = error_of([&] {
    std::vector<float> v(8);
    herd::allreduce(v, comm);
  });
  INFO(later);
  CHECK(has(later, "this communicator was aborted by an earlier error"));
  herd::mpi_communicator fresh = comm.renew(herd::comm_options{});
  std::vector<float> w = ramp(n, comm.rank());
  herd::allreduce(w, fresh);
  CHECK(w == ramp_sum(n, comm.size()));
}

}  // namespace

HERD_MPI_TEST_CASE("ranks in different operations: both named, on every rank; the communicator stays usable", 2) {
  herd::mpi_communicator comm;
  const std::string message = error_of([&] {
    std::vector<float> v(1 << 20);
    if (comm.rank() == 1) herd::barrier(comm);
    else herd::allreduce(v, comm);
  });
  INFO(message);
  CHECK(has(message, "the ranks are in different operations: rank 0 is in allreduce #1 (4 MiB f32), rank 1 in barrier #1"));
  std::vector<float> v = ramp(1000, comm.rank());
  herd::allreduce(v, comm);
  CHECK(v == ramp_sum(1000, comm.size()));
}

HERD_MPI_TEST_CASE("differing protocol options or a malformed HERD_ variable: an error at creation on every rank", 2) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  herd::comm_options mine;
  mine.check_arguments = rank != 1;
  const std::string differing = error_of([&] { herd::mpi_communicator comm(MPI_COMM_WORLD, mine); });
  INFO(differing);
  CHECK(has(differing, "HERD_CHECK_ARGUMENTS differs across ranks (rank 0: 1, rank 1: 0"));

  auto& problem = herd::runtime::defaults().problem;
  if (rank == 1) problem = "environment variable HERD_FUSION_THRESHOLD='big' is not a number";
  const std::string malformed = error_of([&] { herd::mpi_communicator comm; });
  problem.clear();
  INFO(malformed);
  CHECK(has(malformed, "HERD_FUSION_THRESHOLD='big' is not a number"));
  if (rank != 1) CHECK(has(malformed, "rank 1 has a malformed setting"));
}

HERD_MPI_TEST_CASE("a rank delayed mid-ring: all get the error, freed tensors do not crash a peer, renew is exact", 2) {
  // Rank 1 resumes after 2 s: within the others' shutdown time (1.5 s) plus the same again for
  // settling their sends, past which an abort ends the job.
  herd::mpi_communicator comm(MPI_COMM_WORLD, impatient(1.5));
  herd_test::faulty_communicator<herd::mpi_communicator> faulty(
      comm, comm.rank() == 1 ? 5 : -1, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2000)); });
  const std::size_t n = std::size_t{4} << 20;  // 16 MiB: sends go by rendezvous, the peer reads this memory
  const auto start = clock_type::now();
  auto* data = new std::vector<float>(ramp(n, comm.rank()));
  const std::string message = error_of([&] { herd::allreduce(*data, faulty); });
  delete data;  // at once: MPI must not read it any more (it is unmapped: a read would crash the peer)
  INFO(message);
  CHECK(has(message, "herd::allreduce on rank " + std::to_string(comm.rank())));
  if (comm.rank() == 1) CHECK(has(message, "aborted its operation #1"));  // told by the others, who gave up meanwhile
  else CHECK((has(message, "has waited 1.5 s in allreduce #1 (16 MiB f32)") || has(message, "aborted its operation #1")));
  CHECK(seconds_since(start) < 15);
  check_recovery(comm, 300000);
}

HERD_MPI_TEST_CASE("a rank stopped by SIGSTOP mid-ring and resumed: every rank gets the error, renew is exact", 2) {
  const std::vector<int> all = pids();
  if (herd::mpi::local_size() != static_cast<int>(all.size())) {
    MESSAGE("skipped: the ranks are not all on this node");
    return;
  }
  herd::mpi_communicator comm(MPI_COMM_WORLD, impatient(2.0));  // resumed within twice this: see above
  herd_test::faulty_communicator<herd::mpi_communicator> faulty(comm, comm.rank() == 1 ? 5 : -1,
                                                                 [] { ::kill(::getpid(), SIGSTOP); });
  std::thread resumer;
  if (comm.rank() == 0) {
    resumer = std::thread([pid = all[1]] {
      while (!stopped(pid)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // the others give up meanwhile
      ::kill(pid, SIGCONT);
    });
  }
  const auto start = clock_type::now();
  std::vector<float> v = ramp(std::size_t{1} << 20, comm.rank());
  const std::string message = error_of([&] { herd::allreduce(v, faulty); });
  if (resumer.joinable()) resumer.join();
  INFO(message);
  if (comm.rank() == 1) {
    CHECK(has(message, "aborted its operation #1"));
  } else {
    CHECK((has(message, "has waited 2.0 s in allreduce #1 (4 MiB f32)") || has(message, "aborted its operation #1")));
  }
  CHECK(seconds_since(start) < 20);
  check_recovery(comm, 100000);
}

HERD_MPI_TEST_CASE("a rank that leaves: its peers raise at once, naming it", 2) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto start = clock_type::now();
  if (rank == 1) {
    herd::mpi_communicator leaving;  // created with the others, destroyed before their allreduce
    std::vector<float> v(10, 1.0f);
    herd::allreduce(v, leaving);
  } else {
    herd::mpi_communicator comm;
    std::vector<float> v(10, 1.0f);
    herd::allreduce(v, comm);  // #1, with rank 1
    const std::string message = error_of([&] { herd::allreduce(v, comm); });
    INFO(message);
    // Named directly, or in the abort of a rank that learnt it first.
    CHECK(has(message, "rank 1 finished (it left the communicator after operation #1) while rank "));
    CHECK(has(message, "waits in allreduce #2 (40 B f32)"));
    CHECK(seconds_since(start) < 5);
  }
}

HERD_MPI_TEST_CASE("asynchronous operations interleaved with blocking ones, and a dropped handle", 1) {
  for (bool thread : {true, false}) {
    herd::comm_options options;
    options.progress_thread = thread;
    herd::mpi_communicator comm(MPI_COMM_WORLD, options);
    const int p = comm.size();
    const std::size_t n = 300000;
    std::vector<float> a = ramp(n, comm.rank()), b = ramp(n, comm.rank()), d = ramp(3000, comm.rank());
    std::vector<double> root(9, comm.rank() == 0 ? 2.5 : 0.0);
    std::vector<herd::handle> pending;
    pending.push_back(herd::allreduce_async(a, comm));
    pending.push_back(herd::broadcast_async(root, comm, 0));
    herd::allreduce(d, comm);
    pending.push_back(herd::allreduce_async(herd::views(b), comm, herd::reduce_op::max));
    std::vector<float> dropped = ramp(n, comm.rank());
    {
      herd::handle h = herd::allreduce_async(dropped, comm);  // destroyed unwaited: it waits
    }
    CHECK(dropped == ramp_sum(n, p));
    for (auto& h : pending) h.wait();
    CHECK(a == ramp_sum(n, p));
    CHECK(d == ramp_sum(3000, p));
    CHECK(b == ramp(n, p - 1));
    CHECK(root == std::vector<double>(9, 2.5));
    CHECK(comm.operations().issued() == 6);
  }
}

HERD_MPI_TEST_CASE("a rank waiting for a late peer does not burn its core", 2) {
  herd::mpi_communicator comm;
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  timespec before{}, after{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &before);
  const auto start = clock_type::now();
  std::vector<float> v(1000, 1.0f);
  herd::allreduce(v, comm);
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &after);
  const double cpu = static_cast<double>(after.tv_sec - before.tv_sec) + 1e-9 * static_cast<double>(after.tv_nsec - before.tv_nsec);
  if (comm.rank() == 0) {
    INFO("waited ", seconds_since(start), " s, using ", cpu, " s of CPU");
    CHECK(seconds_since(start) > 1.0);
    CHECK(cpu < 0.3 * seconds_since(start));
  }
}

HERD_MPI_TEST_CASE("messages above the per-message limit travel as one message of a derived datatype", 2) {
  auto& limit = herd::detail::mpi_message_limit();
  const std::size_t saved = limit;
  limit = 1000;  // as if MPI counted in int and these were > 2 GiB
  herd::mpi_communicator comm;
  std::vector<float> v = ramp(1 << 20, comm.rank());
  herd::allreduce(v, comm);
  std::vector<double> b(300001, comm.rank() == 1 ? 3.0 : 0.0);
  herd::broadcast(b, comm, 1);
  limit = saved;
  CHECK(v == ramp_sum(1 << 20, comm.size()));
  CHECK(b == std::vector<double>(300001, 3.0));
}

HERD_MPI_TEST_CASE("the distributed optimizer: gradients that change on one rank raise on every rank", 2) {
  herd::mpi_communicator comm;
  std::vector<float> w(1000, 1.0f), g(1000, 0.5f), extra(3, 0.0f);
  herd::sgd sgd(herd::views(w), herd::views(g), {.lr = 0.1});
  int step = 0;
  herd::distributed_optimizer opt(
      sgd,
      [&] { return step > 0 && comm.rank() == 1 ? herd::views(g, extra) : herd::views(g); }, comm);
  opt.step();
  step = 1;
  const auto start = clock_type::now();
  const std::string message = error_of([&] { opt.step(); });
  INFO(message);
  CHECK(seconds_since(start) < 5);
  if (comm.rank() == 1) CHECK(has(message, "the gradients changed since the first step"));
  else CHECK(has(message, "rank 1 passed gradients that differ from those of the first step"));
}

HERD_MPI_TEST_CASE("a user's tag in herd's reserved range is refused; a collective's data cannot be taken", 2) {
  herd::mpi_communicator comm;
  const int peer = (comm.rank() + 1) % comm.size();
  std::vector<float> v(16, 1.0f);
  for (int tag : {herd::reserved_tag_base, herd::detail::data_tag(1), 32767}) {
    const std::string send = error_of([&] { (void)comm.isend(v.data(), 64, peer, tag); });
    const std::string receive = error_of([&] { (void)comm.irecv(v.data(), 64, peer, tag); });
    INFO(send, " | ", receive);
    CHECK(has(send, "herd::isend on rank " + std::to_string(comm.rank())));
    CHECK(has(send, "tag " + std::to_string(tag) + " is in herd's reserved range [16384, 32767]"));
    CHECK(has(receive, "herd::irecv on rank " + std::to_string(comm.rank())));
    CHECK(has(receive, "Use a tag in [0, herd::reserved_tag_base) = [0, 16384)"));
  }
  std::vector<float> w = ramp(65536, comm.rank());
  herd::allreduce(w, comm);
  CHECK(w == ramp_sum(65536, comm.size()));
}

HERD_MPI_TEST_CASE("ring_segment_bytes = 0 set in code: an error at creation on every rank, not a crash later", 2) {
  herd::comm_options zero;
  zero.ring_segment_bytes = 0;
  zero.allreduce_algorithm = herd::algorithm::ring;  // the broadcast's chain cuts the tensor into segments
  const std::string message = error_of([&] {
    herd::mpi_communicator comm(MPI_COMM_WORLD, zero);
    std::vector<float> v(100000, 1.0f);
    herd::broadcast(v, comm, 0);
  });
  INFO(message);
  CHECK(has(message, "herd::communicator on rank "));
  CHECK(has(message, "comm_options::ring_segment_bytes (HERD_RING_SEGMENT_BYTES) is 0"));
}

HERD_MPI_TEST_CASE("renew after an operation that completed on some ranks only: an error on every rank, naming each rank's last", 2) {
  herd::mpi_communicator comm;
  // Rank 0 fails allreduce #1 once it has sent and received all of it (its last wait of the
  // agreement, which carries the data); the others complete #1 and fail in #2.
  const int last_wait = 2 * static_cast<int>(std::ceil(std::log2(comm.size()))) - 1;
  auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::after_wait(
      comm, comm.rank() == 0 ? last_wait : -1, [] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        throw herd::error("injected failure");
      });
  std::vector<std::int32_t> step{1};
  const std::string first = error_of([&] {
    herd::allreduce(step, faulty);
    step = {2};
    herd::allreduce(step, faulty);
  });
  INFO(first);
  CHECK(has(first, comm.rank() == 0 ? "injected failure" : "rank 0 aborted its operation #1"));
  const std::string renewal = error_of([&] { herd::mpi_communicator fresh = comm.renew(); });
  INFO(renewal);
  CHECK(has(renewal, "the ranks last completed different operations of the communicator they renew (rank 0: its "
                     "creation (#0), rank 1: allreduce #1 (4 B i32)"));
  herd::mpi_communicator fresh = comm.renew(comm.options(), herd::rolled_back);
  step = {1};
  herd::allreduce(step, fresh);
  CHECK(step[0] == comm.size());
}

HERD_MPI_TEST_CASE("an abort whose send a stalled peer does not take: bounded by the shutdown time, the buffer named as MPI's", 2) {
  // With end_job_if_unsettled off, rank 0 raises within twice the shutdown time (the watchdog, then
  // the settling), not when rank 1 resumes, and says that its send's buffer still belongs to MPI.
  herd::comm_options o = impatient(0.5);
  o.end_job_if_unsettled = false;
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  // Rank 1 stalls before it posts a receive for the data: rank 0's sends (256 KiB segments, past
  // MPI's eager size) cannot complete until it does.
  auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::before_receive(
      comm, comm.rank() == 1 ? 0 : -1, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2500)); });
  const std::size_t n = std::size_t{4} << 20;
  std::vector<float> data = ramp(n, comm.rank());  // kept until rank 1 has taken it (check_recovery)
  const auto start = clock_type::now();
  const std::string message = error_of([&] { herd::allreduce(data, faulty); });
  const double seconds = seconds_since(start);
  INFO(message);
  if (comm.rank() == 0) {
    CHECK(seconds < 1.9);
    CHECK(has(message, "has waited 0.5 s in allreduce #1 (16 MiB f32)"));
    CHECK(has(message, "rank 0 could not settle allreduce #1 (16 MiB f32) within HERD_STALL_SHUTDOWN_TIME_SECONDS=0.5 s: rank 1 did not take what it sent"));
    CHECK(has(message, "those buffers still belong to MPI"));
  }
  check_recovery(comm, 1000);
}

HERD_MPI_TEST_CASE("a rank that gives up on a peer that says nothing returns at once, without waiting for it", 2) {
  herd::mpi_communicator comm(MPI_COMM_WORLD, impatient(0.5));
  // Rank 1 stays away for 2 s: rank 0 gives up in the agreement (its own message went eagerly, so
  // it has nothing to settle) and must not wait for rank 1's word on top of the shutdown time.
  if (comm.rank() == 0) {
    const auto start = clock_type::now();
    std::vector<float> v(1000, 1.0f);
    const std::string message = error_of([&] { herd::allreduce(v, comm); });
    INFO(message);
    CHECK(has(message, "has waited 0.5 s in allreduce #1 (3.91 KiB f32)"));
    CHECK(seconds_since(start) < 1.2);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  }
  herd::mpi_communicator fresh = comm.renew(herd::comm_options{});
  std::vector<float> w = ramp(1000, comm.rank());
  herd::allreduce(w, fresh);
  CHECK(w == ramp_sum(1000, comm.size()));
}

namespace {
// run_elastic on real ranks: 4096 parameters, a gradient of arbitrary floats averaged across ranks
// (16 KiB: the ring, with data messages), a commit every 4 steps; `fault` runs on rank `on` after
// its wait number `at` (or never). Returns this rank's final parameters; `waits` gets rank 0's
// count of waits after each step.
std::vector<float> train_elastic(int on, int at, std::function<void()> fault, std::vector<int>* waits = nullptr) {
  herd::comm_options o = impatient(0.5);
  o.ring_segment_bytes = 4096;
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  std::vector<float> w(4096, 0.5f);
  std::int64_t step = 0;
  const int rank = comm.rank();
  auto faulty = herd_test::faulty_communicator<herd::mpi_communicator>::after_wait(comm, rank == on ? at : -1, fault);
  const int attempts = herd_test::train_elastic_steps(comm, faulty, w, step, 16, [&](int) {
    if (waits != nullptr) waits->push_back(faulty.waits());
  });
  if (fault) CHECK(attempts == 2);
  return w;
}
}  // namespace

HERD_MPI_TEST_CASE("run_elastic on MPI ranks: a rank failing an allreduce the others completed; the fault-free bits", 2) {
  std::vector<int> waits;
  const std::vector<float> clean = train_elastic(-1, -1, nullptr, &waits);
  REQUIRE(waits.size() == 16);
  MPI_Bcast(waits.data(), 16, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's counts
  // Rank 0 fails step 8's allreduce after its last wait: the others complete it and commit (#3)
  // while rank 0 holds #2. Then an exception in the middle of step 13's allreduce on rank 0.
  for (int at : {waits[7] - 1, waits[11] + (waits[12] - waits[11]) / 2}) {
    INFO("fault after wait ", at);
    const std::vector<float> faulted = train_elastic(0, at, [] { throw herd::error("injected failure"); });
    CHECK(faulted == clean);
  }
}

// A herd::error raised between operations on one rank (its own code, not a collective) has told
// no peer: run_elastic aborts the communicator to tell them, so that every rank rolls back at once,
// well within the shutdown time, instead of each waiting for its watchdog.
HERD_MPI_TEST_CASE("run_elastic: a herd::error raised outside any operation on one rank; every rank recovers at once", 2) {
  const double shutdown = 3;
  herd::comm_options o = impatient(shutdown);
  std::vector<float> clean;
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    std::vector<float> w(4096, 0.5f);
    std::int64_t step = 0;
    herd_test::train_elastic_steps(comm, comm, w, step, 12);
    clean = w;
  }
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  for (int on : {0, p - 1}) {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    const int rank = comm.rank();
    std::vector<float> w(4096, 0.5f);
    std::int64_t step = 0;
    const auto start = clock_type::now();
    const int attempts = herd_test::train_elastic_steps(comm, comm, w, step, 12, [&](int attempt) {
      if (rank == on && step == 6 && attempt == 1) throw herd::error("a failure planted between operations");
    });
    const double took = seconds_since(start);
    INFO("the failure on rank ", on, "; rank ", rank, " took ", took, " s");
    CHECK(attempts == 2);
    CHECK(w == clean);
    CHECK(took < shutdown / 2);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
