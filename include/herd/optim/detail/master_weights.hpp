#ifndef HERD_OPTIM_DETAIL_MASTER_WEIGHTS_HPP
#define HERD_OPTIM_DETAIL_MASTER_WEIGHTS_HPP
// f32 master weights of f16/bf16 parameters, as apex and DeepSpeed keep them: the optimizer steps
// the masters, and the parameters hold the masters rounded. mixed_precision keeps masters of whole
// parameters, zero_optimizer of its rank's shard of them; both read, write and refresh them here.

#include <herd/core/config.hpp>
#include <herd/core/detail/f16c.hpp>
#include <herd/core/dtype.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include <cstddef>
#include <cstring>

namespace herd::detail {

// Whether parameters of dtype t get f32 masters: the 16-bit floats (f32 and f64 are their own).
constexpr bool has_master_weights(dtype t) noexcept { return t == dtype::f16 || t == dtype::bf16; }

// master[j] = the parameter's element j, exactly (every f16 and bf16 value is an f32 value).
inline void read_masters(float* master, const void* param, dtype type, std::size_t n) {
  host_cast(master, dtype::f32, param, type, n);
}

// The parameter's element j = master[j], rounded to the nearest value of its dtype.
inline void write_masters(void* param, dtype type, const float* master, std::size_t n) {
  host_cast(param, type, master, dtype::f32, n);
}

// A master belongs to its parameter while the parameter holds the master rounded. Where a
// parameter element no longer does (broadcast_parameters after the optimizer was built, or
// parameters loaded without their masters), its master is read again from it; masters restored
// with their parameters round to them and keep their extra bits. Compared bit for bit, so that
// -0 and NaN payloads count as changes too.
HERD_SEPARATE void refresh_masters(float* master, const void* param, dtype type, std::size_t n);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void refresh_masters(float* master, const void* param, dtype type, std::size_t n) {
  visit(type, [&](auto element) {
    using T = decltype(element);
    if constexpr (is_16bit_float<T>) {
      const auto* p = static_cast<const T*>(param);
      std::size_t j = 0;  // f16 on a CPU with F16C: the blocks that need nothing (core/detail/f16c.hpp)
      if constexpr (std::is_same_v<T, half>) j = f16c_unchanged(master, p, n);
      for (; j < n; ++j) {
        const T rounded(master[j]);
        if (std::memcmp(&rounded, &p[j], sizeof(T)) != 0) master[j] = static_cast<float>(p[j]);
      }
    }
  });
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_MASTER_WEIGHTS_HPP
