// herd's CUDA kernels beside a plain device-to-device copy of the same bytes, in one run.
//
//   build/benchmarks/cuda_kernels [--mib 256] [--reps 20]
//
// Bandwidth counts the bytes each operation must read and write (a copy of N bytes moves 2N;
// out = a + b moves 3N). The ratio is the kernel's bandwidth over the copy's: the copy is the
// device's practical limit. Targets: >= 0.90 for reduce, scale and casts on large buffers,
// >= 0.85 for the batched pack/unpack of 1000 tensors of mixed sizes. Times are medians of
// several timed batches (CUDA events) after a warm-up.

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

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--mib") mib = std::stoul(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
  }
  const std::size_t bytes = mib << 20;
  const std::size_t n = bytes / 4;  // f32 elements
  herd::cuda::device_buffer a_buf, b_buf, out_buf;
  auto* a = static_cast<float*>(a_buf.get(bytes));
  auto* b = static_cast<float*>(b_buf.get(bytes));
  auto* out = static_cast<float*>(out_buf.get(bytes));
  HERD_CUDA_CHECK(cudaMemset(a, 0x3c, bytes));  // non-zero data: 1.15 everywhere
  HERD_CUDA_CHECK(cudaMemset(b, 0x3d, bytes));
  cudaDeviceProp prop{};
  HERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  const double copy_ms = median_ms([&] { HERD_CUDA_CHECK(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice)); }, reps);
  const double copy_gbs = 2.0 * static_cast<double>(bytes) / copy_ms / 1e6;
  struct row {
    std::string name;
    double moved;
    double ms;
    double target;
  };
  std::vector<row> rows;
  auto add = [&](std::string name, double moved, double target, const std::function<void()>& run) {
    rows.push_back({std::move(name), moved, median_ms(run, reps), target});
  };
  const double N = static_cast<double>(bytes);
  add("reduce f32 out = a + b", 3 * N, 0.90,
      [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, out, a, b, n, 0, nullptr); });
  add("reduce f32 a += b (in place)", 3 * N, 0.90,
      [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, a, a, b, n, 0, nullptr); });
  add("reduce f16 avg out = (a + b) / 2", 3 * N, 0.90, [&] {
    herd::cuda::reduce(herd::dtype::f16, herd::reduce_op::avg, out, a, b, 2 * n, 2, nullptr);
  });
  add("scale f32 in place", 2 * N, 0.90,
      [&] { herd::cuda::cast(out, herd::dtype::f32, out, herd::dtype::f32, n, 0.5, nullptr); });
  add("cast f32 -> f16", 1.5 * N, 0.90, [&] { herd::cuda::cast(out, herd::dtype::f16, a, herd::dtype::f32, n, 1.0, nullptr); });
  add("cast f16 -> f32", 1.5 * N, 0.90,
      [&] { herd::cuda::cast(out, herd::dtype::f32, a, herd::dtype::f16, n / 2, 1.0, nullptr); });

  // 1000 tensors of mixed sizes (a few large, many small) packed into one buffer and back.
  std::vector<herd::cuda::batched_copy::item> pack, unpack, pack_half;
  std::size_t used = 0;
  unsigned seed = 12345;
  for (int i = 0; i < 1000 && used < n / 2; ++i) {
    seed = seed * 1103515245u + 12345u;
    const std::size_t count = (i % 50 == 0) ? (std::size_t{1} << 20) + (seed % 4096) : 64 + seed % 50000;
    if (used + count > n / 2) break;
    pack.push_back({a + used, out + used, count});
    unpack.push_back({out + used, b + used, count});
    pack_half.push_back({a + used, reinterpret_cast<herd::half*>(out) + used, count});
    used += count;
  }
  herd::cuda::batched_copy copier;
  const double packed = 2.0 * 4.0 * static_cast<double>(used);
  add("batched pack, " + std::to_string(pack.size()) + " tensors", packed, 0.85,
      [&] { copier.run(pack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); });
  add("batched unpack, " + std::to_string(unpack.size()) + " tensors", packed, 0.85,
      [&] { copier.run(unpack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); });
  add("batched pack + cast f32 -> f16 + scale", 6.0 * static_cast<double>(used), 0.85,
      [&] { copier.run(pack_half, herd::dtype::f16, herd::dtype::f32, 0.5, nullptr); });

  std::printf("# herd CUDA kernels vs device-to-device copy on %s, %zu MiB buffers, median of 7 batches of %d\n",
              prop.name, mib, reps);
  std::printf("%-44s %10s %10s %8s %8s\n", "operation", "ms", "GB/s", "vs copy", "target");
  std::printf("%-44s %10.3f %10.1f %8.2f %8s\n", "cudaMemcpy device to device", copy_ms, copy_gbs, 1.0, "");
  int missed = 0;
  for (const auto& r : rows) {
    const double gbs = r.moved / r.ms / 1e6;
    const double ratio = gbs / copy_gbs;
    missed += ratio < r.target;
    std::printf("%-44s %10.3f %10.1f %8.2f %8.2f%s\n", r.name.c_str(), r.ms, gbs, ratio, r.target,
                ratio < r.target ? "  (below target)" : "");
  }
  std::printf("summary: %zu kernels, %d below target\n", rows.size(), missed);
  return 0;
}
