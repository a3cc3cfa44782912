#ifndef HERD_CORE_CONFIG_HPP
#define HERD_CORE_CONFIG_HPP
// Version, host/device annotations and the configuration namespace.

// herd is written in C++20 (concepts, designated initializers, std::span). Say so before a
// compiler in an older mode (nvcc's default is C++17) reports the first construct it cannot parse.
#if (defined(_MSVC_LANG) ? _MSVC_LANG : __cplusplus) < 202002L
#error "herd needs C++20: compile with -std=c++20 (g++, clang++, mpicxx and nvcc alike), or link the CMake target herd::herd, which asks for it"
#endif

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

// Separate compilation, opt-in (collectives/separate_compilation.hpp): a non-template function
// declared HERD_SEPARATE is defined where HERD_SEPARATE_DEFINITIONS is set: inline in every file
// without HERD_SEPARATE_COMPILATION; with it, only in the program's implementation file
// (HERD_IMPLEMENTATION), so that the other files neither parse nor compile its body. There it is a
// weak symbol: such functions do not depend on the build's configuration, and a program may have
// an nvcc and a g++ implementation file, each defining them. Without MPI the option does nothing.
// nvcc's device pass (__CUDA_ARCH__ set) compiles only device code, so there such a function is a
// declaration in every mode: the bodies, all host code (creating communicators, the failure
// protocol, the timeline's writer, files), go to the host pass alone (the device pass of a file
// that includes herd: 4.6 -> 3.2 s, medians on the 2-core machine; benchmarks/RESULTS.md).
#if defined(__CUDA_ARCH__)
#define HERD_SEPARATE
#elif defined(HERD_NO_MPI) || !(defined(HERD_SEPARATE_COMPILATION) || defined(HERD_IMPLEMENTATION))
#define HERD_SEPARATE inline
#define HERD_SEPARATE_DEFINITIONS 1
#elif defined(HERD_IMPLEMENTATION)
#define HERD_SEPARATE __attribute__((weak))
#define HERD_SEPARATE_DEFINITIONS 1
#else
#define HERD_SEPARATE
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
// The list is joined with underscores one element at a time (800 ## _900 is the pp-number
// 800_900), for lists of up to 32 architectures (nvcc -arch=all names 12 in CUDA 13); a longer
// list names a macro that does not exist, and the compiler says so.
#define HERD_PP_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30, _31, _32, n, ...) n
#define HERD_PP_COUNT(...) HERD_PP_COUNT_(__VA_ARGS__, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define HERD_PP_JOIN_1(a) a
#define HERD_PP_JOIN_2(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_1(__VA_ARGS__)))
#define HERD_PP_JOIN_3(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_2(__VA_ARGS__)))
#define HERD_PP_JOIN_4(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_3(__VA_ARGS__)))
#define HERD_PP_JOIN_5(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_4(__VA_ARGS__)))
#define HERD_PP_JOIN_6(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_5(__VA_ARGS__)))
#define HERD_PP_JOIN_7(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_6(__VA_ARGS__)))
#define HERD_PP_JOIN_8(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_7(__VA_ARGS__)))
#define HERD_PP_JOIN_9(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_8(__VA_ARGS__)))
#define HERD_PP_JOIN_10(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_9(__VA_ARGS__)))
#define HERD_PP_JOIN_11(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_10(__VA_ARGS__)))
#define HERD_PP_JOIN_12(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_11(__VA_ARGS__)))
#define HERD_PP_JOIN_13(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_12(__VA_ARGS__)))
#define HERD_PP_JOIN_14(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_13(__VA_ARGS__)))
#define HERD_PP_JOIN_15(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_14(__VA_ARGS__)))
#define HERD_PP_JOIN_16(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_15(__VA_ARGS__)))
#define HERD_PP_JOIN_17(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_16(__VA_ARGS__)))
#define HERD_PP_JOIN_18(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_17(__VA_ARGS__)))
#define HERD_PP_JOIN_19(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_18(__VA_ARGS__)))
#define HERD_PP_JOIN_20(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_19(__VA_ARGS__)))
#define HERD_PP_JOIN_21(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_20(__VA_ARGS__)))
#define HERD_PP_JOIN_22(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_21(__VA_ARGS__)))
#define HERD_PP_JOIN_23(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_22(__VA_ARGS__)))
#define HERD_PP_JOIN_24(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_23(__VA_ARGS__)))
#define HERD_PP_JOIN_25(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_24(__VA_ARGS__)))
#define HERD_PP_JOIN_26(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_25(__VA_ARGS__)))
#define HERD_PP_JOIN_27(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_26(__VA_ARGS__)))
#define HERD_PP_JOIN_28(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_27(__VA_ARGS__)))
#define HERD_PP_JOIN_29(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_28(__VA_ARGS__)))
#define HERD_PP_JOIN_30(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_29(__VA_ARGS__)))
#define HERD_PP_JOIN_31(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_30(__VA_ARGS__)))
#define HERD_PP_JOIN_32(a, ...) HERD_PP_CAT(a, HERD_PP_CAT(_, HERD_PP_JOIN_31(__VA_ARGS__)))
#define HERD_PP_ARCHS_(...) HERD_PP_CAT(cuda_, HERD_PP_CAT(HERD_PP_JOIN_, HERD_PP_COUNT(__VA_ARGS__))(__VA_ARGS__))
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

#endif  // HERD_CORE_CONFIG_HPP
