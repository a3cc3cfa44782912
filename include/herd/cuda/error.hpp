#ifndef HERD_CUDA_ERROR_HPP
#define HERD_CUDA_ERROR_HPP
// Every CUDA runtime call herd makes goes through HERD_CUDA_CHECK, which turns a failure into
// herd::error naming the call, CUDA's error name and message, and what to check.
//
// CUDA's runtime headers are included only where CUDA is in use: under nvcc, or where the
// program opted in with HERD_WITH_NCCL (the herd::nccl CMake target defines it). The runtime
// API is plain C, so a g++-compiled training loop can drive NCCL; only herd's kernels need nvcc.

#include <herd/core/error.hpp>

#if defined(__CUDACC__) || defined(HERD_WITH_NCCL)
#include <cuda_runtime_api.h>

#include <string>

namespace herd::cuda {

inline void check(cudaError_t code, const char* call) {
  if (code == cudaSuccess) return;
  int device = -1;
  cudaGetDevice(&device);
  throw error(std::string("herd: ") + call + " failed on cuda:" + std::to_string(device) + ": " +
              cudaGetErrorName(code) + " (" + cudaGetErrorString(code) +
              "). Check that the device exists and is not in use by a crashed process, and that the driver "
              "matches the CUDA toolkit herd was compiled with.");
}

}  // namespace herd::cuda

#define HERD_CUDA_CHECK(call) ::herd::cuda::check((call), #call)

#endif

#endif  // HERD_CUDA_ERROR_HPP
