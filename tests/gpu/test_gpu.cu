// The GPU suite: herd's kernels against the host reference on a real device, the NCCL
// communicator, the staged collectives with several processes sharing one GPU, ordering after the
// caller's stream, and the distributed optimizer on device gradients. Run by tools/gpu-check.sh
// (1, 2 and 3 processes); skipped where there is no GPU. Outputs start poisoned and every
// collective that can be is run out of place, so a collective that did nothing fails.

#include <herd/herd.hpp>
#include <herd/cuda/kernels.hpp>
#include <herd/tensor/thrust.hpp>

#include "../support/mpi_test.hpp"
#include "../support/reference.hpp"
#include "../support/tiny_mlp.hpp"
#include "cast_case.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace {

using herd_test::rng;
using herd_test::values;

// Device memory holding a copy of host bytes, poisoned around them.
struct device_bytes {
  herd::cuda::device_buffer memory;
  std::byte* data = nullptr;
  std::size_t bytes = 0;

  device_bytes(const void* host, std::size_t n, std::size_t offset = 0) : bytes(n) {
    data = static_cast<std::byte*>(memory.get(n + offset + 64)) + offset;
    HERD_CUDA_CHECK(cudaMemset(memory.get(n + offset + 64), 0xa5, n + offset + 64));
    if (host != nullptr && n != 0) HERD_CUDA_CHECK(cudaMemcpy(data, host, n, cudaMemcpyHostToDevice));
  }
  template <class T> std::vector<T> read(std::size_t count) const {
    std::vector<T> out(count);
    if (count != 0) HERD_CUDA_CHECK(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
};

// A slow producer: spins for about `cycles` clock ticks, then writes `value` everywhere. Launched
// on a non-blocking stream, it is still running when the host calls herd.
__global__ void fill_late(float* data, std::size_t n, float value, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    data[i] = value;
}

int device_of_rank() {
  int devices = 1;
  HERD_CUDA_CHECK(cudaGetDeviceCount(&devices));
  return herd::mpi::local_rank() % devices;
}

std::string message_of(auto fn) {
  try {
    fn();
  } catch (const herd::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

HERD_MPI_TEST_CASE("the reduce kernel equals the host reduction for every dtype x op, with odd sizes and offsets", 1) {
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  rng g(101);
  for (auto type : herd::all_dtypes) {
    for (auto op : herd::all_reduce_ops) {
      if (!herd::supports(type, op)) continue;
      herd::visit(type, [&](auto element) {
        using T = decltype(element);
        for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{4099}, std::size_t{1} << 20}) {
          for (std::size_t offset : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
            const auto a = herd_test::draw_vector<T>(g, n, values::rough, op);
            const auto b = herd_test::draw_vector<T>(g, n, values::rough, op);
            std::vector<T> want(n);
            const int avg = op == herd::reduce_op::avg ? 5 : 0;
            herd::detail::host_reduce(type, op, want.data(), a.data(), b.data(), n, avg);
            device_bytes da(a.data(), n * sizeof(T), offset * sizeof(T));
            device_bytes db(b.data(), n * sizeof(T));
            device_bytes out(nullptr, n * sizeof(T), (offset + 1) * sizeof(T) % 16);
            herd::cuda::reduce(type, op, out.data, da.data, db.data, n, avg, nullptr);
            HERD_CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = out.read<T>(n);
            INFO(herd::name(type), " ", herd::name(op), " n=", n, " offset ", offset);
            CHECK(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0);
          }
        }
      });
    }
  }
}

HERD_MPI_TEST_CASE("herd's avg divides the sum: the division kernel equals the host's for every dtype", 1) {
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  rng g(103);
  for (auto type : herd::all_dtypes) {
    herd::visit(type, [&](auto element) {
      using T = decltype(element);
      const std::size_t n = 100001;
      auto values = herd_test::draw_vector<T>(g, n, values::rough, herd::reduce_op::sum);
      std::vector<T> want = values;
      herd::detail::host_finalize_avg(type, want.data(), n, 3);
      device_bytes data(values.data(), n * sizeof(T));
      herd::cuda::finalize_avg(type, data.data, n, 3, nullptr);
      HERD_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = data.read<T>(n);
      INFO(herd::name(type));
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(T)) == 0);
    });
  }
}

HERD_MPI_TEST_CASE("the cast kernel and the batched copy equal the host casts", 1) {
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  rng g(herd_test::gpu_cast::seed);
  const std::size_t n = herd_test::gpu_cast::count;
  const std::vector<float> values = herd_test::gpu_cast::inputs(g);
  device_bytes in(values.data(), n * 4, 4);
  device_bytes half_out(nullptr, n * 2, 2);
  herd::cuda::cast(half_out.data, herd::dtype::f16, in.data, herd::dtype::f32, n, herd_test::gpu_cast::scale, nullptr);
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto halves = half_out.read<herd::half>(n);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += halves[i].bits != herd_test::gpu_cast::expected(values[i]);
  CHECK(differ == 0);
  bool same = true;

  // 1000 tensors of mixed sizes packed into one buffer at odd offsets, then unpacked, in one launch each.
  std::deque<device_bytes> tensors;  // deque: device buffers do not move
  std::vector<std::vector<float>> originals;
  std::size_t total = 0;
  for (int i = 0; i < 1000; ++i) {
    std::vector<float> v(g.below(10) == 0 ? g.below(20000) : g.below(500));
    for (auto& x : v) x = static_cast<float>(g.between(-1000, 1000)) / 8;
    total += v.size();
    tensors.emplace_back(v.data(), v.size() * 4, 4 * g.below(4));
    originals.push_back(std::move(v));
  }
  device_bytes buffer(nullptr, total * 2 + 2, 2);
  std::vector<herd::cuda::batched_copy::item> pack, unpack;
  std::size_t at = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    pack.push_back({tensors[i].data, buffer.data + at * 2, originals[i].size()});
    unpack.push_back({buffer.data + at * 2, tensors[i].data, originals[i].size()});
    at += originals[i].size();
  }
  herd::cuda::batched_copy copier;
  copier.run(pack, herd::dtype::f16, herd::dtype::f32, 0.25, nullptr);
  for (auto& t : tensors) HERD_CUDA_CHECK(cudaMemset(t.data, 0x7f, t.bytes));
  copier.run(unpack, herd::dtype::f32, herd::dtype::f16, 4.0, nullptr);
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  same = true;
  for (std::size_t i = 0; i < tensors.size(); ++i) same = same && tensors[i].read<float>(originals[i].size()) == originals[i];
  CHECK(same);
}

HERD_MPI_TEST_CASE("nccl_communicator: collectives on its GPU, clear errors for other tensors", 1) {
  herd::mpi_communicator world;
  const int device = device_of_rank();
  // NCCL takes one rank per GPU: each process talks to NCCL through a communicator of its own.
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  herd::nccl_communicator gpu(alone, device);
  HERD_CUDA_CHECK(cudaSetDevice(device));
  thrust::device_vector<float> v(1000, 2.5f);
  herd::allreduce(v, gpu, herd::reduce_op::avg);
  CHECK(v[999] == 2.5f);
  thrust::device_vector<std::int32_t> ints(10, 7);
  herd::allreduce(ints, gpu, herd::reduce_op::avg);
  CHECK(ints[3] == 7);
  thrust::device_vector<double> b(77, 1.5);
  herd::broadcast(b, gpu, 0);
  CHECK(b[76] == 1.5);
  thrust::device_vector<float> gathered(1000);
  herd::allgather(v, gathered, gpu);
  CHECK(gathered[0] == 2.5f);

  std::vector<float> host(10);
  const std::string on_host = message_of([&] { herd::allreduce(host, gpu); });
  INFO(on_host);
  CHECK(on_host.find("lives on cpu, which this communicator cannot reach") != std::string::npos);
  herd::buffer_view elsewhere{thrust::raw_pointer_cast(v.data()), 10, herd::dtype::f32, herd::device::cuda(device + 1)};
  const std::string other_device = message_of([&] { herd::allreduce(elsewhere, gpu); });
  INFO(other_device);
  CHECK(other_device.find("lives on cuda:" + std::to_string(device + 1)) != std::string::npos);
}

HERD_MPI_TEST_CASE("nccl_communicator at one rank: every collective out of place writes its output, every dtype and op", 1) {
  herd::mpi_communicator world;
  const int device = device_of_rank();
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  herd::nccl_communicator gpu(alone, device);
  HERD_CUDA_CHECK(cudaSetDevice(device));
  rng g(104);
  int checked = 0;
  for (auto type : herd::all_dtypes) {
    for (auto op : herd::all_reduce_ops) {
      if (!herd::supports(type, op) || herd::is_bitwise(op)) continue;
      herd::visit(type, [&](auto element) {
        using T = decltype(element);
        const std::size_t n = 4099;
        const auto values = herd_test::draw_vector<T>(g, n, herd_test::values::rough, op);
        const device_bytes in(values.data(), n * sizeof(T));
        device_bytes out(nullptr, n * sizeof(T));  // poisoned
        const herd::const_buffer_view vin(in.data, n, type, herd::device::cuda(device));
        herd::buffer_view vout{out.data, n, type, herd::device::cuda(device)};
        herd::allreduce(vin, vout, gpu, op);  // the reduction of one tensor is the tensor, avg included
        INFO(herd::name(type), " ", herd::name(op));
        CHECK(herd_test::same_bytes(out.read<T>(n).data(), values.data(), n * sizeof(T)));
        HERD_CUDA_CHECK(cudaMemset(out.data, 0xa5, n * sizeof(T)));
        herd::handle h = herd::allreduce_async(vin, vout, gpu, op);
        h.synchronize();
        CHECK(herd_test::same_bytes(out.read<T>(n).data(), values.data(), n * sizeof(T)));
        HERD_CUDA_CHECK(cudaMemset(out.data, 0xa5, n * sizeof(T)));
        herd::reduce_scatter(vin, vout, gpu, op);
        CHECK(herd_test::same_bytes(out.read<T>(n).data(), values.data(), n * sizeof(T)));
        ++checked;
      });
    }
  }
  CHECK(checked >= 30);
  const std::vector<double> values = {1.5, -2.0, 3.25};
  const device_bytes in(values.data(), 3 * sizeof(double));
  device_bytes out(nullptr, 3 * sizeof(double));
  herd::buffer_view gathered{out.data, 3, herd::dtype::f64, herd::device::cuda(device)};
  herd::allgather(herd::const_buffer_view(in.data, 3, herd::dtype::f64, herd::device::cuda(device)), gathered, gpu);
  CHECK(out.read<double>(3) == values);
}

// An asynchronous operation's handle holds what its wait needs: it can be waited for after its
// communicator was moved (the operation is the moved-to communicator's) or destroyed (whose NCCL
// communicator lives on until the handle is done).
HERD_MPI_TEST_CASE("nccl_communicator: a handle waits after its communicator was moved or destroyed", 1) {
  herd::mpi_communicator world;
  const int device = device_of_rank();
  HERD_CUDA_CHECK(cudaSetDevice(device));
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  const std::size_t n = 1 << 22;
  std::vector<float> ones(n, 1.0f);
  device_bytes in(ones.data(), n * sizeof(float));
  device_bytes first(nullptr, n * sizeof(float)), second(nullptr, n * sizeof(float));
  const herd::const_buffer_view vin(in.data, n, herd::dtype::f32, herd::device::cuda(device));
  herd::buffer_view out1{first.data, n, herd::dtype::f32, herd::device::cuda(device)};
  herd::buffer_view out2{second.data, n, herd::dtype::f32, herd::device::cuda(device)};
  herd::handle outlived;
  {
    herd::nccl_communicator gpu(alone, device);
    outlived = herd::allreduce_async(vin, out1, gpu);
  }
  outlived.synchronize();
  herd::nccl_communicator from(alone, device);
  herd::handle followed = herd::allreduce_async(vin, out2, from);
  herd::nccl_communicator to = std::move(from);
  followed.synchronize();
  const auto got1 = first.read<float>(n);
  const auto got2 = second.read<float>(n);
  CHECK(std::count(got1.begin(), got1.end(), 1.0f) == static_cast<std::ptrdiff_t>(n));
  CHECK(std::count(got2.begin(), got2.end(), 1.0f) == static_cast<std::ptrdiff_t>(n));
  CHECK(to.native() != nullptr);
}

// The device converts half and bfloat16 with the hardware; it must give the host's (software)
// bits: every half and bfloat16 pattern to float, and float to both at every rounding case.
__global__ void convert_on_device(const std::uint16_t* patterns, float* from_half, float* from_bfloat16,
                                  const float* floats, std::uint16_t* to_half, std::uint16_t* to_bfloat16, std::size_t n,
                                  std::size_t m) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n || i < m;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    if (i < n) {
      from_half[i] = static_cast<float>(herd::half::from_bits(patterns[i]));
      from_bfloat16[i] = static_cast<float>(herd::bfloat16::from_bits(patterns[i]));
    }
    if (i < m) {
      to_half[i] = herd::half(floats[i]).bits;
      to_bfloat16[i] = herd::bfloat16(floats[i]).bits;
    }
  }
}

HERD_MPI_TEST_CASE("half and bfloat16: the device's hardware conversions give the host's bits", 1) {
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  std::vector<std::uint16_t> patterns(65536);
  std::vector<float> floats;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    patterns[b] = static_cast<std::uint16_t>(b);
    for (float v : {static_cast<float>(herd::half::from_bits(patterns[b])), static_cast<float>(herd::bfloat16::from_bits(patterns[b]))}) {
      std::uint32_t u;
      std::memcpy(&u, &v, 4);
      for (std::uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) {  // the value, ties and around
        const std::uint32_t w = u + d;
        float f;
        std::memcpy(&f, &w, 4);
        floats.push_back(f);
      }
    }
  }
  const std::size_t n = patterns.size(), m = floats.size();
  device_bytes d_patterns(patterns.data(), n * 2), d_floats(floats.data(), m * 4);
  device_bytes d_from_half(nullptr, n * 4), d_from_bf(nullptr, n * 4), d_to_half(nullptr, m * 2), d_to_bf(nullptr, m * 2);
  convert_on_device<<<256, 256>>>(reinterpret_cast<const std::uint16_t*>(d_patterns.data),
                                  reinterpret_cast<float*>(d_from_half.data), reinterpret_cast<float*>(d_from_bf.data),
                                  reinterpret_cast<const float*>(d_floats.data), reinterpret_cast<std::uint16_t*>(d_to_half.data),
                                  reinterpret_cast<std::uint16_t*>(d_to_bf.data), n, m);
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto from_half = d_from_half.read<std::uint32_t>(n), from_bf = d_from_bf.read<std::uint32_t>(n);
  const auto to_half = d_to_half.read<std::uint16_t>(m), to_bf = d_to_bf.read<std::uint16_t>(m);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float h = herd::detail::half_bits_to_float(patterns[i]), b = herd::detail::bfloat16_bits_to_float(patterns[i]);
    std::uint32_t hu, bu;
    std::memcpy(&hu, &h, 4);
    std::memcpy(&bu, &b, 4);
    differ += (from_half[i] != hu) + (from_bf[i] != bu);
  }
  for (std::size_t i = 0; i < m; ++i) {
    differ += (to_half[i] != herd::detail::float_to_half_bits(floats[i])) +
              (to_bf[i] != herd::detail::float_to_bfloat16_bits(floats[i]));
  }
  INFO(m, " floats converted");
  CHECK(differ == 0);
}

HERD_MPI_TEST_CASE("herd waits for the caller's stream: a producer on a non-blocking stream is read after it writes", 1) {
  herd::mpi_communicator world;
  const int device = device_of_rank();
  HERD_CUDA_CHECK(cudaSetDevice(device));
  herd::mpi_communicator alone = world.split(world.rank(), 0);
  herd::nccl_communicator gpu(alone, device);
  cudaStream_t producer = nullptr;
  HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  const std::size_t n = 1 << 20;
  device_bytes in(nullptr, n * sizeof(float));
  device_bytes out(nullptr, n * sizeof(float));
  const float want = 2.0f * static_cast<float>(world.size());
  {
    const herd::cuda::use_stream on(producer);
    HERD_CUDA_CHECK(cudaMemsetAsync(in.data, 0, n * sizeof(float), producer));
    fill_late<<<64, 256, 0, producer>>>(reinterpret_cast<float*>(in.data), n, 1.0f, 200'000'000LL);  // ~0.1 s
    herd::buffer_view result{out.data, n, herd::dtype::f32, herd::device::cuda(device)};
    herd::allreduce(herd::const_buffer_view(in.data, n, herd::dtype::f32, herd::device::cuda(device)), result, gpu);
    // The staged path over MPI, every process of the world (in place: from 2 processes on, a
    // stale read of the 1s gives the world size instead of twice it).
    fill_late<<<64, 256, 0, producer>>>(reinterpret_cast<float*>(in.data), n, 2.0f, 200'000'000LL);
    herd::buffer_view v{in.data, n, herd::dtype::f32, herd::device::cuda(device)};
    herd::allreduce(v, world);
  }
  HERD_CUDA_CHECK(cudaStreamSynchronize(producer));
  const auto through_nccl = out.read<float>(n);
  const auto staged = in.read<float>(n);
  CHECK(std::count(through_nccl.begin(), through_nccl.end(), 1.0f) == static_cast<std::ptrdiff_t>(n));
  CHECK(std::count(staged.begin(), staged.end(), want) == static_cast<std::ptrdiff_t>(n));
  HERD_CUDA_CHECK(cudaStreamDestroy(producer));
}

// The optimizer's packing stream waits for the caller's: here the default stream, on which a
// slow producer writes the gradients (an mpi_communicator has no stream of its own to follow).
HERD_MPI_TEST_CASE("distributed optimizer packs device gradients after their producer on the default stream", 1) {
  herd::mpi_communicator comm;
  const int device = device_of_rank();
  HERD_CUDA_CHECK(cudaSetDevice(device));
  const std::size_t n = 1 << 18;
  device_bytes a(nullptr, n * sizeof(float));
  device_bytes b(nullptr, 5 * sizeof(float));
  const std::vector<herd::buffer_view> grads = {{a.data, n, herd::dtype::f32, herd::device::cuda(device)},
                                                {b.data, 5, herd::dtype::f32, herd::device::cuda(device)}};
  struct counting {
    int steps = 0;
    void step() { ++steps; }
  } inner;
  herd::distributed_optimizer opt(inner, grads, comm, {.op = herd::reduce_op::sum});  // one bucket: packed
  for (int round = 0; round < 2; ++round) {
    const float mine = static_cast<float>(comm.rank() + 1 + round);
    HERD_CUDA_CHECK(cudaMemset(a.data, 0, n * sizeof(float)));
    HERD_CUDA_CHECK(cudaMemset(b.data, 0, 5 * sizeof(float)));
    fill_late<<<64, 256>>>(reinterpret_cast<float*>(a.data), n, mine, 200'000'000LL);  // ~0.1 s, default stream
    fill_late<<<1, 32>>>(reinterpret_cast<float*>(b.data), 5, mine, 200'000'000LL);
    HERD_CUDA_CHECK(cudaGetLastError());
    opt.step();
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    const int p = comm.size();
    const auto want = static_cast<float>(p * (p + 1) / 2 + p * round);
    const auto got_a = a.read<float>(n);
    const auto got_b = b.read<float>(5);
    INFO("round ", round);
    CHECK(std::count(got_a.begin(), got_a.end(), want) == static_cast<std::ptrdiff_t>(n));
    CHECK(std::count(got_b.begin(), got_b.end(), want) == 5);
  }
  CHECK(inner.steps == 2);
}

HERD_MPI_TEST_CASE("staged collectives over MPI: processes sharing a GPU reduce, scatter, gather and broadcast", 1) {
  herd::comm_options small;
  small.ring_segment_bytes = 4096;  // many segments through the window of slots
  herd::mpi_communicator comm(MPI_COMM_WORLD, small);
  const int device = device_of_rank();
  HERD_CUDA_CHECK(cudaSetDevice(device));
  const auto p = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  for (auto type : {herd::dtype::f16, herd::dtype::bf16, herd::dtype::f32, herd::dtype::i32}) {
    for (auto op : {herd::reduce_op::sum, herd::reduce_op::avg, herd::reduce_op::min}) {
      herd::visit(type, [&](auto element) {
        using T = decltype(element);
        const std::size_t per_rank = 3001;
        rng g(11 * per_rank + static_cast<std::uint64_t>(op) * 7 + static_cast<std::uint64_t>(type));
        std::vector<std::vector<T>> inputs;
        for (std::size_t q = 0; q < p; ++q) inputs.push_back(herd_test::draw_vector<T>(g, per_rank * p, values::exact, op));
        const auto full = herd_test::reference_reduce(inputs, op);
        const device_bytes in(inputs[r].data(), per_rank * p * sizeof(T));
        device_bytes out(nullptr, per_rank * p * sizeof(T));
        const herd::device gpu = herd::device::cuda(device);
        herd::buffer_view all{out.data, per_rank * p, type, gpu};
        herd::allreduce(herd::const_buffer_view(in.data, per_rank * p, type, gpu), all, comm, op);
        INFO(herd::name(type), " ", herd::name(op), " ranks ", p);
        CHECK(herd_test::compare(out.read<T>(per_rank * p), full, inputs, op, values::exact) == "");
        device_bytes mine(nullptr, per_rank * sizeof(T));
        herd::buffer_view part{mine.data, per_rank, type, gpu};
        herd::reduce_scatter(herd::const_buffer_view(in.data, per_rank * p, type, gpu), part, comm, op);
        std::vector<std::vector<T>> parts;
        for (const auto& x : inputs) parts.emplace_back(x.begin() + static_cast<std::ptrdiff_t>(r * per_rank),
                                                        x.begin() + static_cast<std::ptrdiff_t>((r + 1) * per_rank));
        const std::vector<T> my_want(full.begin() + static_cast<std::ptrdiff_t>(r * per_rank),
                                     full.begin() + static_cast<std::ptrdiff_t>((r + 1) * per_rank));
        CHECK(herd_test::compare(mine.read<T>(per_rank), my_want, parts, op, values::exact) == "");
      });
    }
  }
  // allgatherv with a different count per rank (rank 0 none), and a broadcast from the last rank.
  std::vector<std::size_t> counts;
  std::size_t total = 0;
  for (std::size_t q = 0; q < p; ++q) total += counts.emplace_back(q * 5003);
  std::vector<std::int64_t> whole(total);
  for (std::size_t i = 0; i < total; ++i) whole[i] = static_cast<std::int64_t>(i * 2654435761u);
  std::size_t before = 0;
  for (std::size_t q = 0; q < r; ++q) before += counts[q];
  const device_bytes mine(whole.data() + before, counts[r] * 8);
  device_bytes all(nullptr, total * 8);
  herd::buffer_view everything{all.data, total, herd::dtype::i64, herd::device::cuda(device)};
  herd::allgatherv(herd::const_buffer_view(mine.data, counts[r], herd::dtype::i64, herd::device::cuda(device)), everything,
                   counts, comm);
  CHECK(all.read<std::int64_t>(total) == whole);
  std::vector<std::int64_t> message(70001);
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::int64_t>(i) * 31 - 7;
  device_bytes b(r == p - 1 ? message.data() : nullptr, message.size() * 8);
  herd::buffer_view bv{b.data, message.size(), herd::dtype::i64, herd::device::cuda(device)};
  herd::broadcast(bv, comm, static_cast<int>(p - 1));
  CHECK(b.read<std::int64_t>(message.size()) == message);
}

HERD_MPI_TEST_CASE("staged ring over MPI: processes sharing a GPU allreduce device tensors", 1) {
  herd::mpi_communicator comm;
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  for (auto type : {herd::dtype::f32, herd::dtype::f16, herd::dtype::i64}) {
    for (auto op : {herd::reduce_op::sum, herd::reduce_op::avg, herd::reduce_op::max}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{3} << 20}) {
        herd::visit(type, [&](auto element) {
          using T = decltype(element);
          rng g(7 * n + static_cast<std::uint64_t>(op));
          std::vector<std::vector<T>> inputs;
          for (int r = 0; r < comm.size(); ++r) inputs.push_back(herd_test::draw_vector<T>(g, n, values::exact, op));
          device_bytes data(inputs[static_cast<std::size_t>(comm.rank())].data(), n * sizeof(T));
          herd::buffer_view v{data.data, n, type, herd::device::cuda(device_of_rank())};
          herd::allreduce(v, comm, op);
          const auto got = data.read<T>(n);
          const std::string diff = herd_test::compare(got, herd_test::reference_reduce(inputs, op), inputs, op, values::exact);
          INFO(herd::name(type), " ", herd::name(op), " n=", n);
          CHECK_MESSAGE(diff.empty(), diff);
        });
      }
    }
  }
  thrust::device_vector<float> mine(5, static_cast<float>(comm.rank()));
  thrust::device_vector<float> all(5 * static_cast<std::size_t>(comm.size()));
  herd::allgather(mine, all, comm);
  CHECK(all.back() == static_cast<float>(comm.size() - 1));
}

HERD_MPI_TEST_CASE("distributed optimizer on device gradients equals one rank with the combined batch", 1) {
  herd::mpi_communicator comm;
  const int device = device_of_rank();
  HERD_CUDA_CHECK(cudaSetDevice(device));
  for (auto compression : {herd::compression::none, herd::compression::fp16}) {
    for (int passes : {1, 2}) {
      const std::size_t batch = 8;
      const auto world = static_cast<std::size_t>(comm.size());
      const herd_test::regression_data data(batch * world * static_cast<std::size_t>(passes) * 4, 7, 3, 5);
      herd_test::tiny_mlp model(7, 12, 3, 5), alone(7, 12, 3, 5);
      // The gradients live on the GPU; the (host) SGD reads them back before each step.
      std::deque<device_bytes> device_grads;
      std::vector<herd::buffer_view> views;
      for (const auto& g : model.grads()) {
        device_grads.emplace_back(nullptr, g.bytes());
        views.push_back({device_grads.back().data, g.count, g.type, herd::device::cuda(device)});
      }
      herd::sgd host_sgd(model.params(), model.grads(), {.lr = 0.05, .momentum = 0.9});
      struct from_device {
        herd::sgd& sgd;
        std::vector<herd::buffer_view> device, host;
        void step() {
          for (std::size_t i = 0; i < device.size(); ++i)
            HERD_CUDA_CHECK(cudaMemcpy(host[i].data, device[i].data, host[i].bytes(), cudaMemcpyDeviceToHost));
          sgd.step();
        }
      } inner{host_sgd, views, model.grads()};
      herd::sgd reference(alone.params(), alone.grads(), {.lr = 0.05, .momentum = 0.9});
      herd::distributed_optimizer opt(inner, views, comm,
                                      {.backward_passes_per_step = passes,
                                       .accumulate = herd::accumulation::by_copy,
                                       .fusion_threshold_bytes = 512,
                                       .compression = compression});
      std::size_t at = 0;
      for (int s = 0; s < 4; ++s) {
        for (int k = 0; k < passes; ++k) {
          const std::size_t mine = at + static_cast<std::size_t>(comm.rank()) * batch;
          model.forward_backward(data, mine, mine + batch);
          for (auto g : model.grads()) {  // the loss divided by the passes: their sum is the mean
            for (std::size_t i = 0; i < g.count; ++i) static_cast<float*>(g.data)[i] /= static_cast<float>(passes);
          }
          const auto host_grads = model.grads();
          for (std::size_t i = 0; i < views.size(); ++i)
            HERD_CUDA_CHECK(cudaMemcpy(views[i].data, host_grads[i].data, views[i].bytes(), cudaMemcpyHostToDevice));
          opt.step();
          at += world * batch;
        }
        const std::size_t round = world * batch * static_cast<std::size_t>(passes);
        alone.forward_backward(data, at - round, at);
        reference.step();
      }
      const double difference = herd_test::relative_difference(model, alone);
      INFO("compression ", herd::name(compression), " passes ", passes, " difference ", difference);
      CHECK(difference <= (compression == herd::compression::none ? 1e-5 : 2e-3));
    }
  }
}

// docs/gpus.md's first block, as the page shows it (the build copies it into docs_gpus.inc), at one
// process per GPU: a CUDA tensor averaged over NCCL and an optimizer's gradients fused on the GPU.
// NCCL refuses two ranks on one GPU, so the case checks nothing where a node has more ranks.
HERD_MPI_TEST_CASE("docs/gpus.md: its block averages a CUDA tensor and an optimizer's gradients over NCCL", 1) {
  int devices = 0;
  HERD_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (herd::mpi::local_size() > devices) {
    MESSAGE("skipped: ", herd::mpi::local_size(), " ranks on this node and ", devices, " GPU(s)");
    return;
  }
  HERD_CUDA_CHECK(cudaSetDevice(herd::mpi::local_rank()));
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  thrust::device_vector<float> grad(1000, static_cast<float>(rank + 1));
  thrust::device_vector<float> grad_w(300, static_cast<float>(rank + 1)), grad_b(7, static_cast<float>(2 * (rank + 1)));
  struct {
    int steps = 0;
    void step() { ++steps; }
  } sgd;

#include "docs_gpus.inc"

  opt.step();
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  const float mean = static_cast<float>(size + 1) / 2.0f;
  CHECK(grad[0] == mean);
  CHECK(grad[999] == mean);
  CHECK(grad_w[299] == mean);
  CHECK(grad_b[6] == 2 * mean);
  CHECK(sgd.steps == 1);
}
