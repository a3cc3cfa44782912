#ifndef HERD_OPTIM_DETAIL_UNSCALE_HPP
#define HERD_OPTIM_DETAIL_UNSCALE_HPP
// What a step does with gradients that a loss scaler scaled (optim/loss_scaler.hpp): divide them
// by the scale and look for the inf or NaN an overflow left. mixed_precision does it on whole
// gradients, zero_optimizer on its shard of them.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cmath>
#include <cstddef>
#include <type_traits>

namespace herd::detail {

// Whether a host tensor of floats holds an inf or a NaN.
HERD_SEPARATE bool has_inf_or_nan(const const_buffer_view& v);

// out = in * inverse_scale, cast to out's type (out may be in); then, if `check`, whether out
// holds an inf or NaN. A caller that already found an overflow, or learns of one otherwise (from
// a norm), passes check = false and saves the pass over the values.
inline bool unscale(const buffer_view& out, const const_buffer_view& in, double inverse_scale, bool check) {
  host_cast(out.data, out.type, in.data, in.type, out.count, inverse_scale);
  return check && has_inf_or_nan(out);
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE bool has_inf_or_nan(const const_buffer_view& v) {
  bool found = false;
  visit(v.type, [&](auto element) {
    using T = decltype(element);
    if constexpr (!std::is_integral_v<T>) {
      const auto* p = static_cast<const T*>(v.data);
      for (std::size_t i = 0; i < v.count && !found; ++i) found = !std::isfinite(to_double(p[i]));
    }
  });
  return found;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_UNSCALE_HPP
