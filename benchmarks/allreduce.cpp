// herd's allreduce beside herd's ring and MPI_Allreduce of the same MPI, in the style of nccl-tests.
//
//   mpiexec -n 2 build/benchmarks/allreduce [--min-bytes 8] [--max-bytes 268435456] [--dtype f32]
//                                           [--op sum] [--reps 9]
//
// For each size, doubling: herd (its default path: shared memory when every rank is on one node,
// hierarchical across nodes, see HERD_ALLREDUCE_ALGORITHM), herd's ring over MPI messages alone
// (a communicator with algorithm::ring) and MPI each run in place on the same data, first checked
// against each other, then timed. A repetition runs k calls back to back between barriers (k
// shrinks as the size grows); its time per call is the slowest rank's. The table shows medians
// over the repetitions after a warm-up. algbw = bytes / time; busbw = algbw * 2(n-1)/n, the
// bandwidth each rank's links actually carry. "herd/MPI" and "herd/ring" are herd's busbw over
// theirs: above 1, herd is faster. "memcpy" is a plain memcpy of the same bytes on one rank: the
// machine's memory limit.
//
// "1-copy" is the single-copy limit, where every rank is on one node and Linux lets them read each
// other's memory (cross-memory attach): every rank reading the whole message from the next rank's
// memory with process_vm_readv, all at once, which is what moving the bytes once between ranks
// costs here. Before each read every rank writes its own message anew (untimed, then a barrier):
// the bytes are then in their writer's cache, as a gradient is after backward, and the read moves
// them between the cores; read again unchanged, they would come from the reader's own cache, two
// to three times faster on the 2-core VM, which is no limit an allreduce of new data can reach.
// "1-copy/herd" is its time over herd's (1: herd at that limit).
//
// --reproducible 1 adds "repro": herd with comm_options::reproducible (sums whose bits do not
// depend on the path or the ranks' order), checked against herd's default to the same bits (the
// values add up exactly in every order), "oop", herd's default timed the same way, and
// "repro/oop", the ratio of the two. Both out of place from the same input, so that the values stay what they are (in place, each call sums
// the last one's results, and after a hundred calls they are infinities, which the reproducible
// sum takes on a slower branch).
//
// A second table (--async-max-bytes, default 4 MiB; 0 skips it) times many operations in flight:
// `--outstanding` (16) allreduces of different buffers started one after another, then all
// waited for, per operation: herd blocking, herd_async (herd::allreduce_async and handles, on
// the communicator's progress thread), the same without a progress thread (operations run inside
// wait()), and MPI_Iallreduce with MPI_Waitall.

#include <herd/herd.hpp>

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

struct options {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{256} << 20;
  herd::dtype type = herd::dtype::f32;
  herd::reduce_op op = herd::reduce_op::sum;
  int reps = 9;
  std::size_t async_min_bytes = std::size_t{64} << 10;
  std::size_t async_max_bytes = std::size_t{4} << 20;
  int outstanding = 16;
  bool reproducible = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "allreduce: %s\nusage: mpiexec -n N allreduce [--min-bytes B] [--max-bytes B] [--dtype f32|f64|f16|bf16|"
               "i32|i64|i8|u8] [--op sum|avg|min|max|prod] [--reps R] [--async-min-bytes B] [--async-max-bytes B] "
               "[--outstanding K] [--reproducible 0|1]\n",
               why);
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") usage("side-by-side allreduce benchmark");
    if (i + 1 >= argc) usage(("missing value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--min-bytes") o.min_bytes = std::stoull(value);
    else if (flag == "--max-bytes") o.max_bytes = std::stoull(value);
    else if (flag == "--reps") o.reps = std::max(1, std::stoi(value));
    else if (flag == "--async-min-bytes") o.async_min_bytes = std::stoull(value);
    else if (flag == "--async-max-bytes") o.async_max_bytes = std::stoull(value);
    else if (flag == "--outstanding") o.outstanding = std::max(1, std::stoi(value));
    else if (flag == "--reproducible") o.reproducible = std::stoi(value) != 0;
    else if (flag == "--dtype") {
      bool found = false;
      for (auto t : herd::all_dtypes)
        if (herd::name(t) == value) o.type = t, found = true;
      if (!found) usage(("unknown dtype " + value).c_str());
    } else if (flag == "--op") {
      bool found = false;
      for (auto op : herd::all_reduce_ops)
        if (herd::name(op) == value) o.op = op, found = true;
      if (!found) usage(("unknown op " + value).c_str());
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (!herd::supports(o.type, o.op)) usage("that dtype does not support that op");
  return o;
}

MPI_Datatype mpi_type(herd::dtype t) {
  switch (t) {
    case herd::dtype::f32: return MPI_FLOAT;
    case herd::dtype::f64: return MPI_DOUBLE;
    case herd::dtype::i8: return MPI_INT8_T;
    case herd::dtype::u8: return MPI_UINT8_T;
    case herd::dtype::i32: return MPI_INT32_T;
    case herd::dtype::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;  // MPI has no standard 16-bit float types
  }
}

MPI_Op mpi_op(herd::reduce_op op) {
  switch (op) {
    case herd::reduce_op::sum: return MPI_SUM;
    case herd::reduce_op::min: return MPI_MIN;
    case herd::reduce_op::max: return MPI_MAX;
    case herd::reduce_op::prod: return MPI_PROD;
    default: return MPI_OP_NULL;
  }
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median over `reps` repetitions of the slowest rank's `repetition()` (its seconds per call).
template <class Repetition> double median_of_slowest(Repetition repetition, int reps) {
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const double mine = repetition();
    double slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    samples.push_back(slowest);
  }
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  return samples[samples.size() / 2];
}

// Median over repetitions of the slowest rank's time per call, in seconds.
template <class Call> double time_calls(Call call, std::size_t bytes, int reps) {
  const int per_rep = static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / std::max<std::size_t>(bytes, 1), 1, 200));
  for (int i = 0; i < std::min(per_rep, 5); ++i) call();  // warm-up
  return median_of_slowest(
      [&] {
        MPI_Barrier(MPI_COMM_WORLD);
        const double start = now();
        for (int i = 0; i < per_rep; ++i) call();
        return (now() - start) / per_rep;
      },
      reps);
}

// The same for `read`, where before each call every rank runs `write` and all meet at a barrier,
// and meet again after it (no rank writes again while a peer still reads), none of it timed (so
// per call, not k calls back to back).
template <class Write, class Read> double time_fresh_reads(Write write, Read read, std::size_t bytes, int reps) {
  const int per_rep = static_cast<int>(std::clamp<std::size_t>((std::size_t{16} << 20) / std::max<std::size_t>(bytes, 1), 1, 50));
  auto timed_read = [&] {
    write();
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now();
    read();
    const double seconds = now() - start;
    MPI_Barrier(MPI_COMM_WORLD);
    return seconds;
  };
  for (int i = 0; i < std::min(per_rep, 5); ++i) timed_read();  // warm-up
  return median_of_slowest(
      [&] {
        double total = 0;
        for (int i = 0; i < per_rep; ++i) total += timed_read();
        return total / per_rep;
      },
      reps);
}

// Copies `bytes` from `remote` in process `pid` into `local`; false if the kernel refused.
bool read_from(pid_t pid, void* local, std::uint64_t remote, std::size_t bytes) {
  for (std::size_t done = 0; done < bytes;) {
    const iovec here{static_cast<std::byte*>(local) + done, bytes - done};
    const iovec there{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t moved = ::process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (moved <= 0) return false;
    done += static_cast<std::size_t>(moved);
  }
  return true;
}

// Values that every order of summation adds up exactly, so herd and MPI must agree bit for bit.
void fill(herd::buffer_view v, int rank) {
  herd::visit(v.type, [&](auto element) {
    using T = decltype(element);
    auto* data = static_cast<T*>(v.data);
    for (std::size_t i = 0; i < v.count; ++i) data[i] = T(static_cast<float>((static_cast<int>(i) + rank) % 3 - 1));
  });
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  const options o = parse(argc, argv);
  herd::mpi_communicator comm;
  herd::comm_options messages_only;
  messages_only.allreduce_algorithm = herd::algorithm::ring;
  herd::mpi_communicator ring(MPI_COMM_WORLD, messages_only);
  const int n = comm.size();
  const int rank = comm.rank();
  const std::size_t es = herd::size_of(o.type);
  const MPI_Datatype mt = mpi_type(o.type);
  const MPI_Op mo = mpi_op(o.op);
  const bool mpi_comparable = mt != MPI_DATATYPE_NULL && mo != MPI_OP_NULL;

  std::vector<std::byte> herd_buffer(o.max_bytes + es), ring_buffer(o.max_bytes + es), mpi_buffer(o.max_bytes + es),
      copy_buffer(o.max_bytes + es), source_buffer(o.max_bytes + es);

  // The single-copy limit reads the next rank's source_buffer: where every rank is on one node and
  // every rank could read a first byte of it.
  const std::uint64_t mine[2] = {static_cast<std::uint64_t>(::getpid()), reinterpret_cast<std::uint64_t>(source_buffer.data())};
  std::vector<std::uint64_t> everyone(2 * static_cast<std::size_t>(n));
  MPI_Allgather(mine, 2, MPI_UINT64_T, everyone.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD);
  const auto next_pid = static_cast<pid_t>(everyone[2 * static_cast<std::size_t>((rank + 1) % n)]);
  const std::uint64_t next_buffer = everyone[2 * static_cast<std::size_t>((rank + 1) % n) + 1];
  int reached = comm.shared_node() != nullptr && read_from(next_pid, copy_buffer.data(), next_buffer, 1) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &reached, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const bool single_copy = reached != 0;
  herd::comm_options order_free;
  order_free.reproducible = true;
  std::optional<herd::mpi_communicator> repro;  // only when asked: a communicator costs a node segment
  if (o.reproducible) repro.emplace(MPI_COMM_WORLD, order_free);
  std::vector<std::byte> repro_buffer(o.reproducible ? o.max_bytes + es : 0);
  std::vector<std::byte> repro_input(o.reproducible ? o.max_bytes + es : 0);
  const char* path = comm.shared_node() != nullptr ? "shared memory"
                     : comm.node_part() != nullptr ? "hierarchical"
                                                   : "ring";
  if (rank == 0) {
    std::printf("# herd allreduce (%s) vs herd's ring vs MPI_Allreduce: %d ranks, %s %s, in place, medians of %d "
                "repetitions\n",
                path, n, std::string(herd::name(o.type)).c_str(), std::string(herd::name(o.op)).c_str(), o.reps);
    std::printf("# %12s | %10s %9s | %10s %9s | %10s %9s | %8s %8s | %9s", "bytes", "herd us", "busbw", "ring us",
                "busbw", "MPI us", "busbw", "herd/", "herd/", "memcpy");
    if (single_copy) std::printf(" | %10s %8s", "1-copy us", "1-copy/");
    if (o.reproducible) std::printf(" | %10s %10s %8s", "repro us", "oop us", "repro/");
    std::printf("\n# %12s | %10s %9s | %10s %9s | %10s %9s | %8s %8s | %9s", "", "", "GB/s", "", "GB/s", "", "GB/s",
                "MPI", "ring", "GB/s");
    if (single_copy) std::printf(" | %10s %8s", "limit", "herd");
    if (o.reproducible) std::printf(" | %10s %10s %8s", "", "(herd)", "oop");
    std::printf("\n");
  }
  const double bus_factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const std::size_t count = std::max<std::size_t>(bytes / es, 1);
    const std::size_t real_bytes = count * es;
    herd::buffer_view herd_view{herd_buffer.data(), count, o.type};
    herd::buffer_view ring_view{ring_buffer.data(), count, o.type};
    herd::buffer_view mpi_view{mpi_buffer.data(), count, o.type};

    fill(herd_view, rank);
    fill(ring_view, rank);
    fill(mpi_view, rank);
    herd::allreduce(herd_view, comm, o.op);
    herd::allreduce(ring_view, ring, o.op);
    if (std::memcmp(herd_buffer.data(), ring_buffer.data(), real_bytes) != 0) {
      std::fprintf(stderr, "rank %d: herd and its ring disagree at %zu bytes\n", rank, real_bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (mpi_comparable) {
      MPI_Allreduce(MPI_IN_PLACE, mpi_buffer.data(), static_cast<int>(count), mt, mo, MPI_COMM_WORLD);
      if (std::memcmp(herd_buffer.data(), mpi_buffer.data(), real_bytes) != 0) {
        std::fprintf(stderr, "rank %d: herd and MPI disagree at %zu bytes\n", rank, real_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }

    const double herd_s = time_calls([&] { herd::allreduce(herd_view, comm, o.op); }, real_bytes, o.reps);
    const double ring_s = time_calls([&] { herd::allreduce(ring_view, ring, o.op); }, real_bytes, o.reps);
    double mpi_s = 0;
    if (mpi_comparable) {
      mpi_s = time_calls(
          [&] { MPI_Allreduce(MPI_IN_PLACE, mpi_buffer.data(), static_cast<int>(count), mt, mo, MPI_COMM_WORLD); },
          real_bytes, o.reps);
    }
    const double copy_s = time_calls([&] { std::memcpy(copy_buffer.data(), herd_buffer.data(), real_bytes); },
                                     real_bytes, o.reps);
    double repro_s = 0;
    double out_of_place_s = 0;
    if (o.reproducible) {
      herd::buffer_view input{repro_input.data(), count, o.type};
      herd::buffer_view repro_view{repro_buffer.data(), count, o.type};
      herd::buffer_view default_view{herd_buffer.data(), count, o.type};
      fill(input, rank);
      herd::allreduce(input, repro_view, *repro, o.op);
      herd::allreduce(input, default_view, comm, o.op);
      if (std::memcmp(herd_buffer.data(), repro_buffer.data(), real_bytes) != 0) {
        std::fprintf(stderr, "rank %d: herd and its reproducible mode disagree at %zu bytes\n", rank, real_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      repro_s = time_calls([&] { herd::allreduce(input, repro_view, *repro, o.op); }, real_bytes, o.reps);
      out_of_place_s = time_calls([&] { herd::allreduce(input, default_view, comm, o.op); }, real_bytes, o.reps);
    }
    double one_copy_s = 0;
    if (single_copy) {
      unsigned char stamp = 0;
      one_copy_s = time_fresh_reads(
          [&] { std::memset(source_buffer.data(), ++stamp, real_bytes); },
          [&] {
            // Every rank wrote the same stamp: what arrived must be the next rank's newest bytes.
            if (!read_from(next_pid, copy_buffer.data(), next_buffer, real_bytes) ||
                copy_buffer[0] != std::byte{stamp} || copy_buffer[real_bytes - 1] != std::byte{stamp}) {
              std::fprintf(stderr, "rank %d: process_vm_readv failed or read old bytes\n", rank);
              MPI_Abort(MPI_COMM_WORLD, 1);
            }
          },
          real_bytes, o.reps);
    }
    if (rank == 0) {
      const double gb = static_cast<double>(real_bytes) / 1e9;
      std::printf("  %12zu | %10.2f %9.3f | %10.2f %9.3f | ", real_bytes, herd_s * 1e6, gb / herd_s * bus_factor,
                  ring_s * 1e6, gb / ring_s * bus_factor);
      if (mpi_comparable) {
        std::printf("%10.2f %9.3f | %8.2f ", mpi_s * 1e6, gb / mpi_s * bus_factor, mpi_s / herd_s);
      } else {
        std::printf("%10s %9s | %8s ", "-", "-", "-");
      }
      std::printf("%8.2f | %9.2f", ring_s / herd_s, gb / copy_s);
      if (single_copy) std::printf(" | %10.2f %8.2f", one_copy_s * 1e6, one_copy_s / herd_s);
      if (o.reproducible) {
        std::printf(" | %10.2f %10.2f %8.2f", repro_s * 1e6, out_of_place_s * 1e6, repro_s / out_of_place_s);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (o.async_max_bytes == 0) return 0;

  // Many operations in flight: K buffers, each reduced once per repetition.
  const int k = o.outstanding;
  herd::comm_options in_wait;
  in_wait.progress_thread = false;
  herd::mpi_communicator caller_driven(MPI_COMM_WORLD, in_wait);
  if (rank == 0) {
    std::printf("\n# %d allreduces in flight: per operation, medians of %d repetitions\n", k, o.reps);
    std::printf("# %12s | %10s %9s | %10s %9s | %10s %9s | %10s %9s | %8s %8s\n", "bytes", "blocking", "busbw",
                "herd_async", "busbw", "no thread", "busbw", "MPI_Iallr", "busbw", "async/", "async/");
    std::printf("# %12s | %10s %9s | %10s %9s | %10s %9s | %10s %9s | %8s %8s\n", "", "us", "GB/s", "us", "GB/s", "us",
                "GB/s", "us", "GB/s", "blocking", "MPI");
  }
  for (std::size_t bytes = o.async_min_bytes; bytes <= o.async_max_bytes; bytes *= 2) {
    const std::size_t count = std::max<std::size_t>(bytes / es, 1);
    const std::size_t real_bytes = count * es;
    std::vector<std::vector<std::byte>> buffers(static_cast<std::size_t>(k), std::vector<std::byte>(real_bytes));
    std::vector<herd::buffer_view> views;
    for (auto& b : buffers) {
      views.push_back({b.data(), count, o.type});
      fill(views.back(), rank);
    }
    const double blocking_s = time_calls([&] { for (auto& v : views) herd::allreduce(v, comm, o.op); },
                                         real_bytes * static_cast<std::size_t>(k), o.reps) / k;
    auto in_flight = [&](herd::mpi_communicator& c) {
      return time_calls(
                 [&] {
                   std::vector<herd::handle> handles;
                   handles.reserve(views.size());
                   for (auto& v : views) handles.push_back(herd::allreduce_async(v, c, o.op));
                   for (auto& h : handles) h.wait();
                 },
                 real_bytes * static_cast<std::size_t>(k), o.reps) /
             k;
    };
    const double async_s = in_flight(comm);
    const double caller_s = in_flight(caller_driven);
    double mpi_s = 0;
    if (mpi_comparable) {
      std::vector<MPI_Request> requests(views.size());
      mpi_s = time_calls(
          [&] {
            for (std::size_t i = 0; i < views.size(); ++i) {
              MPI_Iallreduce(MPI_IN_PLACE, views[i].data, static_cast<int>(count), mt, mo, MPI_COMM_WORLD, &requests[i]);
            }
            MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
          },
          real_bytes * static_cast<std::size_t>(k), o.reps) / k;
    }
    if (rank == 0) {
      const double gb = static_cast<double>(real_bytes) / 1e9;
      std::printf("  %12zu | %10.2f %9.3f | %10.2f %9.3f | %10.2f %9.3f | ", real_bytes, blocking_s * 1e6,
                  gb / blocking_s * bus_factor, async_s * 1e6, gb / async_s * bus_factor, caller_s * 1e6,
                  gb / caller_s * bus_factor);
      if (mpi_comparable) {
        std::printf("%10.2f %9.3f | %8.2f %8.2f\n", mpi_s * 1e6, gb / mpi_s * bus_factor, blocking_s / async_s,
                    mpi_s / async_s);
      } else {
        std::printf("%10s %9s | %8.2f %8s\n", "-", "-", blocking_s / async_s, "-");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
