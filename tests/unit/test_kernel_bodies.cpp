// herd's CUDA kernels, run on the CPU: every kernel body is a function of (thread, thread
// count) or (block, thread), so running it for every position of an emulated grid computes what
// the GPU computes. Checked against the host reference for every dtype x op pair, with odd sizes,
// misaligned and mutually misaligned pointers, and grids smaller and larger than the work.
// The same file is compiled by nvcc into cuda_host_tests when CUDA is enabled.

#include <herd/collectives/detail/host_reduce.hpp>
#include <herd/cuda/detail/batched_body.hpp>
#include <herd/cuda/detail/elementwise_body.hpp>
#include <herd/optim/detail/host_ops.hpp>

#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstring>
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

const std::size_t sizes[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 64, 100, 1000, 4097};
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
        for (std::size_t n : sizes) {
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

// Pointers that share a misalignment within an element never reach a 16-byte boundary together
// (a GPU refuses such pointers at launch; the bodies must still never issue a misaligned vector
// access, which the emulated loads and stores would report). Sizes above a vector's elements.
TEST_CASE("kernel bodies on pointers misaligned within an element take no misaligned vector access") {
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
            for (std::size_t n : sizes) {
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
    const batch_args pack_args{pack.data(), static_cast<std::uint32_t>(pack.size()), per_block, scale};
    const batch_args unpack_args{unpack.data(), static_cast<std::uint32_t>(unpack.size()), per_block, 1.0 / scale};
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
