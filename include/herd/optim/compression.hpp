#ifndef HERD_OPTIM_COMPRESSION_HPP
#define HERD_OPTIM_COMPRESSION_HPP
// Gradient compression for the distributed optimizer: f32 and f64 gradients cross the wire as
// f16 or bf16 and are cast back on arrival, halving (or quartering) the bytes sent. Other dtypes
// travel as they are.

#include <herd/core/dtype.hpp>

#include <cstdint>
#include <string_view>

namespace herd {

enum class compression : std::uint8_t { none, fp16, bf16 };

constexpr std::string_view name(compression c) noexcept {
  switch (c) {
    case compression::none: return "none";
    case compression::fp16: return "fp16";
    case compression::bf16: return "bf16";
  }
  return "invalid compression";
}

// The dtype a gradient of dtype `t` travels as.
constexpr dtype wire_dtype(compression c, dtype t) noexcept {
  if (c == compression::none || (t != dtype::f32 && t != dtype::f64)) return t;
  return c == compression::fp16 ? dtype::f16 : dtype::bf16;
}

}  // namespace herd

#endif  // HERD_OPTIM_COMPRESSION_HPP
