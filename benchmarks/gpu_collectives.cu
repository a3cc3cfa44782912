// herd's allreduce of GPU tensors beside the limits of the machine, in one run under mpiexec:
//
//   mpiexec -n 1 build/benchmarks/gpu_collectives   # NCCL at one rank: herd's path vs raw NCCL vs a copy
//   mpiexec -n 2 build/benchmarks/gpu_collectives   # also the staged ring over MPI (processes may share a GPU)
//   [--max-mib 1024] [--reps 7]
//
// Columns, each the median of `reps` timed calls after a warm-up (all ranks start together):
//   copy     cudaMemcpy device to device of the same bytes (the device's own limit)
//   nccl     ncclAllReduce called directly (one rank per process: a communicator of its own at
//            one rank, since NCCL takes one rank per GPU)
//   herd     herd::allreduce of the same tensor over that nccl_communicator: herd's overhead
//            (agreement over MPI, stream ordering, host synchronization) is herd - nccl
//   staged   herd::allreduce of the device tensor over MPI, all processes: the staged ring
//   mpi      MPI_Allreduce of a host buffer of the same size, all processes (where the staged
//            ring's transfers go)
// and the two limits of the staged ring, which at p ranks moves 2(p-1)/p of the bytes out of and
// as many into each device, and as many over MPI, so its busbw is at most each limit's GB/s:
//   copy GB/s  device to page-locked host and page-locked host to device at once (two streams),
//              every process at once (processes that share a GPU share its link)
//   p2p GB/s   MPI_Isend to the right and MPI_Irecv from the left of page-locked host buffers,
//              every process at once, in the ring's 1 MiB messages and window (its transfers)
// Sizes in bytes of f32 data, 4 KiB to --max-mib. busbw = 2(p-1)/p * bytes / time. Every rank's
// input is all ones, and every result is checked to be the number of ranks (whole up to 64 MiB,
// its first and last MiB above); a wrong result or a failed NCCL call ends the run with status 1.
// Without a CUDA device it says so and exits with 77.

#include <herd/herd.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

double median_us(herd::mpi_communicator& world, const std::function<void()>& run, int reps) {
  run();
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    MPI_Barrier(world.native());
    const auto start = std::chrono::steady_clock::now();
    run();
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  double worst = samples[samples.size() / 2];  // the slowest rank's median is the collective's time
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, world.native());
  return worst;
}

// Whether the n floats at `data` (device memory when `on_device`) all equal `want`: all of them up
// to 64 MiB, the first and last MiB above.
bool all_equal(const float* data, std::size_t n, float want, bool on_device) {
  const std::size_t edge = std::size_t{1} << 18;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // (first, count)
  if (n <= (std::size_t{16} << 20)) ranges.emplace_back(0, n);
  else ranges = {{0, edge}, {n - edge, edge}};
  std::vector<float> host;
  for (const auto& [first, count] : ranges) {
    host.resize(count);
    if (on_device) HERD_CUDA_CHECK(cudaMemcpy(host.data(), data + first, count * 4, cudaMemcpyDeviceToHost));
    else std::copy_n(data + first, count, host.begin());
    if (std::count(host.begin(), host.end(), want) != static_cast<std::ptrdiff_t>(count)) return false;
  }
  return true;
}

// herd's NCCL communicators are non-blocking (their set-up is watched): a call may answer
// ncclInProgress while it is still being enqueued, until ncclCommGetAsyncError says otherwise.
void nccl_check(ncclResult_t code, ncclComm_t comm, const char* call) {
  while (code == ncclInProgress) ncclCommGetAsyncError(comm, &code);
  if (code == ncclSuccess) return;
  std::fprintf(stderr, "%s failed: %s\n", call, ncclGetErrorString(code));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator world;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    if (world.rank() == 0) std::printf("no CUDA device: nothing measured\n");
    return 77;
  }
  std::size_t max_mib = 1024;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-mib") max_mib = std::stoul(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
  }
  const int device = herd::mpi::local_rank() % gpus;
  HERD_CUDA_CHECK(cudaSetDevice(device));
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  herd::nccl_communicator gpu(alone, device);
  const int p = world.size();
  const std::size_t max_bytes = max_mib << 20;
  herd::cuda::device_buffer in_buf, out_buf;
  herd::cuda::pinned_buffer host_from_buf, host_to_buf;
  herd::cuda::stream down, up;
  auto* in = static_cast<float*>(in_buf.get(max_bytes));
  auto* out = static_cast<float*>(out_buf.get(max_bytes));
  std::vector<float> host_in(max_bytes / 4, 1.0f), host_out(max_bytes / 4);
  HERD_CUDA_CHECK(cudaMemcpy(in, host_in.data(), max_bytes, cudaMemcpyHostToDevice));
  int wrong = 0;
  auto expect = [&](const char* what, std::size_t bytes, const float* data, bool on_device, float want) {
    if (all_equal(data, bytes / 4, want, on_device)) return;
    ++wrong;
    std::fprintf(stderr, "rank %d: %s of %zu bytes gave a wrong result (want %g everywhere)\n", world.rank(), what, bytes,
                 static_cast<double>(want));
  };
  cudaDeviceProp prop{};
  HERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));

  if (world.rank() == 0) {
    std::printf("# herd allreduce of GPU tensors on %s, %d process(es) on %d GPU(s), median of %d\n", prop.name, p, gpus,
                reps);
    std::printf("%10s %10s %10s %10s %8s %10s %10s %10s %8s %9s %9s %8s\n", "bytes", "copy us", "nccl us", "herd us",
                "herd/ncl", "staged us", "mpi us", "busbw GB/s", "stg/mpi", "copy GB/s", "p2p GB/s", "stg/lim");
  }
  double staged_at_256 = 0, busbw_at_256 = 0, mpi_at_256 = 0, limit_at_256 = 0;
  const std::size_t message = std::size_t{1} << 20;
  auto* host_from = static_cast<std::byte*>(host_from_buf.get(max_bytes));
  auto* host_to = static_cast<std::byte*>(host_to_buf.get(max_bytes));
  std::memset(host_from, 1, max_bytes);
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;
    const herd::const_buffer_view vin(in, n, herd::dtype::f32, herd::device::cuda(device));
    herd::buffer_view vout{out, n, herd::dtype::f32, herd::device::cuda(device)};
    const double copy = median_us(world, [&] { HERD_CUDA_CHECK(cudaMemcpy(out, in, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    expect("cudaMemcpy", bytes, out, true, 1.0f);
    // NCCL at one rank per process (a communicator of its own): its sum is the input.
    const double nccl = median_us(world, [&] {
      nccl_check(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, gpu.native(), gpu.stream()), gpu.native(), "ncclAllReduce");
      HERD_CUDA_CHECK(cudaStreamSynchronize(gpu.stream()));
    }, reps);
    expect("ncclAllReduce", bytes, out, true, 1.0f);
    HERD_CUDA_CHECK(cudaMemset(out, 0, bytes));
    const double herd_nccl = median_us(world, [&] { herd::allreduce(vin, vout, gpu); }, reps);
    expect("herd::allreduce over NCCL", bytes, out, true, 1.0f);
    double staged = 0, mpi = 0, copy_gbs = 0, p2p_gbs = 0;
    if (p > 1) {
      const double both_ways = median_us(world, [&] {
        HERD_CUDA_CHECK(cudaMemcpyAsync(host_to, in, bytes, cudaMemcpyDeviceToHost, down.get()));
        HERD_CUDA_CHECK(cudaMemcpyAsync(out, host_from, bytes, cudaMemcpyHostToDevice, up.get()));
        down.synchronize();
        up.synchronize();
      }, reps);
      copy_gbs = static_cast<double>(bytes) / both_ways / 1e3;
      const int right = (world.rank() + 1) % p, left = (world.rank() + p - 1) % p;
      const double exchange = median_us(world, [&] {
        // As the ring sends: its window of messages in flight each way, the next posted as one ends.
        constexpr std::size_t window = herd::detail::staged_window;
        std::vector<MPI_Request> receives(window, MPI_REQUEST_NULL), sends(window, MPI_REQUEST_NULL);
        for (std::size_t k = 0, at = 0; at < bytes; ++k, at += message) {
          const int len = static_cast<int>(std::min(message, bytes - at));
          MPI_Wait(&receives[k % window], MPI_STATUS_IGNORE);
          MPI_Wait(&sends[k % window], MPI_STATUS_IGNORE);
          MPI_Irecv(host_to + at, len, MPI_BYTE, left, 7, world.native(), &receives[k % window]);
          MPI_Isend(host_from + at, len, MPI_BYTE, right, 7, world.native(), &sends[k % window]);
        }
        MPI_Waitall(static_cast<int>(window), receives.data(), MPI_STATUSES_IGNORE);
        MPI_Waitall(static_cast<int>(window), sends.data(), MPI_STATUSES_IGNORE);
      }, reps);
      p2p_gbs = static_cast<double>(bytes) / exchange / 1e3;
      HERD_CUDA_CHECK(cudaMemset(out, 0, bytes));
      staged = median_us(world, [&] { herd::allreduce(vin, vout, world); }, reps);
      expect("herd::allreduce staged over MPI", bytes, out, true, static_cast<float>(p));
      mpi = median_us(world, [&] {
        MPI_Allreduce(host_in.data(), host_out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, world.native());
      }, reps);
      expect("MPI_Allreduce", bytes, host_out.data(), false, static_cast<float>(p));
    }
    const double busbw = p > 1 ? 2.0 * (p - 1) / p * static_cast<double>(bytes) / staged / 1e3 : 0.0;
    const double limit = std::min(copy_gbs, p2p_gbs);
    if (bytes == (std::size_t{256} << 20)) staged_at_256 = staged, busbw_at_256 = busbw, mpi_at_256 = mpi, limit_at_256 = limit;
    if (world.rank() == 0) {
      std::printf("%10zu %10.1f %10.1f %10.1f %8.2f %10.1f %10.1f %10.2f %8.2f %9.2f %9.2f %8.2f\n", bytes, copy, nccl,
                  herd_nccl, herd_nccl / nccl, staged, mpi, busbw, p > 1 ? mpi / staged : 0.0, copy_gbs, p2p_gbs,
                  limit > 0 ? busbw / limit : 0.0);
    }
  }
  if (world.rank() == 0) {
    if (p > 1 && staged_at_256 > 0) {
      std::printf("summary: staged ring at 256 MiB, %d processes: %.2f GB/s busbw, %.2fx MPI_Allreduce on host memory, "
                  "%.2f of its limit (%.2f GB/s)\n", p, busbw_at_256, mpi_at_256 / staged_at_256, busbw_at_256 / limit_at_256,
                  limit_at_256);
    } else {
      std::printf("summary: NCCL at one rank, herd's path beside raw NCCL (table above)\n");
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, world.native());
  if (world.rank() == 0) std::printf("results: %s\n", wrong == 0 ? "all checked right" : "WRONG (see the errors above)");
  return wrong == 0 ? 0 : 1;
}
