// The kernels' bodies, compiled by nvcc (as __host__ __device__ functions) and run on the CPU.
#include "../unit/test_kernel_bodies.cpp"
