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
// Under nvcc the name also carries the GPU architectures the TU is compiled for
// (__CUDA_ARCH_LIST__, e.g. 800,900 -> cuda_800_900), so that kernels built for different GPUs
// in different TUs never merge either.
#define HERD_PP_CAT_(a, b) a##b
#define HERD_PP_CAT(a, b) HERD_PP_CAT_(a, b)
#define HERD_PP_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, n, ...) n
#define HERD_PP_COUNT(...) HERD_PP_COUNT_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define HERD_PP_ARCHS_1(a) cuda_##a
#define HERD_PP_ARCHS_2(a, b) cuda_##a##_##b
#define HERD_PP_ARCHS_3(a, b, c) cuda_##a##_##b##_##c
#define HERD_PP_ARCHS_4(a, b, c, d) cuda_##a##_##b##_##c##_##d
#define HERD_PP_ARCHS_5(a, b, c, d, e) cuda_##a##_##b##_##c##_##d##_##e
#define HERD_PP_ARCHS_6(a, b, c, d, e, f) cuda_##a##_##b##_##c##_##d##_##e##_##f
#define HERD_PP_ARCHS_7(a, b, c, d, e, f, g) cuda_##a##_##b##_##c##_##d##_##e##_##f##_##g
#define HERD_PP_ARCHS_8(a, b, c, d, e, f, g, h) cuda_##a##_##b##_##c##_##d##_##e##_##f##_##g##_##h
#define HERD_PP_ARCHS_(...) HERD_PP_CAT(HERD_PP_ARCHS_, HERD_PP_COUNT(__VA_ARGS__))(__VA_ARGS__)
#define HERD_PP_ARCHS(...) HERD_PP_ARCHS_(__VA_ARGS__)

#if defined(__CUDACC__) && defined(__CUDA_ARCH_LIST__)
#define HERD_CONFIG_NS_BASE HERD_PP_ARCHS(__CUDA_ARCH_LIST__)
#elif defined(__CUDACC__)
#define HERD_CONFIG_NS_BASE cuda
#else
#define HERD_CONFIG_NS_BASE host
#endif
// HERD_WITH_NCCL (set by the herd::nccl target) gives host-compiled files GPU paths too, so it
// names a configuration of its own: host_nccl, cuda_900_nccl.
#if defined(HERD_WITH_NCCL)
#define HERD_CONFIG_NS HERD_PP_CAT(HERD_CONFIG_NS_BASE, _nccl)
#else
#define HERD_CONFIG_NS HERD_CONFIG_NS_BASE
#endif
#define HERD_CONFIG_NAMESPACE_BEGIN inline namespace HERD_CONFIG_NS {
#define HERD_CONFIG_NAMESPACE_END }

#define HERD_PP_STRING_(x) #x
#define HERD_PP_STRING(x) HERD_PP_STRING_(x)

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN
// The configuration this translation unit was compiled in: "host", or "cuda_" and the GPU
// architectures (e.g. "cuda_800_900"), with "_nccl" when HERD_WITH_NCCL is defined.
inline const char* configuration() noexcept { return HERD_PP_STRING(HERD_CONFIG_NS); }
HERD_CONFIG_NAMESPACE_END
}  // namespace herd
