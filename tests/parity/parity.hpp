#pragma once
// What both parity programs share: reading reference.py's files and comparing with PyTorch's values.

#include <herd/core/dtype.hpp>
#include <herd/checkpoint/checkpoint.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace parity {

namespace fs = std::filesystem;

// The tensors of one reference file, by name.
class reference {
 public:
  explicit reference(const fs::path& path) {
    try {
      auto file = herd::detail::ckpt::read_file(path);
      if (!file) throw std::runtime_error(path.string() + " is missing: reference.py did not write it");
      file_ = std::move(*file);
    } catch (const herd::detail::ckpt::failure& f) {
      throw std::runtime_error(f.what);
    }
  }

  bool contains(const std::string& name) const {
    return std::any_of(file_.tensors.begin(), file_.tensors.end(), [&](const auto& t) { return t.name == name; });
  }

  std::vector<std::int64_t> shape(const std::string& name) const {
    for (const auto& t : file_.tensors) {
      if (t.name == name) return {t.shape.begin(), t.shape.end()};
    }
    throw std::runtime_error("reference tensor " + name + " is missing");
  }

  template <class T> std::vector<T> get(const std::string& name) const {
    for (const auto& t : file_.tensors) {
      if (t.name != name) continue;
      if (t.dtype != herd::detail::safetensors::dtype_name(herd::dtype_of<T>::value)) {
        throw std::runtime_error("reference tensor " + name + " is " + t.dtype);
      }
      std::vector<T> values((t.end - t.begin) / sizeof(T));
      if (!values.empty()) std::memcpy(values.data(), file_.bytes.data() + file_.data_start + t.begin, t.end - t.begin);
      return values;
    }
    throw std::runtime_error("reference tensor " + name + " is missing");
  }

 private:
  herd::detail::ckpt::file_contents file_;
};

// Compares herd's values with PyTorch's: bit for bit (tolerance 0) or within a relative tolerance;
// keeps the largest difference and the first place that is out of bounds.
class comparison {
 public:
  explicit comparison(double tolerance) : tolerance_(tolerance) {}

  template <class T> void check(const std::string& what, const T* herd, const T* torch, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double a = herd::detail::to_double(herd[i]), b = herd::detail::to_double(torch[i]);
      const double diff = std::abs(a - b) / std::max(std::abs(b), 1e-30);
      const bool same = tolerance_ == 0 ? std::memcmp(&herd[i], &torch[i], sizeof(T)) == 0 || (std::isnan(a) && std::isnan(b))
                                        : diff <= tolerance_ || (std::isnan(a) && std::isnan(b));
      if (!(diff <= largest_)) largest_ = std::isnan(diff) ? largest_ : diff;
      if (!same && failures_++ == 0) {
        std::printf("  first difference: %s[%zu]: herd %.17g, torch %.17g (relative %.3g)\n", what.c_str(), i, a, b, diff);
      }
    }
  }
  template <class T> void check(const std::string& what, const std::vector<T>& herd, const std::vector<T>& torch) {
    if (herd.size() != torch.size()) throw std::runtime_error(what + ": sizes differ");
    check(what, herd.data(), torch.data(), herd.size());
  }

  int report(const char* check) const {
    std::printf("%s: largest relative difference %.3g (%s); %zu values out of bounds\n", check, largest_,
                tolerance_ == 0 ? "bit-identical required" : tolerance_text().c_str(), failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  std::string tolerance_text() const {
    char text[48];
    std::snprintf(text, sizeof text, "tolerance %g relative", tolerance_);
    return text;
  }

  double tolerance_;
  double largest_ = 0;
  std::size_t failures_ = 0;
};

}  // namespace parity
