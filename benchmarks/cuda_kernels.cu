// herd's CUDA kernels beside a plain device-to-device copy of the same bytes, in one run.
//
//   build/benchmarks/cuda_kernels [--max-mib 1024] [--reps 20]
//
// Buffers of 4 KiB to --max-mib (x4 steps). Bandwidth counts the bytes each operation must read
// and write (a copy of N bytes moves 2N; out = a + b moves 3N). The ratio is the kernel's
// bandwidth over the copy's at the same size: the copy is the device's practical limit. Targets,
// at 16 MiB and above: >= 0.90 for reduce, scale and casts, >= 0.85 for the batched pack/unpack
// of 1000 tensors of mixed sizes. Times are medians of 7 timed batches (CUDA events) after a
// warm-up.

#include <herd/cuda/kernels.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace {

double median_ms(const std::function<void()>& run, int reps) {
  cudaEvent_t start, stop;
  HERD_CUDA_CHECK(cudaEventCreate(&start));
  HERD_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> samples;
  for (int batch = 0; batch < 7; ++batch) {
    HERD_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < reps; ++i) run();
    HERD_CUDA_CHECK(cudaEventRecord(stop));
    HERD_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    HERD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms / static_cast<float>(reps));
  }
  std::sort(samples.begin(), samples.end());
  HERD_CUDA_CHECK(cudaEventDestroy(start));
  HERD_CUDA_CHECK(cudaEventDestroy(stop));
  return samples[samples.size() / 2];
}

struct row {
  std::string name;
  double moved;  // bytes read and written
  double target;
  std::function<void()> run;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_mib = 1024;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-mib") max_mib = std::stoul(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
  }
  const std::size_t max_bytes = max_mib << 20;
  herd::cuda::device_buffer a_buf, b_buf, out_buf;
  auto* a = static_cast<float*>(a_buf.get(max_bytes));
  auto* b = static_cast<float*>(b_buf.get(max_bytes));
  auto* out = static_cast<float*>(out_buf.get(max_bytes));
  HERD_CUDA_CHECK(cudaMemset(a, 0x3c, max_bytes));  // non-zero data: 1.15 everywhere
  HERD_CUDA_CHECK(cudaMemset(b, 0x3d, max_bytes));
  cudaDeviceProp prop{};
  HERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# herd CUDA kernels vs device-to-device copy on %s, median of 7 batches of %d\n", prop.name, reps);
  std::printf("%-44s %12s %10s %10s %8s %8s\n", "operation", "bytes", "us", "GB/s", "vs copy", "target");
  int missed = 0, judged = 0;
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / 4;  // f32 elements
    const double N = static_cast<double>(bytes);
    herd::cuda::batched_copy copier;
    // Up to 1000 tensors of mixed sizes (a few large, many small) packed into one buffer and back.
    std::vector<herd::cuda::batched_copy::item> pack, unpack, pack_half;
    std::size_t used = 0;
    unsigned seed = 12345;
    for (int i = 0; i < 1000; ++i) {
      seed = seed * 1103515245u + 12345u;
      const std::size_t count = (i % 50 == 0) ? n / 64 + seed % 64 : 1 + seed % std::max<std::size_t>(1, n / 4000);
      if (used + count > n / 2) break;
      pack.push_back({a + used, out + used, count});
      unpack.push_back({out + used, b + used, count});
      pack_half.push_back({a + used, reinterpret_cast<herd::half*>(out) + used, count});
      used += count;
    }
    const double packed = 2.0 * 4.0 * static_cast<double>(used);
    const std::vector<row> rows = {
        {"reduce f32 out = a + b", 3 * N, 0.90,
         [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, out, a, b, n, 0, nullptr); }},
        {"reduce f32 a += b (in place)", 3 * N, 0.90,
         [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, a, a, b, n, 0, nullptr); }},
        {"reduce f16 avg out = (a + b) / 2", 3 * N, 0.90,
         [&] { herd::cuda::reduce(herd::dtype::f16, herd::reduce_op::avg, out, a, b, 2 * n, 2, nullptr); }},
        {"scale f32 in place", 2 * N, 0.90,
         [&] { herd::cuda::cast(out, herd::dtype::f32, out, herd::dtype::f32, n, 0.5, nullptr); }},
        {"cast f32 -> f16", 1.5 * N, 0.90,
         [&] { herd::cuda::cast(out, herd::dtype::f16, a, herd::dtype::f32, n, 1.0, nullptr); }},
        {"cast f16 -> f32", 1.5 * N, 0.90,
         [&] { herd::cuda::cast(out, herd::dtype::f32, a, herd::dtype::f16, n / 2, 1.0, nullptr); }},
        {"batched pack, " + std::to_string(pack.size()) + " tensors", packed, 0.85,
         [&] { copier.run(pack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); }},
        {"batched unpack, " + std::to_string(unpack.size()) + " tensors", packed, 0.85,
         [&] { copier.run(unpack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); }},
        {"batched pack + cast f32 -> f16 + scale", 6.0 * static_cast<double>(used), 0.85,
         [&] { copier.run(pack_half, herd::dtype::f16, herd::dtype::f32, 0.5, nullptr); }},
    };
    const double copy_ms =
        median_ms([&] { HERD_CUDA_CHECK(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    const double copy_gbs = 2.0 * N / copy_ms / 1e6;
    std::printf("%-44s %12zu %10.2f %10.1f %8.2f %8s\n", "cudaMemcpy device to device", bytes, copy_ms * 1e3, copy_gbs,
                1.0, "");
    const bool judge = bytes >= (std::size_t{16} << 20);
    for (const auto& r : rows) {
      const double ms = median_ms(r.run, reps);
      const double gbs = r.moved / ms / 1e6;
      const double ratio = gbs / copy_gbs;
      judged += judge;
      missed += judge && ratio < r.target;
      std::printf("%-44s %12zu %10.2f %10.1f %8.2f %8s%s\n", r.name.c_str(), bytes, ms * 1e3, gbs, ratio,
                  judge ? std::to_string(r.target).substr(0, 4).c_str() : "-",
                  judge && ratio < r.target ? "  (below target)" : "");
    }
  }
  std::printf("summary: %d kernel runs at >= 16 MiB judged, %d below target\n", judged, missed);
  return 0;
}
