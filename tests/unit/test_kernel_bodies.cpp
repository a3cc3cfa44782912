// herd's CUDA kernels, run on the CPU: every kernel body is a function of (thread, thread
// count) or (block, thread), so running it for every position of an emulated grid computes what
// the GPU computes. Checked against the host reference for every dtype x op pair, with odd sizes,
// misaligned and mutually misaligned pointers, and grids smaller and larger than the work.
// The same file is compiled by nvcc into cuda_host_tests when CUDA is enabled.

#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/cuda/detail/batched_body.hpp>
#include <herd/cuda/detail/elementwise_body.hpp>
#include <herd/core/half.hpp>
#include <herd/optim/detail/bucket_plan.hpp>
#include <herd/optim/detail/gradient_movers.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include "../gpu/cast_case.hpp"
#include "../support/half_reference.hpp"
#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace herd::cuda::detail;

// Runs body(thread, threads) for every thread of a grid of `threads` threads.
template <class Body> void emulate(std::size_t threads, Body body) {
  for (std::size_t t = 0; t < threads; ++t) body(t, threads);
}

template <class T> void run_reduce(herd::reduce_op op, const reduce_args<T>& args, std::size_t threads) {
  emulate(threads, [&](std::size_t t, std::size_t n) {
    switch (op) {
      case herd::reduce_op::sum: return reduce_thread<T, herd::reduce_op::sum>(args, t, n);
      case herd::reduce_op::avg: return reduce_thread<T, herd::reduce_op::avg>(args, t, n);
      case herd::reduce_op::min: return reduce_thread<T, herd::reduce_op::min>(args, t, n);
      case herd::reduce_op::max: return reduce_thread<T, herd::reduce_op::max>(args, t, n);
      case herd::reduce_op::prod: return reduce_thread<T, herd::reduce_op::prod>(args, t, n);
      default:
        if constexpr (std::is_integral_v<T>) {
          if (op == herd::reduce_op::band) return reduce_thread<T, herd::reduce_op::band>(args, t, n);
          if (op == herd::reduce_op::bor) return reduce_thread<T, herd::reduce_op::bor>(args, t, n);
          return reduce_thread<T, herd::reduce_op::bxor>(args, t, n);
        }
    }
  });
}

template <class T> void fill(T* p, std::size_t n, herd_test::rng& g, herd::reduce_op op) {
  for (std::size_t i = 0; i < n; ++i) p[i] = herd_test::draw<T>(g, herd_test::values::rough, op);
}

// Four arenas of 16-byte-aligned memory, poisoned before each case.
struct arena {
  alignas(16) std::byte bytes[4][8 * 4200 + 64];
  void poison() { std::memset(bytes, 0xa5, sizeof bytes); }
  template <class T> T* at(int which, std::size_t element_offset, std::size_t byte_shift = 0) {
    return reinterpret_cast<T*>(bytes[which] + byte_shift) + element_offset;
  }
};

const std::size_t odd_sizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 64, 100, 1000, 4097};
const std::size_t grids[] = {1, 3, 32, 1024};
// Element offsets from a 16-byte boundary of (in/a, b, out): aligned, shifted alike, mixed.
const std::array<std::size_t, 3> offsets[] = {{0, 0, 0}, {1, 1, 1}, {0, 1, 0}, {3, 0, 2}};

}  // namespace

TEST_CASE("the reduce kernel body equals the host reduction for every dtype x op, size, offset and grid") {
  static arena mem;
  herd_test::rng g(77);
  for (auto type : herd::all_dtypes) {
    for (auto op : herd::all_reduce_ops) {
      if (!herd::supports(type, op)) continue;
      herd::visit(type, [&](auto element) {
        using T = decltype(element);
        for (std::size_t n : odd_sizes) {
          for (const auto& o : offsets) {
            const std::size_t threads = grids[g.below(4)];
            const int avg = op == herd::reduce_op::avg ? 3 : 0;
            mem.poison();
            T* a = mem.at<T>(0, o[0]);
            T* b = mem.at<T>(1, o[1]);
            T* out = mem.at<T>(2, o[2]);
            T* want = mem.at<T>(3, o[2]);
            fill(a, n, g, op);
            fill(b, n, g, op);
            herd::detail::host_reduce(type, op, want, a, b, n, avg);
            run_reduce<T>(op, {out, a, b, n, avg}, threads);
            INFO(herd::name(type), " ", herd::name(op), " n=", n, " offsets ", o[0], o[1], o[2], " threads ", threads);
            CHECK(std::memcmp(out, want, n * sizeof(T)) == 0);
            CHECK(std::memcmp(out + n, want + n, 16) == 0);  // nothing written past the end
            // In place, as the ring reduces into its own buffer.
            run_reduce<T>(op, {a, a, b, n, avg}, threads);
            CHECK(std::memcmp(a, want, n * sizeof(T)) == 0);
          }
        }
      });
    }
  }
}

// 16-bit vectors whose elements are all numbers skip the conversions' NaN checks; the host models
// the hardware's conversions there (a NaN's payload lost), so a NaN or an infinity (inf + -inf
// makes a NaN) let into that path gives other bits than the host reduction. Averages over 2, 4
// and 8 ranks multiply by the reciprocal; over 3 they divide: both must round as the division.
TEST_CASE("16-bit vectors with a NaN or an infinity in any lane keep the checked conversions, and averages round as a division") {
  herd_test::rng g(81);
  for (auto type : {herd::dtype::f16, herd::dtype::bf16}) {
    herd::visit(type, [&](auto element) {
      using T = decltype(element);
      if constexpr (herd::detail::is_16bit_float<T>) {
        const bool is_half = type == herd::dtype::f16;
        const std::uint16_t specials[] = {
            static_cast<std::uint16_t>(is_half ? 0x7d23u : 0x7f91u),  // a NaN with a payload
            static_cast<std::uint16_t>(is_half ? 0xfe01u : 0xffc1u),  // a negative quiet NaN with a payload
            static_cast<std::uint16_t>(is_half ? 0x7c00u : 0x7f80u),  // +inf
            static_cast<std::uint16_t>(is_half ? 0xfc00u : 0xff80u),  // -inf
        };
        for (auto op : {herd::reduce_op::sum, herd::reduce_op::avg, herd::reduce_op::prod, herd::reduce_op::min,
                        herd::reduce_op::max}) {
          for (int ranks : {2, 3, 4, 8}) {
            if (op != herd::reduce_op::avg && ranks != 2) continue;
            const int avg = op == herd::reduce_op::avg ? ranks : 0;
            alignas(16) T a[256], b[256], out[256], want[256];
            for (std::size_t i = 0; i < 256; ++i) {
              a[i] = T(static_cast<float>(g.between(-60000, 60000)) / 7.0f);
              b[i] = T(static_cast<float>(g.between(-60000, 60000)) / 7.0f);
            }
            // One special in some vectors, in a or b, at a random lane; +inf against -inf in one.
            for (std::size_t v = 0; v < 32; v += 2) {
              T* side = g.below(2) == 0 ? a : b;
              side[v * 8 + g.below(8)] = T::from_bits(specials[g.below(4)]);
            }
            a[8 * 31 + 5] = T::from_bits(specials[2]);
            b[8 * 31 + 5] = T::from_bits(specials[3]);
            herd::detail::host_reduce(type, op, want, a, b, 256, avg);
            run_reduce<T>(op, {out, a, b, 256, avg}, 7);
            INFO(herd::name(type), " ", herd::name(op), " over ", ranks, " ranks");
            CHECK(std::memcmp(out, want, sizeof out) == 0);
          }
        }
      }
    });
  }
}

TEST_CASE("avg's rank divisor rounds as a division for every rank count") {
  herd_test::rng g(82);
  for (int ranks = 1; ranks <= 16; ++ranks) {
    const rank_divisor<float> divide(ranks);
    std::size_t differ = 0;
    for (int i = 0; i < 20000; ++i) {
      const float x = static_cast<float>(g.between(-1000000, 1000000)) / static_cast<float>(1 + g.below(997));
      differ += herd::detail::float_bits(divide(x)) != herd::detail::float_bits(x / static_cast<float>(ranks));
    }
    INFO(ranks, " ranks");
    CHECK(differ == 0);
  }
}

// The kernels divide 16-bit sums widened to float (reduce_thread): every such dividend, the
// infinities and subnormals included, against the division, for rank counts 1 to 1024 and a
// sample of larger ones. A bare multiplication by the reciprocal differs at 3 ranks already.
TEST_CASE("avg's rank divisor gives the division's bits on every 16-bit dividend") {
  herd_test::rng g(83);
  std::vector<int> counts;
  for (int n = 1; n <= 1024; ++n) counts.push_back(n);
  for (int i = 0; i < 64; ++i) counts.push_back(1025 + static_cast<int>(g.below(1 << 20)));
  for (bool is_half : {true, false}) {
    std::vector<float> dividends;
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
      const auto b = static_cast<std::uint16_t>(bits);
      const float x = is_half ? static_cast<float>(herd::half::from_bits(b)) : static_cast<float>(herd::bfloat16::from_bits(b));
      if (!std::isnan(x)) dividends.push_back(x);
    }
    std::size_t differ = 0;
    int first_differing = 0;
    for (int n : counts) {
      const rank_divisor<float> divide(n);
      for (float x : dividends) {
        const bool wrong = herd::detail::float_bits(divide(x)) != herd::detail::float_bits(x / static_cast<float>(n));
        if (wrong && differ++ == 0) first_differing = n;
      }
    }
    INFO(std::string(is_half ? "f16" : "bf16"), " dividends, first differing rank count ", first_differing);
    CHECK(differ == 0);
  }
}

// Pointers that share a misalignment within an element never reach a 16-byte boundary together
// (a GPU refuses such pointers at launch; the bodies must still never issue a misaligned vector
// access, which the emulated loads and stores would report). Sizes above a vector's elements.
// Skipped under UBSan (the sanitize preset): the host's scalar loads and stores through such
// pointers, which x86 takes and this case relies on, are what its alignment check reports.
#ifdef HERD_TEST_UNDER_UBSAN
constexpr bool under_ubsan = true;
#else
constexpr bool under_ubsan = false;
#endif
TEST_CASE("kernel bodies on pointers misaligned within an element take no misaligned vector access" *
          doctest::skip(under_ubsan)) {
  static arena mem;
  herd_test::rng g(80);
  for (auto type : herd::all_dtypes) {
    if (herd::size_of(type) == 1) continue;
    herd::visit(type, [&](auto element) {
      using T = decltype(element);
      for (std::size_t shift = 1; shift < sizeof(T); ++shift) {
        for (std::size_t n : {std::size_t{17}, std::size_t{100}, std::size_t{1000}}) {
          const std::size_t threads = grids[g.below(4)];
          mem.poison();
          T* a = mem.at<T>(0, 1, shift);
          T* b = mem.at<T>(1, 1, shift);
          T* out = mem.at<T>(2, 1, shift);
          T* want = mem.at<T>(3, 1, shift);
          fill(a, n, g, herd::reduce_op::sum);
          fill(b, n, g, herd::reduce_op::sum);
          herd::detail::host_reduce(type, herd::reduce_op::sum, want, a, b, n, 0);
          INFO(herd::name(type), " shift ", shift, " n=", n, " threads ", threads);
          CHECK_NOTHROW(run_reduce<T>(herd::reduce_op::sum, {out, a, b, n, 0}, threads));
          CHECK(std::memcmp(out, want, n * sizeof(T)) == 0);
          if constexpr (!std::is_integral_v<T>) {
            CHECK_NOTHROW(emulate(threads, [&](std::size_t t, std::size_t all) {
              cast_thread<T, T>({out, a, n, 0.5}, t, all);
            }));
          }
        }
      }
    });
  }
}

TEST_CASE("the emulated vector access fails on a misaligned address, as the GPU does") {
  alignas(16) std::byte bytes[64] = {};
  auto load_at = [&](std::size_t offset) { return load_lanes<float, 4>(reinterpret_cast<const float*>(bytes + offset)); };
  auto store_at = [&](std::size_t offset) {
    store_lanes<std::uint16_t, 2>(reinterpret_cast<std::uint16_t*>(bytes + offset), {});
  };
  CHECK_NOTHROW(load_at(16));
  CHECK_NOTHROW(store_at(4));
  CHECK_THROWS_WITH_AS(load_at(4), doctest::Contains("misaligned 16-byte vector load"), herd::error);
  CHECK_THROWS_WITH_AS(store_at(2), doctest::Contains("misaligned 4-byte vector store"), herd::error);
}

TEST_CASE("the cast kernel body equals the host cast for every float pair, scale, size, offset and grid") {
  static arena mem;
  herd_test::rng g(78);
  const herd::dtype floats[] = {herd::dtype::f16, herd::dtype::bf16, herd::dtype::f32, herd::dtype::f64};
  for (auto to : floats) {
    for (auto from : floats) {
      herd::visit(to, [&](auto d) {
        herd::visit(from, [&](auto s) {
          using D = decltype(d);
          using S = decltype(s);
          if constexpr (!std::is_integral_v<D> && !std::is_integral_v<S>) {
            for (std::size_t n : odd_sizes) {
              for (const auto& o : offsets) {
                const double scale = g.below(2) ? 1.0 : 0.125;
                mem.poison();
                S* in = mem.at<S>(0, o[0]);
                D* out = mem.at<D>(1, o[2]);
                D* want = mem.at<D>(2, o[2]);
                fill(in, n, g, herd::reduce_op::sum);
                // The host cast rounds once from double; the kernel computes in float unless a side
                // is f64. Both are exact for these values times a power of two, so they agree.
                herd::detail::host_cast(want, to, in, from, n, scale);
                emulate(grids[g.below(4)], [&](std::size_t t, std::size_t threads) {
                  cast_thread<D, S>({out, in, n, scale}, t, threads);
                });
                INFO(herd::name(to), " <- ", herd::name(from), " n=", n, " scale ", scale, " offsets ", o[0], o[2]);
                bool same = true;
                for (std::size_t i = 0; i < n; ++i)
                  same = same && herd::detail::to_double(out[i]) == herd::detail::to_double(want[i]);
                CHECK(same);
                CHECK(std::memcmp(out + n, want + n, 8) == 0);
              }
            }
          }
        });
      });
    }
  }
}

TEST_CASE("the batched copy body packs and unpacks a thousand tensors of mixed sizes and offsets") {
  herd_test::rng g(79);
  for (int round = 0; round < 6; ++round) {
    const bool compress = round % 2 == 1;  // f32 -> f16 with a scale, and back
    const std::uint64_t per_block = round < 2 ? 4096 : (round < 4 ? 7 : 64);
    const std::size_t tensors = round < 4 ? 1000 : 37;
    std::vector<std::vector<float>> sources(tensors);
    std::size_t total = 0;
    for (auto& s : sources) {
      const std::size_t n = g.below(5) == 0 ? 0 : (g.below(10) == 0 ? g.below(20000) : g.below(300));
      s.resize(n + 3);
      total += n;
    }
    // Pack every tensor (from a random element offset) into one buffer, then unpack into copies.
    std::vector<std::byte> buffer((total + 8) * 4 + 16, std::byte{0xa5});
    std::vector<batch_entry> pack, unpack;
    std::vector<std::vector<float>> restored(tensors);
    std::uint64_t blocks = 0, unpack_blocks = 0;
    std::size_t at = 1;  // an odd start: the buffer is misaligned against every tensor
    for (std::size_t i = 0; i < tensors; ++i) {
      const std::size_t offset = g.below(3);
      const std::size_t n = sources[i].size() - 3;
      for (std::size_t j = 0; j < n; ++j) sources[i][offset + j] = static_cast<float>(g.between(-1000, 1000)) / 8;
      restored[i].assign(n + 3, -7.0f);
      const std::size_t wire = compress ? 2 : 4;
      void* slot = buffer.data() + at * wire;
      pack.push_back({sources[i].data() + offset, slot, n, blocks});
      unpack.push_back({slot, restored[i].data() + offset, n, unpack_blocks});
      blocks += batch_blocks(n, per_block);
      unpack_blocks += batch_blocks(n, per_block);
      at += n;
    }
    const double scale = compress ? 0.5 : 1.0;
    const std::vector<std::uint32_t> pack_owners = batch_block_entries(pack, per_block);
    const std::vector<std::uint32_t> unpack_owners = batch_block_entries(unpack, per_block);
    REQUIRE(pack_owners.size() == blocks);
    REQUIRE(unpack_owners.size() == unpack_blocks);
    const batch_args pack_args{pack.data(), pack_owners.data(), per_block, scale};
    const batch_args unpack_args{unpack.data(), unpack_owners.data(), per_block, 1.0 / scale};
    const std::size_t threads = round == 0 ? 256 : 3;
    for (std::uint64_t b = 0; b < blocks; ++b) {
      for (std::size_t t = 0; t < threads; ++t) {
        if (compress) batch_thread<herd::half, float>(pack_args, b, t, threads);
        else batch_thread<float, float>(pack_args, b, t, threads);
      }
    }
    for (std::uint64_t b = 0; b < unpack_blocks; ++b) {
      for (std::size_t t = 0; t < threads; ++t) {
        if (compress) batch_thread<float, herd::half>(unpack_args, b, t, threads);
        else batch_thread<float, float>(unpack_args, b, t, threads);
      }
    }
    bool same = true;
    for (std::size_t i = 0; i < tensors; ++i) {
      const auto& in = pack[i];
      const auto* source = static_cast<const float*>(in.in);
      const auto* back = static_cast<const float*>(unpack[i].out);
      for (std::size_t j = 0; j < in.count; ++j) same = same && back[j] == source[j];  // exact: k/8 in f16 range
      // Untouched around each restored tensor.
      same = same && restored[i].back() == -7.0f;
    }
    INFO("round ", round, " compress ", compress, " elements per block ", per_block);
    CHECK(same);
  }
}

namespace {

using herd_test::bfloat16_reference;
using herd_test::bits_of;
using herd_test::float_of;

// The floats where a conversion to a 16-bit type is decided, for every pattern b of that type
// (decoded by `value`): b's value, the midpoint to the next pattern up in magnitude (a tie), the
// floats just either side of both, and one float drawn between them.
template <class Value, class Visit> void conversion_cases(Value value, herd_test::rng& g, Visit visit) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float v = value(static_cast<std::uint16_t>(b));
    if (std::isnan(v)) continue;
    const float next = value(static_cast<std::uint16_t>((b & 0x7fffu) == 0x7fffu ? b : b + 1));
    const float candidates[] = {v, std::nextafter(v, 0.0f), std::nextafter(v, v < 0 ? -INFINITY : INFINITY)};
    for (float c : candidates) visit(c);
    if (std::isinf(v) || std::isnan(next) || std::isinf(next)) continue;
    const float mid = static_cast<float>((static_cast<double>(v) + static_cast<double>(next)) / 2);  // exact
    for (float c : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, mid < 0 ? -INFINITY : INFINITY)}) visit(c);
    const std::uint32_t lo = bits_of(v), hi = bits_of(next);
    if (hi > lo + 1) visit(float_of(lo + 1 + static_cast<std::uint32_t>(g.below(hi - lo - 1))));
  }
  // Beyond the largest finite values (overflow to infinity) and a sweep of every exponent.
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65521) visit(float_of(static_cast<std::uint32_t>(u)));
}

}  // namespace

// On the device half and bfloat16 convert with the hardware (one instruction), NaNs excepted,
// which keep the software path. Here the IEEE conversions of the host (the compiler's _Float16,
// and under nvcc NVIDIA's host versions of the same intrinsics the device path calls) stand in for
// the hardware in that very dispatch: for every 16-bit pattern and every float where rounding is
// decided, it gives the software path's bits. What a GPU's own cvt.rn gives is checked by the GPU
// suite on a device.
TEST_CASE("half and bfloat16: the hardware-conversion path gives the software path's bits on every pattern but NaNs") {
  using namespace herd::detail;
  herd_test::rng g(80);
  std::size_t checked = 0;
  auto same = [&](std::uint16_t got, std::uint16_t want, float f, const char* what) {
    ++checked;
    if (got == want) return true;
    FAIL_CHECK(std::string(what), ": float ", f, " (bits ", bits_of(f), "): hardware path ", got, ", software ", want);
    return false;
  };
  std::vector<std::pair<const char*, std::function<std::uint16_t(float)>>> to_half, to_bfloat16;
  std::vector<std::pair<const char*, std::function<float(std::uint16_t)>>> from_half;
  // The host compiler's _Float16, not in nvcc's device pass: with --expt-relaxed-constexpr (which
  // PyTorch's CMake sets on CUDA targets) these lambdas became device functions too, and nvcc 13.0
  // stopped with "Internal Compiler Error (codegen): unsupported float variant!".
#if defined(__FLT16_MAX__) && !defined(__CUDA_ARCH__)
  to_half.emplace_back("_Float16", [](float f) {
    const _Float16 h = static_cast<_Float16>(f);
    std::uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
  });
  from_half.emplace_back("_Float16", [](std::uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return static_cast<float>(h);
  });
#endif
#if defined(__CUDACC__)
  to_half.emplace_back("__float2half_rn", [](float f) { return __half_as_ushort(__float2half_rn(f)); });
  from_half.emplace_back("__half2float", [](std::uint16_t b) { return __half2float(__ushort_as_half(b)); });
  to_bfloat16.emplace_back("__float2bfloat16_rn", [](float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); });
#endif
  to_bfloat16.emplace_back("round to the nearer neighbour", bfloat16_reference);
  REQUIRE(!to_half.empty());
  int failures = 0;
  for (const auto& [name, hardware] : to_half) {
    conversion_cases(half_bits_to_float, g, [&](float f) {
      if (failures < 10 && !same(float_to_half_bits_with(f, hardware), float_to_half_bits(f), f, name)) ++failures;
    });
    // NaNs keep the software path, payload and all.
    for (std::uint32_t payload : {1u, 0x2000u, 0x3fffffu, 0x400000u, 0x7fffffu}) {
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        const float nan = float_of(sign | 0x7f800000u | payload);
        same(float_to_half_bits_with(nan, hardware), float_to_half_bits(nan), nan, name);
      }
    }
  }
  for (const auto& [name, hardware] : from_half) {
    for (std::uint32_t b = 0; b < 65536; ++b) {
      const auto h = static_cast<std::uint16_t>(b);
      const float got = half_bits_to_float_with(h, hardware), want = half_bits_to_float(h);
      ++checked;
      if (bits_of(got) != bits_of(want) && failures++ < 10) FAIL_CHECK(std::string(name), ": half ", b, ": ", got, " against ", want);
    }
  }
  for (const auto& [name, hardware] : to_bfloat16) {
    conversion_cases(bfloat16_bits_to_float, g, [&](float f) {
      if (failures < 10 && !same(float_to_bfloat16_bits_with(f, hardware), float_to_bfloat16_bits(f), f, name)) ++failures;
    });
  }
  CHECK(failures == 0);
  CHECK(checked > 1'000'000);
}

#if defined(__FLT16_MAX__) && !defined(__CUDA_ARCH__)  // as above
// What the kernels rely on when they add two halves in float and round once: float holds the
// exact sum of two halves' values closely enough that its rounding to half equals the correct
// rounding of the exact sum (24 bits >= 2 x 11 + 2). Checked on 4 million pairs.
TEST_CASE("half: a sum computed in float and rounded once is the correctly rounded sum") {
  herd_test::rng g(81);
  int failures = 0;
  for (int i = 0; i < 4'000'000 && failures < 10; ++i) {
    const auto a = herd::half::from_bits(static_cast<std::uint16_t>(g.below(65536)));
    const auto b = herd::half::from_bits(static_cast<std::uint16_t>(g.below(65536)));
    const float fa = static_cast<float>(a), fb = static_cast<float>(b);
    if (std::isnan(fa) || std::isnan(fb) || (std::isinf(fa) && std::isinf(fb))) continue;
    const std::uint16_t got = herd::half(fa + fb).bits;
    const _Float16 exact = static_cast<_Float16>(static_cast<double>(fa) + static_cast<double>(fb));  // one rounding
    std::uint16_t want;
    std::memcpy(&want, &exact, 2);
    if (got != want && !(((got | want) & 0x7fffu) == 0 && (got & 0x7fffu) == 0)) {
      ++failures;
      FAIL_CHECK(a.bits, " + ", b.bits, ": ", got, " against ", want);
    }
  }
  CHECK(failures == 0);
}
#endif

// The f32 -> f16 cast of the GPU suite: what it expects is what the cast kernel's body gives.
TEST_CASE("the GPU suite's cast case expects the bits the cast kernel body computes") {
  herd_test::rng g(herd_test::gpu_cast::seed);
  const std::vector<float> in = herd_test::gpu_cast::inputs(g);
  std::vector<herd::half> out(in.size());
  emulate(7, [&](std::size_t t, std::size_t threads) {
    cast_thread<herd::half, float>({out.data(), in.data(), in.size(), herd_test::gpu_cast::scale}, t, threads);
  });
  std::size_t differ = 0;
  for (std::size_t i = 0; i < in.size(); ++i) differ += out[i].bits != herd_test::gpu_cast::expected(in[i]);
  CHECK(differ == 0);
}

// Every member of a bucket starts 16 bytes into alignment with the bucket, so that packing a
// gradient (at an aligned address, as every allocator gives) into it keeps the 16-byte vector
// path, however odd the sizes of the members before it.
TEST_CASE("bucket plans pad their members' offsets so that packing keeps the vector path") {
  herd_test::rng g(82);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::pair<std::size_t, herd::dtype>> shapes;
    for (int i = 0; i < 20; ++i) shapes.emplace_back(g.below(3) == 0 ? g.below(5) : g.below(700), herd::all_dtypes[g.below(8)]);
    const auto plan = herd::detail::bucket_plan::make(shapes, herd::detail::bucket_plan::reverse_order(shapes.size()),
                                                      256, 1024, herd::detail::member_alignment(herd::device::cuda(0)));
    for (const auto& b : plan.buckets) {
      const std::size_t es = herd::size_of(b.type);
      alignas(16) static std::byte bucket[16 * 1024];
      std::size_t end = 0;
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        INFO("round ", round, " member ", k, " of a ", herd::name(b.type), " bucket at offset ", b.offsets[k]);
        CHECK(steps_to_alignment(bucket + b.offsets[k] * es, es, 16) == 0);
        CHECK(b.offsets[k] >= end);  // members do not overlap
        end = b.offsets[k] + shapes[b.members[k]].first;
      }
      CHECK(b.count == end);
    }
  }
  // Packed by the batched copy body: a 3-element f32 gradient first, then a 1000-element one; the
  // second is moved by vector stores only (with an unpadded offset of 3 it would take none).
  alignas(16) float first[3] = {1, 2, 3};
  alignas(16) static float second[1000];
  for (std::size_t i = 0; i < 1000; ++i) second[i] = static_cast<float>(i);
  const std::vector<std::pair<std::size_t, herd::dtype>> shapes = {{1000, herd::dtype::f32}, {3, herd::dtype::f32}};
  const auto plan = herd::detail::bucket_plan::make(shapes, herd::detail::bucket_plan::reverse_order(2), 1 << 20, 1 << 20, 16);
  REQUIRE(plan.buckets.size() == 1);
  const auto& b = plan.buckets[0];
  alignas(16) static float packed[2048];
  const std::size_t at = b.offsets[plan.slot_of[0]];
  std::size_t element_path = 0;
  for (std::size_t i = 0; i < 1000; i += 4) element_path += steps_to_alignment(packed + at + i, 4, 16) != 0;
  CHECK(element_path == 0);
  const batch_entry entries[] = {{first, packed + b.offsets[plan.slot_of[1]], 3, 0}, {second, packed + at, 1000, 1}};
  const std::uint32_t owners[] = {0, 1};
  const batch_args args{entries, owners, 4096, 1.0};
  host_vector_loads() = {};
  for (std::size_t t = 0; t < 5; ++t) batch_thread<float, float>(args, 1, t, 5);  // the second gradient's block
  CHECK(host_vector_loads().wide_bytes == 4000);  // all of it in 16-byte vectors
  for (std::size_t t = 0; t < 5; ++t) batch_thread<float, float>(args, 0, t, 5);
  CHECK(std::equal(second, second + 1000, packed + at));
  CHECK(std::equal(first, first + 3, packed + b.offsets[plan.slot_of[1]]));
}

// The streams herd's packing stream waits for: the caller's always (the default stream too, which
// a non-blocking stream does not wait for by itself), and the followed one where it is another.
TEST_CASE("the device mover waits for the caller's stream, even when it is the default stream") {
  using herd::detail::upstreams_of;
  int a = 0, b = 0;
  int* const default_stream = nullptr;
  const auto alone = upstreams_of<int*>(default_stream, std::nullopt);  // an mpi_communicator on the default stream
  REQUIRE(alone.count == 1);
  CHECK(alone.stream[0] == default_stream);
  const auto same = upstreams_of<int*>(default_stream, std::optional<int*>(default_stream));
  REQUIRE(same.count == 1);
  CHECK(same.stream[0] == default_stream);
  const auto both = upstreams_of<int*>(&a, std::optional<int*>(&b));
  REQUIRE(both.count == 2);
  CHECK((both.stream[0] == &a && both.stream[1] == &b));
  const auto followed_is_caller = upstreams_of<int*>(&a, std::optional<int*>(&a));
  CHECK(followed_is_caller.count == 1);
  const auto followed_default = upstreams_of<int*>(&a, std::optional<int*>(default_stream));
  REQUIRE(followed_default.count == 2);
  CHECK(followed_default.stream[1] == default_stream);
}

// The byte copy of the batched pack moves the widest words both sides reach together: two f32
// tensors 4 bytes out of step go by 4-byte words, 8 apart by 8-byte ones; bytes only where the
// two are an odd distance apart.
TEST_CASE("the copy body moves the widest words both sides reach together") {
  alignas(16) static std::byte from[4096 + 32], to[4096 + 32];
  for (std::size_t i = 0; i < sizeof from; ++i) from[i] = static_cast<std::byte>(i * 37);
  for (std::size_t shift : {0u, 1u, 2u, 3u, 4u, 6u, 8u, 12u}) {
    for (std::size_t start : {0u, 3u, 4u}) {
      std::memset(to, 0, sizeof to);
      const std::size_t n = 4000;
      host_vector_loads() = {};
      emulate(5, [&](std::size_t t, std::size_t threads) { copy_thread({to + shift + start, from + start, n}, t, threads); });
      INFO("out ", shift, " bytes out of step, from byte ", start);
      CHECK(std::memcmp(to + shift + start, from + start, n) == 0);
      CHECK(std::all_of(to, to + shift + start, [](std::byte b) { return b == std::byte{0}; }));
      const std::size_t word = shift % 16 == 0 ? 16 : shift % 8 == 0 ? 8 : shift % 4 == 0 ? 4 : shift % 2 == 0 ? 2 : 1;
      // All but less than a word at either end goes by words (none when the sides are an odd distance apart).
      CHECK(host_vector_loads().bytes >= (word == 1 ? 0 : n - 2 * word));
      if (word == 1) CHECK(host_vector_loads().bytes == 0);
    }
  }
}
