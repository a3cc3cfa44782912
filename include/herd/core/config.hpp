#pragma once
// Version, host/device annotations and the configuration namespace.

#define HERD_VERSION_MAJOR 0
#define HERD_VERSION_MINOR 1
#define HERD_VERSION_PATCH 0

// Functions the CUDA kernels share with the host code (per-element reductions, half casts) carry
// HERD_HOST_DEVICE; a host compiler sees plain functions.
#if defined(__CUDACC__)
#define HERD_HOST_DEVICE __host__ __device__
#define HERD_WITH_CUDA_KERNELS 1
#else
#define HERD_HOST_DEVICE
#define HERD_WITH_CUDA_KERNELS 0
#endif

// Code whose behaviour depends on how the translation unit is compiled (collectives and the
// optimizer run herd's kernels on device tensors only under nvcc) lives in an inline namespace
// named after that configuration. A program that mixes nvcc-compiled and host-compiled TUs then
// gets two distinct sets of symbols instead of one silently chosen by the linker. Types shared by
// every TU (dtype, device, error, communicators) stay outside it so they pass freely between TUs.
#if defined(__CUDACC__)
#define HERD_CONFIG_NS cuda
#else
#define HERD_CONFIG_NS host
#endif
#define HERD_CONFIG_NAMESPACE_BEGIN inline namespace HERD_CONFIG_NS {
#define HERD_CONFIG_NAMESPACE_END }
