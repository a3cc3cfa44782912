// Adapting your own GPU tensor type to herd, and averaging it across ranks two ways: with NCCL
// (one GPU per process), and over plain MPI with herd's staged ring and kernels.
//
//   mpiexec -n 2 build/examples/cuda/device_tensor
#include <herd/herd.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

namespace my {
// A minimal device tensor: a float buffer on one GPU.
struct gpu_tensor {
  float* data = nullptr;
  std::size_t count = 0;
  int device = 0;

  gpu_tensor(std::size_t n, int gpu) : count(n), device(gpu) {
    cudaSetDevice(gpu);
    HERD_CUDA_CHECK(cudaMalloc(&data, n * sizeof(float)));
  }
  gpu_tensor(const gpu_tensor&) = delete;
  gpu_tensor& operator=(const gpu_tensor&) = delete;
  ~gpu_tensor() { cudaFree(data); }
};
}  // namespace my

// The one customization point: where the data is, how much, which dtype, which device.
template <> struct herd::tensor_traits<my::gpu_tensor> {
  static void* data(my::gpu_tensor& t) { return t.data; }
  static std::size_t size(const my::gpu_tensor& t) { return t.count; }
  static herd::dtype dtype(const my::gpu_tensor&) { return herd::dtype::f32; }
  static herd::device device(const my::gpu_tensor& t) { return herd::device::cuda(t.device); }
};

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator world;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    if (world.rank() == 0) std::printf("no CUDA device: nothing to do\n");
    return 77;
  }
  const int gpu = herd::mpi::local_rank() % gpus;

  my::gpu_tensor t(1 << 20, gpu);
  const std::vector<float> mine(t.count, static_cast<float>(world.rank()));
  HERD_CUDA_CHECK(cudaMemcpy(t.data, mine.data(), t.count * sizeof(float), cudaMemcpyHostToDevice));

  // Over MPI: herd stages the tensor through pinned host memory and reduces on the GPU.
  herd::allreduce(t, world, herd::reduce_op::avg);
  float first = 0;
  HERD_CUDA_CHECK(cudaMemcpy(&first, t.data, sizeof first, cudaMemcpyDeviceToHost));

  // With NCCL, when every process has a GPU of its own.
  float second = first;
  if (herd::mpi::local_size() <= gpus) {
    herd::nccl_communicator nccl(world, gpu);
    herd::allreduce(t, nccl, herd::reduce_op::sum);
    HERD_CUDA_CHECK(cudaMemcpy(&second, t.data, sizeof second, cudaMemcpyDeviceToHost));
  }
  if (world.rank() == 0) {
    std::printf("average of ranks over MPI: %g; then summed with NCCL: %g\n", static_cast<double>(first),
                static_cast<double>(second));
  }
  return 0;
}
