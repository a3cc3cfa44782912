// The GPU suite: herd's kernels against the host reference on a real device, the NCCL
// communicator, the staged ring with several processes sharing one GPU, and the distributed
// optimizer on device gradients. Run by tools/gpu-check.sh; skipped where there is no GPU.

#include <herd/herd.hpp>
#include <herd/cuda/kernels.hpp>
#include <herd/tensor/thrust.hpp>

#include "../support/mpi_test.hpp"
#include "../support/reference.hpp"
#include "../support/tiny_mlp.hpp"

#include <cuda_runtime.h>

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

HERD_MPI_TEST_CASE("the cast kernel and the batched copy equal the host casts", 1) {
  HERD_CUDA_CHECK(cudaSetDevice(device_of_rank()));
  rng g(102);
  const std::size_t n = 100003;
  std::vector<float> values(n);
  for (auto& v : values) v = static_cast<float>(g.between(-4000, 4000)) / 16;
  device_bytes in(values.data(), n * 4, 4);
  device_bytes half_out(nullptr, n * 2, 2);
  herd::cuda::cast(half_out.data, herd::dtype::f16, in.data, herd::dtype::f32, n, 0.5, nullptr);
  HERD_CUDA_CHECK(cudaDeviceSynchronize());
  const auto halves = half_out.read<herd::half>(n);
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) same = same && static_cast<float>(halves[i]) == values[i] * 0.5f;
  CHECK(same);

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
                                      {.backward_passes_per_step = passes, .fusion_threshold_bytes = 512, .compression = compression});
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
