#pragma once
// The f32 -> f16 cast case of the GPU suite, shared with the host test that runs the cast
// kernel's body on the same inputs (tests/unit/test_kernel_bodies.cpp), so that what the GPU
// suite expects is checked on every machine.

#include <herd/core/half.hpp>

#include "../support/reference.hpp"

#include <cstdint>
#include <vector>

namespace herd_test::gpu_cast {

inline constexpr std::uint64_t seed = 102;
inline constexpr std::size_t count = 100003;
inline constexpr double scale = 0.5;

// k/16 for |k| <= 4000.
inline std::vector<float> inputs(rng& g) {
  std::vector<float> values(count);
  for (auto& v : values) v = static_cast<float>(g.between(-4000, 4000)) / 16;
  return values;
}

// The bits the kernel must give: x * 0.5 rounded once to half. x * 0.5 itself is not always a
// half: in [64, 128) halves are 1/16 apart and k/32 falls between them for odd k.
inline std::uint16_t expected(float x) { return herd::half(x * static_cast<float>(scale)).bits; }

}  // namespace herd_test::gpu_cast
