#ifndef HERD_TENSOR_DLPACK_HPP
#define HERD_TENSOR_DLPACK_HPP
// tensor_traits for DLPack's DLTensor, the exchange format of PyTorch, JAX, CuPy, TVM and others.
//
// The structs are declared here from the public DLPack specification (v0.8 layout, which v1.0
// keeps for DLTensor). If the real <dlpack/dlpack.h> was included first, its declarations are
// used; if it is included later, its include guard (defined below) makes it a no-op, since the
// declarations are the same.
//
// herd takes compact row-major tensors only: strides NULL, or equal to the row-major strides
// (dimensions of size 1 may have any stride). Anything else raises herd::error.

#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

#if !defined(DLPACK_DLPACK_H_)
#define DLPACK_DLPACK_H_
#define DLPACK_VERSION 80
#define DLPACK_ABI_VERSION 1

extern "C" {

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
} DLDataTypeCode;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

}  // extern "C"
#endif

namespace herd {
namespace detail {

HERD_SEPARATE herd::dtype dlpack_dtype(const DLDataType& t);

inline std::size_t dlpack_elements(const DLTensor& t) {
  std::size_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= static_cast<std::size_t>(t.shape[i]);
  return n;
}

HERD_SEPARATE void require_compact(const DLTensor& t);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE herd::dtype dlpack_dtype(const DLDataType& t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case kDLFloat:
        if (t.bits == 16) return dtype::f16;
        if (t.bits == 32) return dtype::f32;
        if (t.bits == 64) return dtype::f64;
        break;
      case kDLBfloat:
        if (t.bits == 16) return dtype::bf16;
        break;
      case kDLInt:
        if (t.bits == 8) return dtype::i8;
        if (t.bits == 32) return dtype::i32;
        if (t.bits == 64) return dtype::i64;
        break;
      case kDLUInt:
        if (t.bits == 8) return dtype::u8;
        break;
      default: break;
    }
  }
  throw error("herd: DLPack dtype (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) +
              ", lanes " + std::to_string(t.lanes) +
              ") has no herd dtype. herd takes float16/32/64, bfloat16, int8/32/64 and uint8 with 1 lane; "
              "convert the tensor first.");
}

HERD_SEPARATE void require_compact(const DLTensor& t) {
  if (t.ndim < 0 || (t.ndim > 0 && t.shape == nullptr)) {
    throw error("herd: DLTensor has ndim " + std::to_string(t.ndim) + " but no shape. Pass a well-formed DLTensor.");
  }
  for (int32_t i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) {
      throw error("herd: DLTensor dimension " + std::to_string(i) + " is negative. Pass a well-formed DLTensor.");
    }
  }
  if (t.strides == nullptr) return;
  // A tensor without elements has no layout to get wrong (PyTorch gives empty tensors strides
  // computed from max(size, 1)).
  for (int32_t i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return;
  int64_t expected = 1;
  for (int32_t i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expected) {
      throw error("herd: DLTensor is not compact: dimension " + std::to_string(i) + " has stride " +
                  std::to_string(t.strides[i]) + " where a row-major layout has " + std::to_string(expected) +
                  ". Make it contiguous first (e.g. tensor.contiguous() in PyTorch).");
    }
    expected *= t.shape[i];
  }
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail

template <> struct tensor_traits<DLTensor> {
  static void* data(DLTensor& t) {
    detail::require_compact(t);
    if (t.data == nullptr) return nullptr;
    return static_cast<char*>(t.data) + t.byte_offset;
  }
  static std::size_t size(const DLTensor& t) { return detail::dlpack_elements(t); }
  static herd::dtype dtype(const DLTensor& t) { return detail::dlpack_dtype(t.dtype); }
  static herd::device device(const DLTensor& t) {
    switch (t.device.device_type) {
      case kDLCPU:
      case kDLCUDAHost:  // pinned host memory: the CPU reads it directly
        return herd::device::cpu();
      case kDLCUDA:
      case kDLCUDAManaged:
        return herd::device::cuda(t.device.device_id);
      default:
        throw error("herd: DLTensor device type " + std::to_string(static_cast<int>(t.device.device_type)) +
                    " is not supported. herd takes kDLCPU, kDLCUDAHost, kDLCUDA and kDLCUDAManaged.");
    }
  }
};

}  // namespace herd

#endif  // HERD_TENSOR_DLPACK_HPP
