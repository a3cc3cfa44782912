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
// Sizes in bytes of f32 data, 4 KiB to --max-mib. busbw = 2(p-1)/p * bytes / time.

#include <herd/herd.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator world;
  std::size_t max_mib = 1024;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-mib") max_mib = std::stoul(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
  }
  int gpus = 0;
  HERD_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  const int device = herd::mpi::local_rank() % gpus;
  HERD_CUDA_CHECK(cudaSetDevice(device));
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  herd::nccl_communicator gpu(alone, device);
  const int p = world.size();
  const std::size_t max_bytes = max_mib << 20;
  herd::cuda::device_buffer in_buf, out_buf;
  auto* in = static_cast<float*>(in_buf.get(max_bytes));
  auto* out = static_cast<float*>(out_buf.get(max_bytes));
  HERD_CUDA_CHECK(cudaMemset(in, 0x3c, max_bytes));
  std::vector<float> host_in(max_bytes / 4, 1.0f), host_out(max_bytes / 4);
  cudaDeviceProp prop{};
  HERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));

  if (world.rank() == 0) {
    std::printf("# herd allreduce of GPU tensors on %s, %d process(es) on %d GPU(s), median of %d\n", prop.name, p, gpus,
                reps);
    std::printf("%10s %10s %10s %10s %8s %10s %10s %10s %8s\n", "bytes", "copy us", "nccl us", "herd us", "herd/ncl",
                "staged us", "mpi us", "busbw GB/s", "stg/mpi");
  }
  double staged_at_256 = 0, mpi_at_256 = 0;
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;
    const herd::const_buffer_view vin(in, n, herd::dtype::f32, herd::device::cuda(device));
    herd::buffer_view vout{out, n, herd::dtype::f32, herd::device::cuda(device)};
    const double copy = median_us(world, [&] { HERD_CUDA_CHECK(cudaMemcpy(out, in, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    const double nccl = median_us(world, [&] {
      ncclAllReduce(in, out, n, ncclFloat32, ncclSum, gpu.native(), gpu.stream());
      HERD_CUDA_CHECK(cudaStreamSynchronize(gpu.stream()));
    }, reps);
    const double herd_nccl = median_us(world, [&] { herd::allreduce(vin, vout, gpu); }, reps);
    double staged = 0, mpi = 0;
    if (p > 1) {
      staged = median_us(world, [&] { herd::allreduce(vin, vout, world); }, reps);
      mpi = median_us(world, [&] {
        MPI_Allreduce(host_in.data(), host_out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, world.native());
      }, reps);
    }
    if (bytes == (std::size_t{256} << 20)) staged_at_256 = staged, mpi_at_256 = mpi;
    if (world.rank() == 0) {
      const double busbw = p > 1 ? 2.0 * (p - 1) / p * static_cast<double>(bytes) / staged / 1e3 : 0.0;
      std::printf("%10zu %10.1f %10.1f %10.1f %8.2f %10.1f %10.1f %10.2f %8.2f\n", bytes, copy, nccl, herd_nccl,
                  herd_nccl / nccl, staged, mpi, busbw, p > 1 ? mpi / staged : 0.0);
    }
  }
  if (world.rank() == 0) {
    if (p > 1 && staged_at_256 > 0) {
      std::printf("summary: staged ring at 256 MiB, %d processes: %.2f GB/s busbw, %.2fx MPI_Allreduce on host memory\n", p,
                  2.0 * (p - 1) / p * 268435456.0 / staged_at_256 / 1e3, mpi_at_256 / staged_at_256);
    } else {
      std::printf("summary: NCCL at one rank, herd's path beside raw NCCL (table above)\n");
    }
  }
  return 0;
}
