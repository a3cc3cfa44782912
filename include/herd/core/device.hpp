#ifndef HERD_CORE_DEVICE_HPP
#define HERD_CORE_DEVICE_HPP
// Where a tensor's memory lives.

#include <herd/core/config.hpp>

#include <cstdint>
#include <string>

namespace herd {

struct device {
  enum class kind : std::uint8_t { cpu, cuda };

  kind type = kind::cpu;
  int index = 0;  // the CUDA device ordinal; 0 for the CPU

  static constexpr device cpu() noexcept { return {kind::cpu, 0}; }
  static constexpr device cuda(int ordinal) noexcept { return {kind::cuda, ordinal}; }

  constexpr bool is_cpu() const noexcept { return type == kind::cpu; }
  constexpr bool is_cuda() const noexcept { return type == kind::cuda; }

  friend constexpr bool operator==(const device&, const device&) = default;

  // "cpu" or "cuda:N", as error messages print it.
  std::string str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }
};

}  // namespace herd

#endif  // HERD_CORE_DEVICE_HPP
