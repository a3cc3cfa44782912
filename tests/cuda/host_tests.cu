// cuda_host_tests as one translation unit: nvcc compiles herd's kernels for every file that
// includes herd.hpp, so the four files below cost one such compilation instead of four.
#include "kernel_bodies.cu"
#include "staged_ring.cu"
#include "device_kind_mismatch.cu"
#include "native_optimizer.cu"
