// herd's side of the host parity checks: parity_host CHECK DIR reads DIR/CHECK.safetensors, written
// by reference.py (inputs from a fixed seed and PyTorch's results), computes the same with herd and
// compares. It prints the largest difference and exits 0 when it is within the check's bound, 1
// otherwise, 77 (skipped) when reference.py found no torch.

#include <herd/herd.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

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
      const double a = static_cast<double>(herd[i]), b = static_cast<double>(torch[i]);
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
                tolerance_ == 0 ? "bit-identical required" : ("tolerance " + std::to_string(tolerance_)).c_str(), failures_);
    return failures_ == 0 ? 0 : 1;
  }

 private:
  double tolerance_;
  double largest_ = 0;
  std::size_t failures_ = 0;
};

// Runs each case of an optimizer check: both dtypes, every step compared with torch.optim's.
template <class Make> int optimizer_check(const char* check, const reference& ref, Make make) {
  comparison cmp(0);
  const auto cases = ref.get<std::int64_t>("cases")[0];
  for (std::int64_t c = 0; c < cases; ++c) {
    const auto options = ref.get<double>(std::to_string(c) + ".options");
    const auto run = [&]<class T>(T, const char* dn) {
      const std::string prefix = std::to_string(c) + "." + dn + ".";
      std::vector<std::vector<T>> params, grads, torch, all_grads;
      for (std::size_t k = 0; k < 2; ++k) {
        params.push_back(ref.get<T>(prefix + "init." + std::to_string(k)));
        all_grads.push_back(ref.get<T>(prefix + "grads." + std::to_string(k)));
        torch.push_back(ref.get<T>(prefix + "torch." + std::to_string(k)));
        grads.emplace_back(params.back().size());
      }
      auto opt = make(herd::views(params[0], params[1]), herd::views(grads[0], grads[1]), options);
      const std::size_t steps = all_grads[0].size() / params[0].size();
      for (std::size_t s = 0; s < steps; ++s) {
        for (std::size_t k = 0; k < 2; ++k) std::memcpy(grads[k].data(), all_grads[k].data() + s * grads[k].size(), grads[k].size() * sizeof(T));
        opt.step();
        for (std::size_t k = 0; k < 2; ++k) {
          cmp.check(prefix + "param." + std::to_string(k) + " step " + std::to_string(s + 1), params[k].data(),
                    torch[k].data() + s * params[k].size(), params[k].size());
        }
      }
    };
    run(float{}, "f32");
    run(double{}, "f64");
  }
  return cmp.report(check);
}

int sgd(const reference& ref) {
  return optimizer_check("parity_sgd", ref, [](auto params, auto grads, const std::vector<double>& o) {
    return herd::sgd(std::move(params), std::move(grads),
                     {.lr = o[0], .momentum = o[1], .dampening = o[2], .nesterov = o[3] != 0, .weight_decay = o[4]});
  });
}

int adamw(const reference& ref) {
  return optimizer_check("parity_adamw", ref, [](auto params, auto grads, const std::vector<double>& o) {
    return herd::adamw(std::move(params), std::move(grads),
                       {.lr = o[0], .beta1 = o[1], .beta2 = o[2], .eps = o[3], .weight_decay = o[4]});
  });
}

const std::map<std::string, std::function<int(const reference&)>> checks = {{"sgd", sgd}, {"adamw", adamw}};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || !checks.contains(argv[1])) {
    std::fprintf(stderr, "usage: parity_host CHECK DIR (CHECK one of:");
    for (const auto& [name, _] : checks) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  const fs::path dir = argv[2];
  if (fs::exists(dir / "torch_missing")) {
    std::printf("skipped: %s", "reference.py found no torch\n");
    return 77;
  }
  try {
    return checks.at(argv[1])(reference(dir / (std::string(argv[1]) + ".safetensors")));
  } catch (const std::exception& e) {
    std::printf("parity_%s: %s\n", argv[1], e.what());
    return 1;
  }
}
