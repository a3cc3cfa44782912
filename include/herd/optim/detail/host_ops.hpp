#ifndef HERD_OPTIM_DETAIL_HOST_OPS_HPP
#define HERD_OPTIM_DETAIL_HOST_OPS_HPP
// Elementwise host loops the optimizer layer needs beyond reductions: casting with a scale, and
// the checks that a list of tensors is usable.

#include <herd/core/config.hpp>
#include <herd/core/detail/f16c.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace herd::detail {

// dst[i] = D(src[i] * scale). dst may be src (same dtype). The product is formed in double and
// rounded once into D.
HERD_SEPARATE void host_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n, double scale = 1.0);

// What is wrong with a list of views that must be host memory of a valid dtype with data for
// their elements: the first problem and what to do about it (empty when nothing is), for a
// collective to carry to every rank.
struct host_tensors_fault {
  std::uint32_t code = 0;  // its name to the other ranks (comm/detail/agreement.hpp's fault_text)
  std::string what, todo;
};
HERD_SEPARATE host_tensors_fault find_host_tensors_fault(const std::vector<buffer_view>& views, const char* what);

// Raises (on this rank) what find_host_tensors_fault finds.
HERD_SEPARATE void require_host_tensors(const std::vector<buffer_view>& views, const char* operation, const char* what);

// The dtype gradients are accumulated in across backward passes: f32 for the 16-bit floats
// (whose own precision would swallow small contributions), the dtype itself otherwise.
constexpr dtype accumulation_dtype(dtype t) noexcept {
  return t == dtype::f16 || t == dtype::bf16 ? dtype::f32 : t;
}

// acc[i] = src[i] (first) or acc[i] += src[i], in acc's dtype.
HERD_SEPARATE void host_accumulate(void* acc, dtype acc_type, const void* src, dtype src_type, std::size_t n, bool first);

// dst[i] = acc[i] + dst[i]: the sum of the accumulated passes and the current one.
HERD_SEPARATE void host_fold(void* dst, dtype dst_type, const void* acc, dtype acc_type, std::size_t n);

// Raises unless params[i] and grads[i] match pairwise (count and dtype), are floating point and
// live in host memory: what the reference optimizers need.
HERD_SEPARATE void require_parameter_pairs(const std::vector<buffer_view>& params, const std::vector<buffer_view>& grads,
                                           const char* operation);

// The dtype optimizer state is kept in for parameters of dtype t: f64 for f64, f32 otherwise.
constexpr dtype state_dtype(dtype t) noexcept { return t == dtype::f64 ? dtype::f64 : dtype::f32; }

}  // namespace herd::detail

// The definitions: inline, or with HERD_SEPARATE_COMPILATION only in the program's implementation
// file (core/config.hpp), so that a file that trains neither parses nor compiles their loops over
// every pair of dtypes.
#if defined(HERD_SEPARATE_DEFINITIONS)
namespace herd::detail {

HERD_SEPARATE void host_cast(void* dst, dtype dst_type, const void* src, dtype src_type, std::size_t n, double scale) {
  if (n == 0) return;
  if (dst_type == src_type && scale == 1.0) {
    if (dst != src) std::memmove(dst, src, n * size_of(dst_type));
    return;
  }
  visit(dst_type, [&](auto d) {
    using D = decltype(d);
    visit(src_type, [&](auto s) {
      using S = decltype(s);
      auto* out = static_cast<D*>(dst);
      const auto* in = static_cast<const S*>(src);
      std::size_t i = 0;  // where the portable loop starts: after what F16C did (core/detail/f16c.hpp)
      if constexpr (std::is_same_v<D, float> && std::is_same_v<S, half>) i = f16c_widen(out, in, n, scale);
      if constexpr (std::is_same_v<D, half> && std::is_same_v<S, float>) i = scale == 1.0 ? f16c_narrow(out, in, n) : 0;
      if constexpr (std::is_same_v<D, float> && std::is_same_v<S, float>) {
        const auto f = static_cast<float>(scale);  // float * float vectorizes; f32 gradients stay in f32
        for (; i < n; ++i) out[i] = in[i] * f;
      } else {
        for (; i < n; ++i) out[i] = from_double<D>(to_double(in[i]) * scale);
      }
    });
  });
}

HERD_SEPARATE host_tensors_fault find_host_tensors_fault(const std::vector<buffer_view>& views, const char* what) {
  for (std::size_t i = 0; i < views.size(); ++i) {
    const auto& v = views[i];
    const std::string which = std::string(what) + " " + std::to_string(i);
    if (!is_valid(v.type)) return {1, which + " has an invalid dtype", "Check its tensor_traits::dtype"};
    if (v.data == nullptr && v.count != 0) {
      return {2, which + " has a null data pointer and " + std::to_string(v.count) + " elements",
              "Allocate it before handing it to herd"};
    }
    if (!v.device.is_cpu()) {
      return {5, which + " lives on " + v.device.str() + " but this code runs on the host",
              "Compile with nvcc for device tensors, or keep these tensors in host memory"};
    }
  }
  return {};
}

HERD_SEPARATE void require_host_tensors(const std::vector<buffer_view>& views, const char* operation, const char* what) {
  if (host_tensors_fault fault = find_host_tensors_fault(views, what); !fault.what.empty())
    raise({operation}, fault.what, fault.todo);
}

HERD_SEPARATE void host_accumulate(void* acc, dtype acc_type, const void* src, dtype src_type, std::size_t n, bool first) {
  if (first) return host_cast(acc, acc_type, src, src_type, n);
  visit(acc_type, [&](auto a) {
    using A = decltype(a);
    visit(src_type, [&](auto s) {
      using S = decltype(s);
      auto* out = static_cast<A*>(acc);
      const auto* in = static_cast<const S*>(src);
      for (std::size_t i = 0; i < n; ++i) out[i] = from_double<A>(to_double(out[i]) + to_double(in[i]));
    });
  });
}

HERD_SEPARATE void host_fold(void* dst, dtype dst_type, const void* acc, dtype acc_type, std::size_t n) {
  visit(dst_type, [&](auto d) {
    using D = decltype(d);
    visit(acc_type, [&](auto a) {
      using A = decltype(a);
      auto* out = static_cast<D*>(dst);
      const auto* in = static_cast<const A*>(acc);
      for (std::size_t i = 0; i < n; ++i) out[i] = from_double<D>(to_double(in[i]) + to_double(out[i]));
    });
  });
}

HERD_SEPARATE void require_parameter_pairs(const std::vector<buffer_view>& params, const std::vector<buffer_view>& grads,
                                           const char* operation) {
  if (params.size() != grads.size()) {
    raise({operation}, std::to_string(params.size()) + " parameters but " + std::to_string(grads.size()) + " gradients",
          "Pass one gradient per parameter, in the same order");
  }
  require_host_tensors(params, operation, "parameter");
  require_host_tensors(grads, operation, "gradient");
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!is_floating_point(params[i].type)) {
      raise({operation}, "parameter " + std::to_string(i) + " is " + std::string(name(params[i].type)),
            "The reference optimizers update floating-point parameters (f16, bf16, f32, f64) only");
    }
    if (params[i].count != grads[i].count || params[i].type != grads[i].type) {
      raise({operation}, "parameter " + std::to_string(i) + " (" + std::to_string(params[i].count) + " " +
                             std::string(name(params[i].type)) + ") and its gradient (" + std::to_string(grads[i].count) +
                             " " + std::string(name(grads[i].type)) + ") differ",
            "Pass each parameter's own gradient, of the same size and dtype");
    }
  }
}

}  // namespace herd::detail
#endif

#endif  // HERD_OPTIM_DETAIL_HOST_OPS_HPP
