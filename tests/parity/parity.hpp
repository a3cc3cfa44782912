#pragma once
// What both parity programs share: reading reference.py's files and comparing with PyTorch's values.

#include <herd/core/dtype.hpp>
#include <herd/checkpoint/checkpoint.hpp>
#include <herd/optim/adamw.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace parity {

namespace fs = std::filesystem;

// The PyTorch that computed the reference (torch.__version__, which reference.py writes to
// DIR/torch_version): each check compares with what that version does.
struct torch_version {
  int major = 0;
  int minor = 0;
  std::string text = "unknown";

  bool at_least(int a, int b) const { return major > a || (major == a && minor >= b); }

  static torch_version of(const fs::path& dir) {
    torch_version v;
    std::ifstream file(dir / "torch_version");
    if (!(file >> v.text)) throw std::runtime_error((dir / "torch_version").string() + " is missing: reference.py did not write it");
    if (std::sscanf(v.text.c_str(), "%d.%d", &v.major, &v.minor) != 2) throw std::runtime_error("torch version " + v.text + " is not MAJOR.MINOR...");
    return v;
  }
};

// torch.optim.AdamW's first-moment update in that version: lerp_ from PyTorch 2.1, mul_ and add_
// before.
inline herd::adamw_first_moment adamw_first_moment_of(const torch_version& v) {
  return v.at_least(2, 1) ? herd::adamw_first_moment::lerp : herd::adamw_first_moment::mul_add;
}

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

// Compares herd's values with PyTorch's: bit for bit (tolerance 0) or within a relative tolerance
// (relative to PyTorch's value, or to `scale` where that is smaller: values that cross zero);
// keeps the largest difference and the first place that is out of bounds.
class comparison {
 public:
  explicit comparison(double tolerance, double scale = 1e-30) : tolerance_(tolerance), scale_(scale) {}

  template <class T> void check(const std::string& what, const T* herd, const T* torch, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double a = herd::detail::to_double(herd[i]), b = herd::detail::to_double(torch[i]);
      const double diff = std::abs(a - b) / std::max(std::abs(b), scale_);
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
    char text[80];
    if (scale_ > 1e-30) std::snprintf(text, sizeof text, "tolerance %g relative to max(|torch|, %g)", tolerance_, scale_);
    else std::snprintf(text, sizeof text, "tolerance %g relative", tolerance_);
    return text;
  }

  double tolerance_;
  double scale_;
  double largest_ = 0;
  std::size_t failures_ = 0;
};

}  // namespace parity
