// Data-parallel training on GPUs: an MLP 784-256-10 on Fashion-MNIST, forward and backward with
// cuBLAS and a few kernels, gradients averaged across processes with NCCL by herd's distributed
// optimizer (fusion buffer packed on the GPU by herd's batched kernel).
//
//   mpiexec -n 2 build/examples/cuda/train_gpu [--epochs 5] [--batch-size 128] [--lr 0.05]
//
// One process per GPU (herd::mpi::local_rank() picks it). With more processes than GPUs on a node
// it averages over MPI instead (herd's staged ring), since NCCL takes one process per GPU.
#include "../fashion_mnist/idx.hpp"

#include <herd/herd.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

#define CUBLAS_CHECK(call)                                                                               \
  do {                                                                                                   \
    if (cublasStatus_t s = (call); s != CUBLAS_STATUS_SUCCESS)                                           \
      throw herd::error(std::string("train_gpu: ") + #call + " failed with cuBLAS status " + std::to_string(s)); \
  } while (0)

constexpr int inputs = 784, hidden = 256, classes = 10;

__global__ void gather(const float* images, const std::uint8_t* labels, const std::size_t* picks, int batch,
                       float* x, int* y) {
  const int j = blockIdx.x;
  const std::size_t sample = picks[j];
  for (int k = threadIdx.x; k < inputs; k += blockDim.x) x[j * inputs + k] = images[sample * inputs + k];
  if (threadIdx.x == 0) y[j] = labels[sample];
}

__global__ void bias_relu(float* z, const float* b, int rows, int cols, bool relu) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = z[i] + b[i % rows];
  z[i] = relu && v < 0 ? 0 : v;
}

// Per column: softmax, cross-entropy, and the gradient (softmax - onehot) / batch.
__global__ void softmax_xent(const float* z, const int* y, int batch, float* dz, float* loss, int* correct) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= batch) return;
  const float* c = z + j * classes;
  int best = 0;
  for (int k = 1; k < classes; ++k) best = c[k] > c[best] ? k : best;
  float sum = 0;
  for (int k = 0; k < classes; ++k) sum += expf(c[k] - c[best]);
  atomicAdd(loss, logf(sum) - (c[y[j]] - c[best]));
  atomicAdd(correct, best == y[j] ? 1 : 0);
  if (dz == nullptr) return;
  for (int k = 0; k < classes; ++k) dz[j * classes + k] = (expf(c[k] - c[best]) / sum - (k == y[j] ? 1.f : 0.f)) / batch;
}

__global__ void row_sums(const float* m, int rows, int cols, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  float s = 0;
  for (int j = 0; j < cols; ++j) s += m[j * rows + i];
  out[i] = s;
}

__global__ void relu_backward(float* dh, const float* h, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && h[i] <= 0) dh[i] = 0;
}

__global__ void sgd_momentum(float* p, const float* g, float* buffer, int n, float lr, float momentum) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  buffer[i] = momentum * buffer[i] + g[i];
  p[i] -= lr * buffer[i];
}

int blocks(int n) { return (n + 255) / 256; }

struct device_floats {
  float* data = nullptr;
  int count = 0;
  explicit device_floats(int n, const std::vector<float>& init = {}) : count(n) {
    HERD_CUDA_CHECK(cudaMalloc(&data, sizeof(float) * static_cast<std::size_t>(n)));
    if (init.empty()) HERD_CUDA_CHECK(cudaMemset(data, 0, sizeof(float) * static_cast<std::size_t>(n)));
    else HERD_CUDA_CHECK(cudaMemcpy(data, init.data(), sizeof(float) * init.size(), cudaMemcpyHostToDevice));
  }
  device_floats(const device_floats&) = delete;
  device_floats& operator=(const device_floats&) = delete;
  ~device_floats() { cudaFree(data); }
  herd::buffer_view view(int device) { return {data, static_cast<std::size_t>(count), herd::dtype::f32, herd::device::cuda(device)}; }
};

std::vector<float> he_init(int fan_in, int n, std::uint64_t seed) {
  herd::random_engine engine(seed);
  std::vector<float> w(static_cast<std::size_t>(n));
  const double scale = std::sqrt(2.0 / fan_in);
  for (auto& v : w) {  // Box-Muller
    const double u1 = (static_cast<double>(engine.next() >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(engine.next() >> 11) * 0x1.0p-53;
    v = static_cast<float>(scale * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return w;
}

// A plain SGD with momentum on the GPU: what herd's distributed optimizer wraps here.
struct gpu_sgd {
  std::vector<device_floats*> params, grads, buffers;
  float lr = 0.05f, momentum = 0.9f;
  void step() {
    for (std::size_t i = 0; i < params.size(); ++i)
      sgd_momentum<<<blocks(params[i]->count), 256>>>(params[i]->data, grads[i]->data, buffers[i]->data, params[i]->count, lr, momentum);
    HERD_CUDA_CHECK(cudaGetLastError());
  }
};

template <class Comm>
int train(Comm& comm, herd::mpi_communicator& world, int device, const std::string& data, int epochs, int batch, float lr) {
  const auto train_set = idx::read_split(data + "/train-images-idx3-ubyte.gz", data + "/train-labels-idx1-ubyte.gz", 28, 28, 10);
  const auto test_set = idx::read_split(data + "/t10k-images-idx3-ubyte.gz", data + "/t10k-labels-idx1-ubyte.gz", 28, 28, 10);
  auto upload = [](const idx::labeled_images& s, float*& images, std::uint8_t*& labels) {
    const std::size_t n = s.labels.size();
    std::vector<float> host(n * inputs);
    for (std::size_t i = 0; i < n; ++i)
      for (int k = 0; k < inputs; ++k) host[i * inputs + static_cast<std::size_t>(k)] = (s.inputs.image(i)[k] / 255.0f - 0.2860f) / 0.3530f;
    HERD_CUDA_CHECK(cudaMalloc(&images, host.size() * sizeof(float)));
    HERD_CUDA_CHECK(cudaMemcpy(images, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMalloc(&labels, n));
    HERD_CUDA_CHECK(cudaMemcpy(labels, s.labels.data(), n, cudaMemcpyHostToDevice));
  };
  float* train_images = nullptr;
  float* test_images = nullptr;
  std::uint8_t* train_labels = nullptr;
  std::uint8_t* test_labels = nullptr;
  upload(train_set, train_images, train_labels);
  upload(test_set, test_images, test_labels);

  device_floats w1(hidden * inputs, he_init(inputs, hidden * inputs, 1)), b1(hidden), w2(classes * hidden, he_init(hidden, classes * hidden, 2)), b2(classes);
  device_floats gw1(w1.count), gb1(b1.count), gw2(w2.count), gb2(b2.count);
  device_floats mw1(w1.count), mb1(b1.count), mw2(w2.count), mb2(b2.count);
  const int most = std::max(batch, 1000);
  device_floats x(inputs * most), z1(hidden * most), z2(classes * most), dz2(classes * most), dh(hidden * most), scalars(2);
  int* y = nullptr;
  std::size_t* picks = nullptr;
  HERD_CUDA_CHECK(cudaMalloc(&y, sizeof(int) * static_cast<std::size_t>(most)));
  HERD_CUDA_CHECK(cudaMalloc(&picks, sizeof(std::size_t) * static_cast<std::size_t>(most)));
  cublasHandle_t blas = nullptr;
  CUBLAS_CHECK(cublasCreate(&blas));

  herd::broadcast_parameters(std::vector<herd::buffer_view>{w1.view(device), b1.view(device), w2.view(device), b2.view(device)}, comm, 0);
  gpu_sgd sgd{{&w1, &b1, &w2, &b2}, {&gw1, &gb1, &gw2, &gb2}, {&mw1, &mb1, &mw2, &mb2}, lr * static_cast<float>(comm.size())};
  herd::distributed_optimizer opt(sgd, std::vector<herd::buffer_view>{gw1.view(device), gb1.view(device), gw2.view(device), gb2.view(device)}, comm);
  herd::distributed_sampler sampler(train_set.labels.size(), world, {.seed = 7});
  const float one = 1, zero = 0;

  // Z1 = W1 X + b1, H = relu(Z1), Z2 = W2 H + b2 (column-major, one sample per column).
  auto forward = [&](int n) {
    CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, hidden, n, inputs, &one, w1.data, hidden, x.data, inputs, &zero, z1.data, hidden));
    bias_relu<<<blocks(hidden * n), 256>>>(z1.data, b1.data, hidden, n, true);
    CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, classes, n, hidden, &one, w2.data, classes, z1.data, hidden, &zero, z2.data, classes));
    bias_relu<<<blocks(classes * n), 256>>>(z2.data, b2.data, classes, n, false);
  };
  double accuracy = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto started = std::chrono::steady_clock::now();
    for (std::span<const std::size_t> b : sampler.batches(static_cast<std::size_t>(batch), true)) {
      const int n = static_cast<int>(b.size());
      HERD_CUDA_CHECK(cudaMemcpy(picks, b.data(), b.size_bytes(), cudaMemcpyHostToDevice));
      gather<<<n, 128>>>(train_images, train_labels, picks, n, x.data, y);
      forward(n);
      HERD_CUDA_CHECK(cudaMemset(scalars.data, 0, 2 * sizeof(float)));
      softmax_xent<<<blocks(n), 256>>>(z2.data, y, n, dz2.data, scalars.data, reinterpret_cast<int*>(scalars.data + 1));
      // dW2 = dZ2 H^T, db2 = rowsum(dZ2), dH = W2^T dZ2 masked by relu, dW1 = dZ1 X^T, db1 = rowsum(dZ1)
      CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, classes, hidden, n, &one, dz2.data, classes, z1.data, hidden, &zero, gw2.data, classes));
      row_sums<<<blocks(classes), 256>>>(dz2.data, classes, n, gb2.data);
      CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, hidden, n, classes, &one, w2.data, classes, dz2.data, classes, &zero, dh.data, hidden));
      relu_backward<<<blocks(hidden * n), 256>>>(dh.data, z1.data, hidden * n);
      CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, hidden, inputs, n, &one, dh.data, hidden, x.data, inputs, &zero, gw1.data, hidden));
      row_sums<<<blocks(hidden), 256>>>(dh.data, hidden, n, gb1.data);
      HERD_CUDA_CHECK(cudaGetLastError());
      opt.step();  // herd averages gw1, gb1, gw2, gb2 across ranks, then gpu_sgd steps
    }
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    // Test accuracy: each rank scores its slice; the counts are summed.
    herd::distributed_sampler shard = herd::distributed_sampler::for_evaluation(test_set.labels.size(), world);
    std::vector<std::int64_t> counts = {0, 0};
    for (std::span<const std::size_t> b : shard.batches(1000)) {
      const int n = static_cast<int>(b.size());
      HERD_CUDA_CHECK(cudaMemcpy(picks, b.data(), b.size_bytes(), cudaMemcpyHostToDevice));
      gather<<<n, 128>>>(test_images, test_labels, picks, n, x.data, y);
      forward(n);
      HERD_CUDA_CHECK(cudaMemset(scalars.data, 0, 2 * sizeof(float)));
      softmax_xent<<<blocks(n), 256>>>(z2.data, y, n, nullptr, scalars.data, reinterpret_cast<int*>(scalars.data + 1));
      int correct = 0;
      HERD_CUDA_CHECK(cudaMemcpy(&correct, scalars.data + 1, sizeof correct, cudaMemcpyDeviceToHost));
      counts[0] += correct;
      counts[1] += n;
    }
    herd::allreduce(counts, world);
    accuracy = static_cast<double>(counts[0]) / static_cast<double>(counts[1]);
    if (world.rank() == 0) std::printf("epoch %d: %.2f s of training, test accuracy %.4f\n", epoch + 1, seconds, accuracy);
  }
  if (world.rank() == 0) std::printf("final test accuracy: %.4f\n", accuracy);
  cublasDestroy(blas);
  cudaFree(train_images), cudaFree(test_images), cudaFree(train_labels), cudaFree(test_labels), cudaFree(y), cudaFree(picks);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator world;
  int epochs = 5, batch = 128;
  float lr = 0.05f;
  std::string data = "/usr/share/datasets/fashion-mnist";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--epochs") epochs = std::atoi(argv[i + 1]);
    else if (flag == "--data") data = argv[i + 1];
    else if (flag == "--batch-size") batch = std::atoi(argv[i + 1]);
    else if (flag == "--lr") lr = static_cast<float>(std::atof(argv[i + 1]));
    else {
      if (world.rank() == 0) std::fprintf(stderr, "usage: mpiexec -n N train_gpu [--epochs N] [--batch-size N] [--lr X] [--data DIR]\n");
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    if (world.rank() == 0) std::printf("no CUDA device: nothing to do\n");
    return 77;
  }
  try {
    const int device = herd::mpi::local_rank() % gpus;
    HERD_CUDA_CHECK(cudaSetDevice(device));
    if (herd::mpi::local_size() <= gpus) {
      herd::nccl_communicator gpu(world, device);
      return train(gpu, world, device, data, epochs, batch, lr);
    }
    return train(world, world, device, data, epochs, batch, lr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpu (rank %d): %s\n", world.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}
