// The collectives through shared memory (ranks on one node), the hierarchical allreduce (nodes
// simulated by HERD_SIMULATE_NODE_SIZE's option), and their faults, on real MPI ranks. Each result
// is compared with herd's ring (a communicator that uses MPI messages only) and with MPI's own
// collective, bit for bit on values every order of reduction adds up exactly, and checked to be
// the same bits on every rank and from one run to the next on arbitrary floats.

#include <herd/herd.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_world.hpp"
#include "../support/mpi_test.hpp"
#include "../support/reference.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace {

using herd_test::error_of;
using herd_test::has;
using herd_test::rng;
using herd_test::values;
using bytes = std::vector<std::byte>;
constexpr const char* no_error = "(no herd::error)";  // what error_of says when fn() raises none

herd::comm_options with(herd::algorithm a, std::size_t slice = std::size_t{1} << 20, int node_size = 0) {
  herd::comm_options o;
  o.allreduce_algorithm = a;
  o.shm_slice_bytes = slice;
  o.simulated_node_size = node_size;
  return o;
}

// Small slices: a few thousand elements already take several steps.
constexpr std::size_t small_slice = 4096;

// Shared memory with the argument checks on or off, and a stall that ends every rank's wait in 2 s.
herd::comm_options with_checks(bool checks, std::size_t slice = std::size_t{1} << 20) {
  herd::comm_options o = with(herd::algorithm::shared_memory, slice);
  o.check_arguments = checks;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 2;
  return o;
}

// Rank r's input for a case, drawn from a seed every rank knows.
bytes input_of(std::uint64_t seed, int r, herd::dtype t, std::size_t n, herd::reduce_op op, values mode) {
  bytes out(n * herd::size_of(t));
  herd::visit(t, [&](auto element) {
    using T = decltype(element);
    rng g(seed * 1000003 + static_cast<std::uint64_t>(r));
    const std::vector<T> v = herd_test::draw_vector<T>(g, n, mode, op);
    if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  });
  return out;
}

std::uint64_t hash_of(const bytes& b) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::byte x : b) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
  return h;
}

// Whether every rank of MPI_COMM_WORLD holds these bytes.
bool same_on_every_rank(const bytes& b) {
  const auto h = static_cast<unsigned long long>(hash_of(b));
  const unsigned long long mine[2] = {h, ~h};
  unsigned long long most[2] = {0, 0};
  MPI_Allreduce(mine, most, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return most[0] == ~most[1];
}

using herd_test::mpi_type;

// Whether MPI's reductions of this dtype can serve as a reference. Not for 8-bit integers: MPICH
// 4.0.2 compares unsigned 8-bit values as signed in MPI_MAX and MPI_MIN (the max of 10, 110 and
// 210 is 110 there), and Open MPI 4.1's AVX reductions saturate 8-bit sums (100 + 100 gives 127,
// not -56, past the first elements). Those are checked against herd's ring only.
bool mpi_reduces_right(herd::dtype t) { return t != herd::dtype::i8 && t != herd::dtype::u8; }

// MPI's op where it gives the same bits as herd's on the values drawn (min and max draw NaNs,
// which MPI orders as it likes; avg has no MPI op).
MPI_Op mpi_op(herd::dtype t, herd::reduce_op op) {
  if (!mpi_reduces_right(t)) return MPI_OP_NULL;
  const bool integral = t == herd::dtype::i32 || t == herd::dtype::i64;
  switch (op) {
    case herd::reduce_op::sum: return MPI_SUM;
    case herd::reduce_op::prod: return MPI_PROD;
    case herd::reduce_op::min: return integral ? MPI_MIN : MPI_OP_NULL;
    case herd::reduce_op::max: return integral ? MPI_MAX : MPI_OP_NULL;
    case herd::reduce_op::band: return MPI_BAND;
    case herd::reduce_op::bor: return MPI_BOR;
    case herd::reduce_op::bxor: return MPI_BXOR;
    default: return MPI_OP_NULL;
  }
}

const herd::dtype every_dtype[] = {herd::dtype::f32, herd::dtype::f64, herd::dtype::f16, herd::dtype::bf16,
                                   herd::dtype::i32, herd::dtype::i64, herd::dtype::i8,  herd::dtype::u8};
const herd::reduce_op every_op[] = {herd::reduce_op::sum,  herd::reduce_op::avg, herd::reduce_op::min,
                                    herd::reduce_op::max,  herd::reduce_op::prod, herd::reduce_op::band,
                                    herd::reduce_op::bor,  herd::reduce_op::bxor};

herd::buffer_view view(bytes& b, herd::dtype t) { return {b.data(), b.size() / herd::size_of(t), t}; }

bytes allreduce_with(herd::mpi_communicator& c, const bytes& in, herd::dtype t, herd::reduce_op op, bool in_place) {
  bytes out = in;
  if (in_place) {
    herd::buffer_view v = view(out, t);
    herd::allreduce(v, c, op);
  } else {
    bytes source = in;
    herd::buffer_view src = view(source, t);
    herd::buffer_view dst = view(out, t);
    herd::allreduce(src, dst, c, op);
  }
  return out;
}

// Counts that matter: none, fewer than the ranks, about the ranks, within one small slice, over
// several, and past the one-shot size.
std::vector<std::size_t> counts_for(int p) {
  const auto q = static_cast<std::size_t>(p);
  return {0, 1, q + 1, 1000, 3001, 70001};
}

struct communicators {
  herd::mpi_communicator shm{MPI_COMM_WORLD, with(herd::algorithm::automatic, small_slice)};
  herd::mpi_communicator ring{MPI_COMM_WORLD, with(herd::algorithm::ring)};
  int rank = shm.rank();
  int size = shm.size();
};

}  // namespace

HERD_MPI_TEST_CASE("shared memory: ranks of one node find it; forced ring does not use it", 1) {
  communicators w;
  CHECK((w.shm.shared_node() != nullptr) == (w.size > 1));
  CHECK(w.shm.node_part() == nullptr);
  CHECK(w.ring.shared_node() == nullptr);
  if (w.size > 1) {
    const herd::detail::shm_node& node = *w.shm.shared_node();
    CHECK(node.slice_bytes() == small_slice);
    // The allreduce's slice is half a buffer, unless the ranks outnumber the node's processors (at
    // 3 and 4 ranks on a 2-core machine: both rules run in this suite's runs there).
    const bool outnumbered = w.size > ::sysconf(_SC_NPROCESSORS_ONLN);
    INFO(w.size, " ranks, ", ::sysconf(_SC_NPROCESSORS_ONLN), " processors online");
    CHECK(node.allreduce_slice_bytes() == (outnumbered ? small_slice : small_slice / 2));
  }
}

// A node whose segment cannot be made (here: node rank 0 may not grow a file past 64 KiB, so
// sizing the segment fails with EFBIG) falls back to MPI messages, and every rank says so on its
// own stderr, naming itself and the rank that failed; the allreduce is still exact.
HERD_MPI_TEST_CASE("shared memory that cannot be made: every rank warns that it falls back, and stays exact", 2) {
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fflush(stderr);
  char path[] = "/tmp/herd-fallback-XXXXXX";
  const int capture = ::mkstemp(path);
  REQUIRE(capture >= 0);
  ::unlink(path);
  const int saved_stderr = ::dup(2);
  ::dup2(capture, 2);
  rlimit before{};
  ::getrlimit(RLIMIT_FSIZE, &before);
  void (*old_handler)(int) = SIG_DFL;
  if (world_rank == 0) {
    old_handler = ::signal(SIGXFSZ, SIG_IGN);  // an oversized ftruncate then fails with EFBIG instead of a signal
    rlimit small = before;
    small.rlim_cur = 64 * 1024;
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  std::string warned;
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD);
    if (world_rank == 0) {
      ::setrlimit(RLIMIT_FSIZE, &before);
      ::signal(SIGXFSZ, old_handler);
    }
    std::fflush(stderr);
    ::dup2(saved_stderr, 2);
    ::close(saved_stderr);
    char text[4096] = {};
    const ssize_t got = ::pread(capture, text, sizeof text - 1, 0);
    ::close(capture);
    warned.assign(text, got > 0 ? static_cast<std::size_t>(got) : 0);
    INFO(warned);
    CHECK(comm.shared_node() == nullptr);
    CHECK(has(warned, "herd warning (rank " + std::to_string(world_rank) + " of " + std::to_string(comm.size()) + ")"));
    CHECK(has(warned, "rank 0 could not share memory with its node"));
    std::vector<float> v(10000, static_cast<float>(world_rank + 1));
    herd::allreduce(v, comm);
    CHECK(v.back() == static_cast<float>(comm.size() * (comm.size() + 1) / 2));
  }
}

HERD_MPI_TEST_CASE("shared memory allreduce: the ring's bits and MPI's, on every rank, every dtype and op", 1) {
  communicators w;
  rng pick(5);
  for (herd::dtype t : every_dtype) {
    for (herd::reduce_op op : every_op) {
      if (!herd::supports(t, op)) continue;
      for (std::size_t n : counts_for(w.size)) {
        const bool in_place = pick.below(2) == 0;
        INFO("dtype ", herd::name(t), " op ", herd::name(op), " count ", n, in_place ? " in place" : "");
        const std::uint64_t seed = 17 * n + 101 * static_cast<std::uint64_t>(op) + static_cast<std::uint64_t>(t);
        const bytes mine = input_of(seed, w.rank, t, n, op, values::exact);
        const bytes got = allreduce_with(w.shm, mine, t, op, in_place);
        CHECK(got == allreduce_with(w.ring, mine, t, op, in_place));
        if (const MPI_Op mo = mpi_op(t, op); mo != MPI_OP_NULL && mpi_type(t) != MPI_DATATYPE_NULL) {
          bytes theirs = mine;
          MPI_Allreduce(MPI_IN_PLACE, theirs.data(), static_cast<int>(n), mpi_type(t), mo, MPI_COMM_WORLD);
          CHECK(got == theirs);
        }
        CHECK(same_on_every_rank(got));
      }
    }
  }
}

HERD_MPI_TEST_CASE("shared memory allreduce of arbitrary floats: the same bits on every rank and in every run", 1) {
  communicators w;
  herd::mpi_communicator big_slices;  // the default slice: 1 MiB
  for (herd::dtype t : {herd::dtype::f32, herd::dtype::f16, herd::dtype::bf16, herd::dtype::f64}) {
    for (herd::reduce_op op : {herd::reduce_op::sum, herd::reduce_op::avg, herd::reduce_op::prod}) {
      for (std::size_t n : {std::size_t{3001}, std::size_t{700001}}) {
        INFO("dtype ", herd::name(t), " op ", herd::name(op), " count ", n);
        const bytes mine = input_of(n + 7, w.rank, t, n, op, values::rough);
        herd::mpi_communicator& c = n > 10000 ? big_slices : w.shm;
        const bytes first = allreduce_with(c, mine, t, op, true);
        CHECK(same_on_every_rank(first));
        CHECK(allreduce_with(c, mine, t, op, false) == first);
      }
    }
  }
}

HERD_MPI_TEST_CASE("shared memory reduce_scatter, allgather(v) and broadcast: the ring's bits and MPI's", 1) {
  communicators w;
  const auto p = static_cast<std::size_t>(w.size);
  for (herd::dtype t : every_dtype) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{777}, std::size_t{2500}}) {
      INFO("dtype ", herd::name(t), " block ", block);
      const herd::reduce_op op = herd::reduce_op::sum;
      const std::uint64_t seed = 31 * block + static_cast<std::uint64_t>(t);
      const std::size_t es = herd::size_of(t);

      // reduce_scatter: block r of the sum ends on rank r.
      const bytes mine = input_of(seed, w.rank, t, block * p, op, values::exact);
      bytes shm_part(block * es), ring_part(block * es);
      herd::buffer_view in_view{const_cast<std::byte*>(mine.data()), block * p, t};
      herd::buffer_view shm_view = view(shm_part, t), ring_view = view(ring_part, t);
      herd::reduce_scatter(in_view, shm_view, w.shm, op);
      herd::reduce_scatter(in_view, ring_view, w.ring, op);
      CHECK(shm_part == ring_part);
      if (mpi_type(t) != MPI_DATATYPE_NULL && mpi_reduces_right(t)) {
        bytes theirs(block * es);
        MPI_Reduce_scatter_block(mine.data(), theirs.data(), static_cast<int>(block), mpi_type(t), MPI_SUM, MPI_COMM_WORLD);
        CHECK(shm_part == theirs);
      }

      // allgatherv: rank r contributes block + r elements.
      std::vector<std::size_t> counts;
      std::vector<int> mpi_counts, mpi_offsets;
      std::size_t total = 0;
      for (std::size_t r = 0; r < p; ++r) {
        counts.push_back(block + r);
        mpi_counts.push_back(static_cast<int>((block + r) * es));
        mpi_offsets.push_back(static_cast<int>(total * es));
        total += block + r;
      }
      const bytes piece = input_of(seed + 1, w.rank, t, counts[static_cast<std::size_t>(w.rank)], op, values::exact);
      bytes shm_all(total * es), ring_all(total * es), mpi_all(total * es);
      herd::buffer_view piece_view{const_cast<std::byte*>(piece.data()), piece.size() / es, t};
      herd::buffer_view shm_all_view = view(shm_all, t), ring_all_view = view(ring_all, t);
      herd::allgatherv(piece_view, shm_all_view, counts, w.shm);
      herd::allgatherv(piece_view, ring_all_view, counts, w.ring);
      CHECK(shm_all == ring_all);
      MPI_Allgatherv(piece.data(), static_cast<int>(piece.size()), MPI_BYTE, mpi_all.data(), mpi_counts.data(),
                     mpi_offsets.data(), MPI_BYTE, MPI_COMM_WORLD);
      CHECK(shm_all == mpi_all);

      // allgather in place: this rank's slot of the output is the input.
      bytes gathered(block * p * es);
      if (block != 0) std::memcpy(gathered.data() + static_cast<std::size_t>(w.rank) * block * es, mine.data(), block * es);
      herd::buffer_view slot{gathered.data() + static_cast<std::size_t>(w.rank) * block * es, block, t};
      herd::buffer_view gathered_view = view(gathered, t);
      herd::allgather(slot, gathered_view, w.shm);
      bytes expected(block * p * es);
      MPI_Allgather(mine.data(), static_cast<int>(block * es), MPI_BYTE, expected.data(), static_cast<int>(block * es),
                    MPI_BYTE, MPI_COMM_WORLD);
      CHECK(gathered == expected);

      // broadcast from the last rank.
      const int root = w.size - 1;
      bytes shm_b = input_of(seed + 2, w.rank, t, block * 3, op, values::exact), mpi_b = shm_b;
      herd::buffer_view b_view = view(shm_b, t);
      herd::broadcast(b_view, w.shm, root);
      MPI_Bcast(mpi_b.data(), static_cast<int>(mpi_b.size()), MPI_BYTE, root, MPI_COMM_WORLD);
      CHECK(shm_b == mpi_b);
    }
  }
}

HERD_MPI_TEST_CASE("shared memory on a sub-communicator of some ranks", 3) {
  communicators w;
  const int colour = w.rank % 2;
  herd::mpi_communicator part = w.shm.split(colour, w.rank);
  herd::mpi_communicator part_ring = w.ring.split(colour, w.rank);
  CHECK((part.shared_node() != nullptr) == (part.size() > 1));
  if (part.shared_node() != nullptr) CHECK(part.shared_node()->size() == part.size());
  for (std::size_t n : {std::size_t{5}, std::size_t{3001}}) {
    const bytes mine = input_of(n, w.rank, herd::dtype::i32, n, herd::reduce_op::sum, values::exact);
    CHECK(allreduce_with(part, mine, herd::dtype::i32, herd::reduce_op::sum, true) ==
          allreduce_with(part_ring, mine, herd::dtype::i32, herd::reduce_op::sum, true));
  }
  herd::barrier(part);
}

HERD_MPI_TEST_CASE("two simulated nodes: the hierarchical allreduce gives the ring's bits on every rank", 4) {
  if (herd::runtime::defaults().simulated_node_size != 0) return;
  const int world = [] {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  const int node_size = world / 2;
  herd::mpi_communicator nodes(MPI_COMM_WORLD, with(herd::algorithm::automatic, small_slice, node_size));
  herd::mpi_communicator ring(MPI_COMM_WORLD, with(herd::algorithm::ring));
  if (world % 2 != 0) {  // unequal nodes: auto keeps the ring
    CHECK(nodes.across_nodes() == nullptr);
    return;
  }
  REQUIRE(nodes.node_part() != nullptr);
  REQUIRE(nodes.across_nodes() != nullptr);
  CHECK(nodes.shared_node() == nullptr);
  CHECK(nodes.node_part()->size() == node_size);
  CHECK(nodes.across_nodes()->size() == 2);
  rng pick(9);
  for (herd::dtype t : every_dtype) {
    for (herd::reduce_op op : every_op) {
      if (!herd::supports(t, op)) continue;
      for (std::size_t n : {std::size_t{3}, std::size_t{3001}, std::size_t{70001}}) {
        const bool in_place = pick.below(2) == 0;
        INFO("dtype ", herd::name(t), " op ", herd::name(op), " count ", n, in_place ? " in place" : "");
        const bytes mine = input_of(n * 3 + static_cast<std::uint64_t>(op), nodes.rank(), t, n, op, values::exact);
        const bytes got = allreduce_with(nodes, mine, t, op, in_place);
        CHECK(got == allreduce_with(ring, mine, t, op, in_place));
        CHECK(same_on_every_rank(got));
      }
    }
  }
  const bytes rough = input_of(1, nodes.rank(), herd::dtype::f32, 50001, herd::reduce_op::avg, values::rough);
  CHECK(same_on_every_rank(allreduce_with(nodes, rough, herd::dtype::f32, herd::reduce_op::avg, false)));
}

HERD_MPI_TEST_CASE("shared memory options: differing or impossible ones are an error on every rank at creation", 2) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string differing = error_of([&] {
    herd::mpi_communicator c(MPI_COMM_WORLD, with(rank == 1 ? herd::algorithm::ring : herd::algorithm::automatic));
  });
  INFO(differing);
  CHECK(has(differing, "HERD_ALLREDUCE_ALGORITHM differs across ranks (rank 0: auto, rank 1: ring"));
  const std::string slices = error_of([&] {
    herd::mpi_communicator c(MPI_COMM_WORLD, with(herd::algorithm::automatic, rank == 0 ? 8192 : 4096));
  });
  CHECK(has(slices, "HERD_SHM_SLICE_BYTES differs across ranks"));
  const std::string tiny = error_of([&] { herd::mpi_communicator c(MPI_COMM_WORLD, with(herd::algorithm::automatic, 1000)); });
  CHECK(has(tiny, "comm_options::shm_slice_bytes (HERD_SHM_SLICE_BYTES) is 1000"));
  const std::string apart = error_of([&] {
    herd::mpi_communicator c(MPI_COMM_WORLD, with(herd::algorithm::shared_memory, small_slice, 1));
  });
  INFO(apart);
  CHECK(has(apart, "HERD_ALLREDUCE_ALGORITHM=shm needs every rank on one node"));
  // Every rank goes on: a communicator with agreeing options works.
  herd::mpi_communicator fine(MPI_COMM_WORLD, with(herd::algorithm::shared_memory));
  std::vector<int> v(10, 1);
  herd::allreduce(v, fine);
  CHECK(v[0] == fine.size());
}

namespace {
// Rank 1 sleeps before it publishes this step (once).
std::uint64_t stall_at = 0;
void stall(std::uint64_t ticket) {
  if (ticket != stall_at) return;
  stall_at = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
}
}  // namespace

HERD_MPI_TEST_CASE("a rank stalled mid-slice: every rank gets the error, the communicator refuses, a new one is exact", 2) {
  herd::comm_options o = with(herd::algorithm::shared_memory, small_slice);
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 0.7;
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  const std::size_t n = 20000;  // 80 KB: 40 allreduce slices of 2 KiB (half a 4 KiB buffer)
  std::vector<float> v(n, 1.0f);
  // Steps: barrier #1 is step 1, barrier #2 step 2, the allreduce's agreement with its first
  // slice step 3, its other slices steps 4 to 42 (to 22 where the ranks outnumber the cores and a
  // slice is the whole buffer): rank 1 stalls in the 8th slice.
  if (comm.rank() == 1) {
    stall_at = 10;
    herd::detail::shm_step_hook() = stall;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] {
    herd::barrier(comm);
    herd::barrier(comm);
    herd::allreduce(v, comm);
  });
  herd::detail::shm_step_hook() = nullptr;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(message);
  CHECK(stall_at == 0);
  CHECK(has(message, "herd::allreduce on rank " + std::to_string(comm.rank())));
  if (comm.rank() == 1) {
    CHECK(has(message, "aborted its operation #3"));
  } else {
    CHECK((has(message, "has waited 0.7 s in allreduce #3 (78.1 KiB f32) for rank 1 (through shared memory)") ||
           has(message, "aborted its operation #3")));
  }
  CHECK(seconds < 10);
  const std::string later = error_of([&] { herd::allreduce(v, comm); });
  CHECK(has(later, "this communicator was aborted by an earlier error"));
  herd::comm_options patient = o;  // rank 1 may still be stalled: the others return without waiting for it
  patient.stall_shutdown_seconds = 30;
  herd::mpi_communicator fresh = comm.renew(patient);
  std::vector<float> w(n, static_cast<float>(comm.rank() + 1));
  herd::allreduce(w, fresh);
  const auto p = static_cast<float>(comm.size());
  CHECK(w == std::vector<float>(n, p * (p + 1) / 2));
}

namespace {
// The entries of /dev/shm that a process `pid` named (herd's fallback names are "herd.<pid>....").
std::vector<std::string> named_by(int pid) {
  std::vector<std::string> found;
  const std::string prefix = "herd." + std::to_string(pid) + ".";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(dir)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    }
    ::closedir(dir);
  }
  return found;
}

// A child that creates a segment, writes its identity and its name to `out` and waits to be killed.
int creating_child(int out) {
  const int pid = ::fork();
  if (pid != 0) return pid;
  std::string problem;
  herd::detail::shm_segment segment = herd::detail::shm_segment::create(1 << 20, problem);
  const std::string name = segment ? segment.name() : "";
  (void)!::write(out, &segment.id(), sizeof segment.id());
  (void)!::write(out, name.c_str(), name.size() + 1);
  for (;;) ::pause();
}

// A child that opens the segment `name` and writes 1 (or 0) to `out`, then waits to be killed.
int opening_child(const std::string& name, const herd::detail::shm_segment::identity& id, int out) {
  const int pid = ::fork();
  if (pid != 0) return pid;
  std::string problem;
  herd::detail::shm_segment segment = herd::detail::shm_segment::open(name, 1 << 20, id, problem);
  const char ok = segment ? 1 : 0;
  (void)!::write(out, &ok, 1);
  for (;;) ::pause();
}

void kill_and_reap(int pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}
}  // namespace

HERD_MPI_TEST_CASE("a shared-memory segment leaves nothing in /dev/shm when its ranks are killed at any point", 1) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  // Killed: the creator right after creating (before any other rank opened it); the creator once
  // another has it open; the opener, then the creator, before the name is released.
  for (int point = 0; point < 3; ++point) {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const int creator = creating_child(pipe_fds[1]);
    herd::detail::shm_segment::identity id;
    REQUIRE(::read(pipe_fds[0], &id, sizeof id) == static_cast<ssize_t>(sizeof id));
    char name[256] = {};
    for (std::size_t got = 0; got == 0 || name[got - 1] != '\0';) {
      const auto n = ::read(pipe_fds[0], name + got, sizeof name - 1 - got);
      REQUIRE(n > 0);
      got += static_cast<std::size_t>(n);
    }
    INFO("point ", point, ", segment ", name);
    REQUIRE(name[0] != '\0');
    int opener = -1;
    if (point > 0) {
      opener = opening_child(name, id, pipe_fds[1]);
      char ok = 0;
      REQUIRE(::read(pipe_fds[0], &ok, 1) == 1);
      CHECK(ok == 1);
    }
    if (point == 2) kill_and_reap(opener);
    kill_and_reap(creator);
    if (point == 1) kill_and_reap(opener);
    CHECK(named_by(creator).empty());
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
  }
}

namespace {
bool fail_armed = false;
void fail_once(std::uint64_t) {
  if (!fail_armed) return;
  fail_armed = false;
  throw herd::error("injected failure in the node phase");
}
}  // namespace

HERD_MPI_TEST_CASE("two simulated nodes: a rank failing in its node's phase stops every rank at once, named as the user numbers them", 4) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) return;
  herd::comm_options o = with(herd::algorithm::hierarchical, small_slice, 2);
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 10;  // far longer than the test allows: the error must come from the abort
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  REQUIRE(comm.across_nodes() != nullptr);
  std::vector<float> v(20000, 1.0f);
  // Rank 0 fails at its first step in shared memory; the ranks of the other node finish their
  // node's phase and wait for rank 0 (rank 2) or rank 1 (rank 3) in the ring across nodes.
  if (comm.rank() == 0) {
    fail_armed = true;
    herd::detail::shm_step_hook() = fail_once;
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { herd::allreduce(v, comm); });
  herd::detail::shm_step_hook() = nullptr;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(message);
  CHECK(seconds < 3);
  const std::string r = std::to_string(comm.rank());
  if (comm.rank() == 0) {
    CHECK(has(message, "injected failure in the node phase"));
  } else {
    CHECK(has(message, "herd::allreduce on rank " + r + " of " + std::to_string(world) + ": "));
    CHECK(has(message, "aborted"));
    CHECK(has(message, "while rank " + r + " waits in allreduce #1 (78.1 KiB f32)"));
  }
  CHECK(!has(message, "The communicator is now aborted: create a new one on every rank (comm.renew()) to go on. The"));
  herd::mpi_communicator fresh = comm.renew();
  std::vector<float> w(20000, static_cast<float>(comm.rank() + 1));
  herd::allreduce(w, fresh);
  const auto p = static_cast<float>(world);
  CHECK(w == std::vector<float>(20000, p * (p + 1) / 2));
}

namespace {
struct step_counter {
  int steps = 0;
  void step() { ++steps; }
};

// Seven gradients, f32 and f64 mixed (two groups), 84 KB in all: past the one-shot size.
std::vector<bytes> gradients_of(int rank, herd::reduce_op op) {
  std::vector<bytes> g;
  for (std::size_t i = 0; i < 7; ++i) {
    const herd::dtype t = i % 3 == 1 ? herd::dtype::f64 : herd::dtype::f32;
    g.push_back(input_of(100 + i, rank, t, 1000 + 700 * i, op, values::exact));
  }
  return g;
}

std::vector<herd::buffer_view> views_of(std::vector<bytes>& g) {
  std::vector<herd::buffer_view> v;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const herd::dtype t = i % 3 == 1 ? herd::dtype::f64 : herd::dtype::f32;
    v.push_back(view(g[i], t));
  }
  return v;
}
}  // namespace

HERD_MPI_TEST_CASE("distributed optimizer on one node: gradients reduced in shared memory get the fusion buffer's bits", 1) {
  communicators w;
  for (herd::reduce_op op : {herd::reduce_op::sum, herd::reduce_op::avg}) {
    INFO("op ", herd::name(op));
    std::vector<bytes> direct = gradients_of(w.rank, op), packed = direct;
    step_counter a, b;
    herd::optimizer_options options;
    options.op = op;
    herd::distributed_optimizer through_shm(a, views_of(direct), w.shm, options);
    herd::distributed_optimizer through_ring(b, views_of(packed), w.ring, options);
    for (int step = 0; step < 2; ++step) {
      CHECK(through_shm.step());
      CHECK(through_ring.step());
      CHECK(direct == packed);
    }
    CHECK(a.steps == 2);
    bytes all;
    for (const bytes& g : direct) all.insert(all.end(), g.begin(), g.end());
    CHECK(same_on_every_rank(all));
  }
}

HERD_MPI_TEST_CASE("grouped allreduce on one node: straight from and into the tensors, the ring's bits", 1) {
  communicators w;
  for (herd::reduce_op op : {herd::reduce_op::sum, herd::reduce_op::max, herd::reduce_op::avg}) {
    INFO("op ", herd::name(op));
    std::vector<bytes> a = gradients_of(w.rank, op), b = a;
    herd::allreduce(views_of(a), w.shm, op);
    herd::allreduce(views_of(b), w.ring, op);
    CHECK(a == b);
  }
}

HERD_MPI_TEST_CASE("overlap buckets on one node: reduced in shared memory from the gradients themselves, the packed bits", 2) {
  communicators w;
  herd::optimizer_options options;
  options.op = herd::reduce_op::avg;
  options.first_bucket_bytes = 20000;  // past the one-shot size, and several buckets
  options.bucket_bytes = 40000;
  std::vector<bytes> direct = gradients_of(w.rank, options.op), packed = direct;
  step_counter a, b;
  herd::distributed_optimizer through_shm(a, views_of(direct), w.shm, options);
  herd::distributed_optimizer through_ring(b, views_of(packed), w.ring, options);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = direct.size(); i-- > 0;) {
      through_shm.mark_ready(i);
      through_ring.mark_ready(i);
    }
    CHECK(through_shm.step());
    CHECK(through_ring.step());
    CHECK(direct == packed);
  }
  CHECK(through_shm.buckets().size() >= 3);
  CHECK(through_shm.overlap().steps == 3);
  CHECK(through_shm.overlap().packed_bytes == 0);  // nothing copied into bucket buffers
  CHECK(through_ring.overlap().packed_bytes > 0);
}

namespace {
// What this process has mapped, from /proc/self/maps: bytes of files under /dev/shm (where
// Docker's 64 MiB default limit applies), and the number of herd's anonymous segments. Only this
// process's own mappings count, so other jobs on the machine cannot move the figures.
struct shared_mappings {
  double dev_shm_bytes = 0;
  std::size_t herd_memfds = 0;
};
shared_mappings mapped_by_this_process() {
  shared_mappings m;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &begin, &end) != 2) continue;
    const std::size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.rfind("/dev/shm/", 0) == 0) m.dev_shm_bytes += static_cast<double>(end - begin);
    if (path.rfind("/memfd:herd", 0) == 0) ++m.herd_memfds;
  }
  return m;
}
}  // namespace

HERD_MPI_TEST_CASE("communicators made by split, subset and renew add nothing to /dev/shm, however many live at once", 2) {
  herd::mpi_communicator comm(MPI_COMM_WORLD, with(herd::algorithm::shared_memory));
  REQUIRE(comm.shared_node() != nullptr);
  const shared_mappings before = mapped_by_this_process();
  std::vector<herd::mpi_communicator> alive;
  std::vector<int> everyone(static_cast<std::size_t>(comm.size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  for (int k = 0; k < 4; ++k) {
    alive.push_back(comm.split(0, comm.rank()));
    alive.push_back(comm.subset(everyone));
    alive.push_back(alive.back().renew());
  }
  std::size_t shared = 0;
  for (herd::mpi_communicator& c : alive) {
    if (c.shared_node() != nullptr) ++shared;
    std::vector<float> v(3000, 1.0f);
    herd::allreduce(v, c);
    CHECK(v == std::vector<float>(3000, static_cast<float>(comm.size())));
  }
  CHECK(shared == alive.size());  // each has a segment of its own (1 MiB slices: several MiB each)
  const shared_mappings after = mapped_by_this_process();
  INFO("mapped from /dev/shm: ", before.dev_shm_bytes, " bytes before, ", after.dev_shm_bytes, " with ",
       alive.size(), " communicators; herd's anonymous segments mapped: ", before.herd_memfds, " before, ",
       after.herd_memfds, " after");
  CHECK(after.herd_memfds >= before.herd_memfds + alive.size());  // the segments exist, and are herd's
  CHECK(after.dev_shm_bytes - before.dev_shm_bytes < 1 << 20);  // the segments are anonymous (memfd): not in /dev/shm at all
}

// With argument checks off, a collective called with different counts may go wrong, but its
// shared-memory steps must never pair with the next operation's: rank 1's extra slice would
// otherwise take rank 0's first step of the next allreduce, and that allreduce would complete with
// the earlier one's data. Every rank either raises or holds the exact sum of the second call.
HERD_MPI_TEST_CASE("argument checks off: a mismatched shared-memory allreduce never lends its steps to the next operation", 2) {
  const herd::comm_options o = with_checks(false, small_slice);
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    REQUIRE(comm.shared_node() != nullptr);
    const int rank = comm.rank();
    const int p = comm.size();
    const std::size_t n = 64 * 1024;  // 128 slices of 512 floats (64 of 1024 where the ranks
                                      // outnumber the cores); rank 1 has 1024 floats more
    std::vector<float> first(n + (rank == 1 ? 1024 : 0), 1.0f);
    const std::string first_error = error_of([&] { herd::allreduce(first, comm); });
    std::vector<float> second(n, static_cast<float>(rank + 1));
    const std::string second_error = error_of([&] { herd::allreduce(second, comm); });
    const auto sum = static_cast<float>(p * (p + 1) / 2);
    const auto wrong = std::count_if(second.begin(), second.end(), [&](float x) { return x != sum; });
    INFO("rank ", rank, ": first: ", first_error, " | second: ", second_error, " | ", wrong, " of ", n, " wrong");
    CHECK((second_error != no_error || wrong == 0));
    if (second_error != no_error && first_error == no_error) {
      CHECK((has(second_error, "their shared-memory steps do not pair up") || has(second_error, "aborted")));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0 allreduces n f32 ones, every other rank n i32 ones: `what` is the error this rank got.
struct f32_against_i32 {
  std::vector<float> f;
  std::vector<std::int32_t> i;
  std::string what;

  f32_against_i32(herd::mpi_communicator& comm, std::size_t n)
      : f(comm.rank() == 0 ? n : 0, 1.0f), i(comm.rank() == 0 ? 0 : n, 1) {
    what = error_of([&] {
      if (comm.rank() == 0) herd::allreduce(f, comm);
      else herd::allreduce(i, comm);
    });
  }
};

// Past the one-shot size, a shared-memory allreduce's agreement carries its first slice (each
// rank's pieces for the others: agree_with_step). Every signature must be verified before any rank
// reads a peer's buffer or writes its output: each rank raises, naming the counts, with its tensor
// as it was, and the next allreduce is exact, whether the argument checks are on or off.
HERD_MPI_TEST_CASE("shared memory allreduce whose counts differ: every rank raises before it reads a peer's data, checks on or off", 2) {
  for (const bool checks : {true, false}) {
    herd::mpi_communicator comm(MPI_COMM_WORLD, with_checks(checks));
    REQUIRE(comm.shared_node() != nullptr);
    const int rank = comm.rank();
    const int p = comm.size();
    const std::size_t n = 16 * 1024;  // 64 KiB of f32: past the one-shot path, one slice
    const auto own = static_cast<float>(rank + 1);
    std::vector<float> v(n + (rank == p - 1 ? 1 : 0), own);
    const std::string what = error_of([&] { herd::allreduce(v, comm); });
    INFO("rank ", rank, ", checks ", checks, ": ", what);
    CHECK(has(what, "the element count differs across ranks"));
    CHECK(has(what, "rank " + std::to_string(p - 1) + ": " + std::to_string(n + 1)));
    CHECK(std::all_of(v.begin(), v.end(), [&](float x) { return x == own; }));
    std::vector<float> next(n, own);
    herd::allreduce(next, comm);
    CHECK(std::all_of(next.begin(), next.end(), [&](float x) { return x == static_cast<float>(p * (p + 1) / 2); }));
  }
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, with(herd::algorithm::shared_memory));
    const f32_against_i32 call(comm, 16 * 1024);
    INFO("rank ", comm.rank(), ": ", call.what);
    CHECK(has(call.what, "the dtype differs across ranks"));
    CHECK(std::all_of(call.f.begin(), call.f.end(), [](float x) { return x == 1.0f; }));
    CHECK(std::all_of(call.i.begin(), call.i.end(), [](std::int32_t x) { return x == 1; }));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// With argument checks off, steps of two different collectives, or of one collective on two
// dtypes, carry the same operation number; their words must still differ, or the allgather would
// return the allreduce's half-copied buffer and the f32 and i32 sums would each be computed in
// their own rank's type. Every rank must raise at the first step, naming the peer's collective.
HERD_MPI_TEST_CASE("argument checks off: shared-memory steps of another collective or dtype do not pair up", 2) {
  const herd::comm_options o = with_checks(false, small_slice);
  const std::size_t n = 16 * 1024;  // 64 KiB of f32: past the one-shot path, several slices
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    REQUIRE(comm.shared_node() != nullptr);
    const int rank = comm.rank();
    std::vector<float> values(n, 1.0f);
    std::vector<float> gathered(n * static_cast<std::size_t>(comm.size()), -1.0f);
    const std::string what = error_of([&] {
      if (rank == 0) herd::allreduce(values, comm);
      else herd::allgather(values, gathered, comm);
    });
    INFO("rank ", rank, ": ", what);
    CHECK(has(what, "their shared-memory steps do not pair up"));
    CHECK(has(what, rank == 0 ? "is in allgather #" : "is in allreduce #"));
  }
  {
    herd::mpi_communicator comm(MPI_COMM_WORLD, o);
    const int rank = comm.rank();
    const std::string what = f32_against_i32(comm, n).what;
    INFO("rank ", rank, ": ", what);
    CHECK(has(what, "their shared-memory steps do not pair up"));
    CHECK(has(what, "is in allreduce #"));
    CHECK(has(what, (rank == 0 ? " of i32" : " of f32") + std::string(" where rank ") + std::to_string(rank) +
                        " is in allreduce"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// shrink() leaves whatever ranks stay: an algorithm chosen explicitly that no longer fits them
// (hierarchical over nodes of 2 and 1 ranks) falls back to auto on every rank, with a warning,
// rather than make recovery impossible.
HERD_MPI_TEST_CASE("after shrink, an explicit hierarchical algorithm that no longer fits falls back to auto", 4) {
  int world_rank = 0;
  int world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  herd::comm_options o = with(herd::algorithm::hierarchical, small_slice, 2);
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 10;
  std::vector<int> four = {0, 1, 2, 3};
  herd::mpi_communicator all(MPI_COMM_WORLD, o);
  herd::mpi_communicator comm = all.subset(four);  // 2 simulated nodes of 2 ranks
  if (comm.is_member()) {
    REQUIRE(comm.across_nodes() != nullptr);
    if (comm.rank() == 3) {
      comm.leave();
    } else {
      std::string what;
      const std::string warned = herd_test::stderr_of([&] {
        what = error_of([&] {
          herd::mpi_communicator smaller = comm.shrink();
          std::vector<int> v(5000, 1);
          herd::allreduce(v, smaller);
          CHECK(smaller.size() == 3);
          CHECK(smaller.options().allreduce_algorithm == herd::algorithm::automatic);
          CHECK(v == std::vector<int>(5000, 3));
        });
      });
      INFO(what, " | ", warned);
      CHECK(what == no_error);
      CHECK(has(warned, "HERD_ALLREDUCE_ALGORITHM=hierarchical does not fit the ranks left after shrink() (2 nodes, not "
                        "as many ranks on each); this communicator uses auto"));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// What an opener maps is checked before any use: a file of another size, or of the right size but
// another identity (another process's memfd at the descriptor number the creator sent, as ranks in
// separate PID namespaces see each other's /proc/<pid>/fd/<n>), is refused and left unwritten.
HERD_MPI_TEST_CASE("a shared-memory segment is checked before use: another file at its path is refused, untouched", 1) {
  std::string problem;
  herd::detail::shm_segment made = herd::detail::shm_segment::create(1 << 20, problem);
  REQUIRE(made);
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{1} << 16}) {
    const int other = ::memfd_create("not-herd", MFD_CLOEXEC);
    REQUIRE(other >= 0);
    REQUIRE(::ftruncate(other, static_cast<off_t>(size)) == 0);
    const std::string path = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(other);
    std::string refused;
    herd::detail::shm_segment wrong = herd::detail::shm_segment::open(path, 1 << 20, made.id(), refused);
    INFO(size, " bytes: ", refused);
    CHECK(!wrong);
    CHECK(has(refused, path + " is not the node's segment"));
    std::vector<char> content(size, 1);
    REQUIRE(::pread(other, content.data(), size, 0) == static_cast<ssize_t>(size));
    CHECK(std::all_of(content.begin(), content.end(), [](char c) { return c == 0; }));  // never written
    ::close(other);
  }
  std::string fine;
  herd::detail::shm_segment same = herd::detail::shm_segment::open(made.name(), 1 << 20, made.id(), fine);
  CHECK(fine == "");
  CHECK(same);
}

// Ranks in separate PID namespaces (a container per rank): the path through /proc names another
// process's descriptor there, so the ranks find a named segment instead, and share memory.
// (ctest mpi_shm_pid_namespaces runs this with every rank under unshare --pid.)
HERD_MPI_TEST_CASE("shared memory is found across PID namespaces (run under unshare --pid per rank)", 2) {
  if (std::getenv("HERD_TEST_PID_NAMESPACES") == nullptr) return;
  herd::mpi_communicator comm(MPI_COMM_WORLD, with(herd::algorithm::shared_memory, small_slice));
  CHECK(comm.shared_node() != nullptr);
  std::vector<float> v(100000, static_cast<float>(comm.rank() + 1));
  herd::allreduce(v, comm);
  CHECK(v == std::vector<float>(100000, static_cast<float>(comm.size() * (comm.size() + 1) / 2)));
}
