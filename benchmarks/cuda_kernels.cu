// herd's CUDA kernels beside a plain device-to-device copy of the same bytes, in one run.
//
//   build/benchmarks/cuda_kernels [--max-mib 1024] [--reps 20]
//
// Buffers of 4 KiB to --max-mib (x4 steps). Bandwidth counts the bytes each operation must read
// and write (a copy of N bytes moves 2N; out = a + b moves 3N). The ratio is the kernel's
// bandwidth over the copy's at the same size: the copy is the device's practical limit. Targets,
// at 64 MiB and above: >= 0.90 for f32 reductions, scale and casts, >= 0.80 for the 16-bit
// reductions, >= 0.85 for the batched pack/unpack of 1000 tensors of mixed sizes. (Below 64 MiB a
// copy's traffic is partly served by an H100's 50 MB L2, which three-buffer kernels cannot match.)
// Times are medians of 7 timed batches (CUDA events) after a warm-up. Inputs are varied values (not a constant), and before each operation is timed its
// result is checked, bit for bit, against herd's host functions on the same inputs (whole up to
// 64 MiB); a wrong result ends the run with status 1. Without a CUDA device it says so and exits
// with 77.

#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/cuda/kernels.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
  // What the operation must write: device memory at `at`, `bytes` of it, equal to what
  // expect(host a, host b, result) computes.
  const void* at;
  std::size_t bytes;
  std::function<void(const std::byte*, const std::byte*, std::byte*)> expect;
};

std::vector<std::byte> read(const void* device, std::size_t bytes) {
  std::vector<std::byte> host(bytes);
  HERD_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_mib = 1024;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-mib") max_mib = std::stoul(argv[i + 1]);
    else if (flag == "--reps") reps = std::stoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing measured\n");
    return 77;
  }
  const std::size_t max_bytes = max_mib << 20;
  const std::size_t checked_bytes = std::min(max_bytes, std::size_t{64} << 20);
  herd::cuda::device_buffer a_buf, b_buf, out_buf, a0_buf, b0_buf;
  auto* a = static_cast<float*>(a_buf.get(max_bytes));
  auto* b = static_cast<float*>(b_buf.get(max_bytes));
  auto* out = static_cast<float*>(out_buf.get(max_bytes));
  auto* a0 = static_cast<float*>(a0_buf.get(max_bytes));  // the inputs as they start, restored before each operation
  auto* b0 = static_cast<float*>(b0_buf.get(max_bytes));
  // Varied values, k/64 and k/32 for |k| <= 1000 (exact in every cast here), repeating.
  std::vector<float> host_a(max_bytes / 4), host_b(max_bytes / 4);
  for (std::size_t i = 0; i < host_a.size(); ++i) {
    host_a[i] = static_cast<float>(static_cast<int>(i * 7919 % 2001) - 1000) / 64;
    host_b[i] = static_cast<float>(static_cast<int>(i * 104729 % 2001) - 1000) / 32;
  }
  HERD_CUDA_CHECK(cudaMemcpy(a0, host_a.data(), max_bytes, cudaMemcpyHostToDevice));
  HERD_CUDA_CHECK(cudaMemcpy(b0, host_b.data(), max_bytes, cudaMemcpyHostToDevice));
  const auto* ha = reinterpret_cast<const std::byte*>(host_a.data());
  const auto* hb = reinterpret_cast<const std::byte*>(host_b.data());
  cudaDeviceProp prop{};
  HERD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# herd CUDA kernels vs device-to-device copy on %s, median of 7 batches of %d\n", prop.name, reps);
  std::printf("%-44s %12s %10s %10s %8s %8s\n", "operation", "bytes", "us", "GB/s", "vs copy", "target");
  int missed = 0, judged = 0, wrong = 0;
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
         [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, out, a, b, n, 0, nullptr); }, out, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::f32, herd::reduce_op::sum, r, x, y, n); }},
        {"reduce f32 a += b (in place)", 3 * N, 0.90,
         [&] { herd::cuda::reduce(herd::dtype::f32, herd::reduce_op::sum, a, a, b, n, 0, nullptr); }, a, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::f32, herd::reduce_op::sum, r, x, y, n); }},
        {"reduce f16 sum out = a + b", 3 * N, 0.80,
         [&] { herd::cuda::reduce(herd::dtype::f16, herd::reduce_op::sum, out, a, b, 2 * n, 0, nullptr); }, out, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::f16, herd::reduce_op::sum, r, x, y, 2 * n); }},
        {"reduce f16 avg out = (a + b) / 2", 3 * N, 0.80,
         [&] { herd::cuda::reduce(herd::dtype::f16, herd::reduce_op::avg, out, a, b, 2 * n, 2, nullptr); }, out, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::f16, herd::reduce_op::avg, r, x, y, 2 * n, 2); }},
        {"reduce f16 avg out = (a + b) / 3", 3 * N, 0.80,
         [&] { herd::cuda::reduce(herd::dtype::f16, herd::reduce_op::avg, out, a, b, 2 * n, 3, nullptr); }, out, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::f16, herd::reduce_op::avg, r, x, y, 2 * n, 3); }},
        {"reduce bf16 avg out = (a + b) / 2", 3 * N, 0.80,
         [&] { herd::cuda::reduce(herd::dtype::bf16, herd::reduce_op::avg, out, a, b, 2 * n, 2, nullptr); }, out, bytes,
         [&](auto x, auto y, auto r) { herd::detail::host_reduce(herd::dtype::bf16, herd::reduce_op::avg, r, x, y, 2 * n, 2); }},
        {"scale f32 in place", 2 * N, 0.90,
         [&] { herd::cuda::cast(a, herd::dtype::f32, a, herd::dtype::f32, n, 0.5, nullptr); }, a, bytes,
         [&](auto x, auto, auto r) { herd::detail::host_cast(r, herd::dtype::f32, x, herd::dtype::f32, n, 0.5); }},
        {"cast f32 -> f16", 1.5 * N, 0.90,
         [&] { herd::cuda::cast(out, herd::dtype::f16, a, herd::dtype::f32, n, 1.0, nullptr); }, out, bytes / 2,
         [&](auto x, auto, auto r) { herd::detail::host_cast(r, herd::dtype::f16, x, herd::dtype::f32, n); }},
        {"cast f16 -> f32", 0.75 * N, 0.90,  // N/4 bytes read, N/2 written
         [&] { herd::cuda::cast(out, herd::dtype::f32, a, herd::dtype::f16, n / 2, 1.0, nullptr); }, out, bytes,
         [&](auto x, auto, auto r) { herd::detail::host_cast(r, herd::dtype::f32, x, herd::dtype::f16, n / 2); }},
        {"batched pack, " + std::to_string(pack.size()) + " tensors", packed, 0.85,
         [&] { copier.run(pack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); }, out, used * 4,
         [&](auto x, auto, auto r) { std::memcpy(r, x, used * 4); }},
        {"batched unpack, " + std::to_string(unpack.size()) + " tensors", packed, 0.85,
         [&] { copier.run(unpack, herd::dtype::f32, herd::dtype::f32, 1.0, nullptr); }, b, used * 4,
         [&](auto, auto, auto r) { std::memset(r, 0, used * 4); }},  // out starts zeroed
        {"batched pack + cast f32 -> f16 + scale", 6.0 * static_cast<double>(used), 0.85,
         [&] { copier.run(pack_half, herd::dtype::f16, herd::dtype::f32, 0.5, nullptr); }, out, used * 2,
         [&](auto x, auto, auto r) { herd::detail::host_cast(r, herd::dtype::f16, x, herd::dtype::f32, used, 0.5); }},
    };
    const double copy_ms =
        median_ms([&] { HERD_CUDA_CHECK(cudaMemcpyAsync(out, a, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    const double copy_gbs = 2.0 * N / copy_ms / 1e6;
    std::printf("%-44s %12zu %10.2f %10.1f %8.2f %8s\n", "cudaMemcpy device to device", bytes, copy_ms * 1e3, copy_gbs,
                1.0, "");
    const bool judge = bytes >= (std::size_t{64} << 20);
    for (const auto& r : rows) {
      // Fresh inputs, a zeroed output, one run checked; then the timing.
      HERD_CUDA_CHECK(cudaMemcpy(a, a0, bytes, cudaMemcpyDeviceToDevice));
      HERD_CUDA_CHECK(cudaMemcpy(b, b0, bytes, cudaMemcpyDeviceToDevice));
      HERD_CUDA_CHECK(cudaMemset(out, 0, bytes));
      r.run();
      HERD_CUDA_CHECK(cudaDeviceSynchronize());
      if (r.bytes <= checked_bytes) {
        const std::vector<std::byte> got = read(r.at, r.bytes);
        std::vector<std::byte> want(r.bytes);
        r.expect(ha, hb, want.data());
        if (got != want) {
          ++wrong;
          std::printf("WRONG: %s at %zu bytes differs from herd's host result\n", r.name.c_str(), bytes);
        }
      }
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
  std::printf("results: %s (checked up to %zu MiB)\n", wrong == 0 ? "all right" : "WRONG (see above)", checked_bytes >> 20);
  std::printf("summary: %d kernel runs at >= 64 MiB judged, %d below target, %d wrong\n", judged, missed, wrong);
  return wrong == 0 ? 0 : 1;
}
