// The C++ half of check_safetensors.py: writes a herd checkpoint of several dtypes and shapes, or
// loads a safetensors file that PyTorch wrote into herd tensors by name and checks every value bit
// for bit. The values are generation k of formulas the script computes too. Built with Eigen
// (HERD_INTEROP_EIGEN), it adds a 3x2 Eigen::MatrixXf (column-major) and a row-major one, M(i, j)
// = 10 i + j + 100 k, saved with shape {3, 2}: Python must find t[i][j] == M(i, j).
//   checkpoint_interop write PATH   saves generation 0
//   checkpoint_interop read PATH    loads PATH and expects generation 1

#include <herd/core/half.hpp>
#include <herd/checkpoint/checkpoint.hpp>
#include <herd/tensor/std.hpp>

#if defined(HERD_INTEROP_EIGEN)
#include <Eigen/Core>
#include <herd/tensor/eigen.hpp>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

struct state {
  std::vector<float> f32, special, empty;
  std::vector<double> f64, scale;
  std::vector<herd::half> f16;
  std::vector<herd::bfloat16> bf16;
  std::vector<std::int32_t> i32;
  std::vector<std::int64_t> i64;
  std::vector<std::uint8_t> u8;
  std::vector<std::int8_t> i8;
  std::int64_t step = 0;
#if defined(HERD_INTEROP_EIGEN)
  Eigen::MatrixXf eigen{3, 2};
  Eigen::Matrix<float, 3, 2, Eigen::RowMajor> eigen_row_major;
#endif

  explicit state(int k) {
    const auto g = static_cast<double>(k);
    for (int j = 0; j < 6; ++j) f32.push_back(static_cast<float>(j * 0.75 - 2.5 + g));
    // -0, inf, -inf, the smallest subnormal, a NaN with a payload, the largest float
    for (std::uint32_t bits : {0x80000000u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x7fc00001u, 0x7f7fffffu}) {
      float f;
      std::memcpy(&f, &bits, sizeof f);
      special.push_back(f);
    }
    for (int j = 0; j < 5; ++j) f64.push_back(1.0 / (j + 3) + g);
    for (int j = 0; j < 12; ++j) f16.push_back(herd::half(j * 0.5 - 3 + g));
    for (int j = 0; j < 4; ++j) bf16.push_back(herd::bfloat16(static_cast<float>(j * -1.25 + 0.5 + g)));
    for (int j = 0; j < 4; ++j) i32.push_back(j * -100003 - 7 + k);
    for (int j = 0; j < 3; ++j) i64.push_back((std::int64_t{1} << 40) * (j - 1) + k);
    for (int j = 0; j < 7; ++j) u8.push_back(static_cast<std::uint8_t>((j * 37 + k) % 256));
    for (int j = 0; j < 4; ++j) i8.push_back(static_cast<std::int8_t>(j * -30 + 5 + k));
    scale = {0.125 * (k + 1)};
    step = 123456789 + k;
#if defined(HERD_INTEROP_EIGEN)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) eigen(i, j) = eigen_row_major(i, j) = static_cast<float>(10 * i + j + 100 * k);
#endif
  }

  void register_into(herd::checkpoint& c) {
    c.add("f32", f32, {2, 3}).add("f32.special", special).add("f64", f64).add("f16", f16, {3, 2, 2});
    c.add("bf16", bf16).add("i32", i32, {2, 2}).add("i64", i64).add("u8", u8).add("i8", i8);
    c.add("empty", empty, {0, 3}).add("scale", scale).add_value("step", step);
#if defined(HERD_INTEROP_EIGEN)
    c.add("eigen", eigen, {3, 2}).add("eigen.row_major", eigen_row_major, {3, 2});
#endif
  }

  // Whether the matrices hold want's values, element by element.
  bool same_matrices(const state& want) const {
#if defined(HERD_INTEROP_EIGEN)
    bool ok = true;
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 2; ++j) {
        if (eigen(i, j) != want.eigen(i, j) || eigen_row_major(i, j) != want.eigen_row_major(i, j)) {
          std::fprintf(stderr, "checkpoint_interop: \"eigen\"(%d, %d) is %g (row-major %g), PyTorch saved t[%d][%d] = %g\n",
                       i, j, static_cast<double>(eigen(i, j)), static_cast<double>(eigen_row_major(i, j)), i, j,
                       static_cast<double>(want.eigen(i, j)));
          ok = false;
        }
      }
    }
    return ok;
#else
    (void)want;
    return true;
#endif
  }
};

template <class T> bool same(const char* name, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() == want.size() && std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return true;
  std::fprintf(stderr, "checkpoint_interop: \"%s\" does not hold the values PyTorch saved\n", name);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "read") {
    std::fprintf(stderr, "usage: checkpoint_interop write|read PATH\n");
    return 2;
  }
  try {
    herd::checkpoint c;
    if (mode == "write") {
      state s(0);
      s.register_into(c);
      c.save(argv[2]);
      return 0;
    }
    const state want(1);
    state got(7);
    got.register_into(c);
    if (!c.load(argv[2])) {
      std::fprintf(stderr, "checkpoint_interop: %s does not exist\n", argv[2]);
      return 1;
    }
    const bool ok = same("f32", got.f32, want.f32) & same("f32.special", got.special, want.special) &
                    same("f64", got.f64, want.f64) & same("f16", got.f16, want.f16) &
                    same("bf16", got.bf16, want.bf16) & same("i32", got.i32, want.i32) &
                    same("i64", got.i64, want.i64) & same("u8", got.u8, want.u8) & same("i8", got.i8, want.i8) &
                    same("empty", got.empty, want.empty) & same("scale", got.scale, want.scale) &
                    same("step", std::vector<std::int64_t>{got.step}, {want.step}) & got.same_matrices(want);
    std::printf("checkpoint_interop: %s loaded into herd tensors by name%s\n", argv[2], ok ? ", every bit as saved" : "");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
