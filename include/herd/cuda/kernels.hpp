#ifndef HERD_CUDA_KERNELS_HPP
#define HERD_CUDA_KERNELS_HPP
// herd's CUDA kernels and their launchers, compiled in the user's translation unit by nvcc:
//
//   herd::cuda::reduce(type, op, out, a, b, n, avg_ranks, stream)   out = a ∘ b (÷ avg_ranks)
//   herd::cuda::cast(out, out_type, in, in_type, n, scale, stream)  casts f32/f64 <-> f16/bf16, scales
//   herd::cuda::finalize_avg(type, data, n, ranks, stream)          data / ranks, herd's avg
//   herd::cuda::batched_copy::run(items, out_type, in_type, scale, stream)
//       many tensors into or out of one fusion buffer in one launch, cast and scaled
//
// Each launcher checks its arguments, sizes the grid from the device's multiprocessor count,
// launches on the given stream and checks the launch. The kernels are thin: the per-thread work
// is in detail/elementwise_body.hpp and detail/batched_body.hpp, which tests also run on the CPU.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/cuda/detail/batched_body.hpp>
#include <herd/cuda/detail/elementwise_body.hpp>
#include <herd/cuda/runtime.hpp>

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace herd::cuda {
HERD_CONFIG_NAMESPACE_BEGIN

namespace kernels {

template <class T, reduce_op Op> __global__ void reduce(detail::reduce_args<T> p) {
  detail::reduce_thread<T, Op>(p, blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                               static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

template <class D, class S> __global__ void cast(detail::cast_args<D, S> p) {
  detail::cast_thread<D, S>(p, blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                            static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

template <class T> __global__ void finalize_avg(T* data, std::size_t n, int ranks) {
  detail::finalize_avg_thread<T>(data, n, ranks, blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x,
                                 static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

template <class D, class S> __global__ void batch(detail::batch_args a) {
  detail::batch_thread<D, S>(a, blockIdx.x, threadIdx.x, blockDim.x);
}

}  // namespace kernels

inline constexpr unsigned block_threads = 256;

// Blocks for `work` grid-stride items: enough to fill every multiprocessor several times over,
// no more than the work needs.
inline unsigned grid_blocks(std::size_t work) {
  static thread_local int cached_device = -1;
  static thread_local int cached_sms = 0;
  int device = 0;
  HERD_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    cached_sms = multiprocessors(device);
    cached_device = device;
  }
  const std::size_t wanted = (work + block_threads - 1) / block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, static_cast<std::size_t>(cached_sms) * 8));
}

// Calls fn(F{}) with the float type of t (f16, bf16, f32 or f64).
template <class Fn> void visit_floating(dtype t, const char* operation, Fn&& fn) {
  switch (t) {
    case dtype::f16: return fn(half{});
    case dtype::bf16: return fn(bfloat16{});
    case dtype::f32: return fn(float{});
    case dtype::f64: return fn(double{});
    default:
      herd::detail::raise({operation}, "dtype " + std::string(name(t)) + " cannot be cast or scaled on the device",
            "Casts and scaling take f16, bf16, f32 and f64; integers are copied as they are");
  }
}

// A GPU loads an element only from a multiple of its size (any other address faults with
// cudaErrorMisalignedAddress), so a tensor that is not at one is refused before the launch.
inline void require_element_aligned(const char* operation, const void* p, dtype type) {
  if (detail::address(p) % size_of(type) == 0) return;
  herd::detail::raise({operation},
                      "a " + std::string(name(type)) + " tensor at address " + std::to_string(detail::address(p)) +
                          " is not aligned to its " + std::to_string(size_of(type)) + "-byte elements",
                      "Pass tensors whose data starts at a multiple of the element size (cudaMalloc'ed memory "
                      "and every framework's tensors do)");
}

inline void reduce(dtype type, reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg_ranks,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (!supports(type, op)) {
    herd::detail::raise({"cuda::reduce"}, "reduce_op::" + std::string(name(op)) + " is not defined on " + std::string(name(type)),
          "Check supports(dtype, reduce_op) first");
  }
  for (const void* p : {static_cast<const void*>(out), a, b}) require_element_aligned("cuda::reduce", p, type);
  visit(type, [&](auto element) {
    using T = decltype(element);
    const detail::reduce_args<T> args{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, avg_ranks};
    const unsigned blocks = grid_blocks(n / (16 / sizeof(T)) + 1);
    switch (op) {
      case reduce_op::sum: kernels::reduce<T, reduce_op::sum><<<blocks, block_threads, 0, stream>>>(args); break;
      case reduce_op::avg: kernels::reduce<T, reduce_op::avg><<<blocks, block_threads, 0, stream>>>(args); break;
      case reduce_op::min: kernels::reduce<T, reduce_op::min><<<blocks, block_threads, 0, stream>>>(args); break;
      case reduce_op::max: kernels::reduce<T, reduce_op::max><<<blocks, block_threads, 0, stream>>>(args); break;
      case reduce_op::prod: kernels::reduce<T, reduce_op::prod><<<blocks, block_threads, 0, stream>>>(args); break;
      default:
        if constexpr (std::is_integral_v<T>) {
          if (op == reduce_op::band) kernels::reduce<T, reduce_op::band><<<blocks, block_threads, 0, stream>>>(args);
          if (op == reduce_op::bor) kernels::reduce<T, reduce_op::bor><<<blocks, block_threads, 0, stream>>>(args);
          if (op == reduce_op::bxor) kernels::reduce<T, reduce_op::bxor><<<blocks, block_threads, 0, stream>>>(args);
        }
    }
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// data = data / ranks: herd's avg of values summed elsewhere.
inline void finalize_avg(dtype type, void* data, std::size_t n, int ranks, cudaStream_t stream) {
  if (n == 0 || ranks == 1) return;
  require_element_aligned("cuda::finalize_avg", data, type);
  visit(type, [&](auto element) {
    using T = decltype(element);
    kernels::finalize_avg<T><<<grid_blocks(n), block_threads, 0, stream>>>(static_cast<T*>(data), n, ranks);
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// out = out_type(in * scale). Same dtype and scale 1 is a plain copy.
inline void cast(void* out, dtype out_type, const void* in, dtype in_type, std::size_t n, double scale,
                 cudaStream_t stream) {
  if (n == 0) return;
  if (out_type == in_type && scale == 1.0) {
    if (out != in) HERD_CUDA_CHECK(cudaMemcpyAsync(out, in, n * size_of(in_type), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  require_element_aligned("cuda::cast", out, out_type);
  require_element_aligned("cuda::cast", in, in_type);
  visit_floating(out_type, "cuda::cast", [&](auto d) {
    visit_floating(in_type, "cuda::cast", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      const detail::cast_args<D, S> args{static_cast<D*>(out), static_cast<const S*>(in), n, scale};
      kernels::cast<D, S><<<grid_blocks(n / 4 + 1), block_threads, 0, stream>>>(args);
    });
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// Packs many tensors into one buffer, or unpacks them, in one launch. The descriptor table goes
// to the device with each launch.
class batched_copy {
 public:
  struct item {
    const void* in;
    void* out;
    std::size_t count;  // elements
  };

  static constexpr std::uint64_t elements_per_block = 4096;

  // out_type(in * scale) for every item; same dtype and scale 1 copies bytes.
  void run(std::span<const item> items, dtype out_type, dtype in_type, double scale, cudaStream_t stream) {
    if (items.empty()) return;
    const bool bytes = out_type == in_type && scale == 1.0;
    const std::uint64_t per_element = bytes ? size_of(in_type) : 1;
    std::vector<detail::batch_entry> table;
    table.reserve(items.size());
    std::uint64_t blocks = 0;
    for (const item& it : items) {
      if (!bytes && it.count != 0) {
        require_element_aligned("cuda::batched_copy", it.in, in_type);
        require_element_aligned("cuda::batched_copy", it.out, out_type);
      }
      const std::uint64_t count = it.count * per_element;
      table.push_back({it.in, it.out, count, blocks});
      blocks += detail::batch_blocks(count, elements_per_block);
    }
    if (blocks == 0) return;
    upload(table, stream);
    const detail::batch_args args{static_cast<const detail::batch_entry*>(device_table_.get(0)),
                                  static_cast<std::uint32_t>(table.size()), elements_per_block, scale};
    if (blocks > 0x7fffffffu) herd::detail::raise({"cuda::batched_copy"}, "too many blocks", "Split the batch");
    const auto grid = static_cast<unsigned>(blocks);
    if (bytes) {
      kernels::batch<std::uint8_t, std::uint8_t><<<grid, block_threads, 0, stream>>>(args);
    } else {
      visit_floating(out_type, "cuda::batched_copy", [&](auto d) {
        visit_floating(in_type, "cuda::batched_copy", [&](auto s) {
          kernels::batch<decltype(d), decltype(s)><<<grid, block_threads, 0, stream>>>(args);
        });
      });
    }
    HERD_CUDA_CHECK(cudaGetLastError());
    used_->record(stream);
  }

 private:
  // The table goes through page-locked memory; the previous launch (on whichever stream) must be
  // done with both copies of it before they are rewritten.
  void upload(const std::vector<detail::batch_entry>& table, cudaStream_t stream) {
    const std::size_t bytes = table.size() * sizeof(detail::batch_entry);
    if (used_) {
      used_->synchronize();
    } else {
      used_.emplace();
    }
    void* staging = pinned_table_.get(bytes);
    std::memcpy(staging, table.data(), bytes);
    HERD_CUDA_CHECK(cudaMemcpyAsync(device_table_.get(bytes), staging, bytes, cudaMemcpyHostToDevice, stream));
  }

  device_buffer device_table_;
  pinned_buffer pinned_table_;
  std::optional<event> used_;  // recorded after each launch
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::cuda
#endif

#endif  // HERD_CUDA_KERNELS_HPP
