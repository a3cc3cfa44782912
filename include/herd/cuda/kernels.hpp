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
// Each launcher checks its arguments, makes the stream's device current, sizes the grid from what
// that device holds resident at once, launches on the stream and checks the launch. The kernels
// are thin: the per-thread work is in detail/elementwise_body.hpp and detail/batched_body.hpp,
// which tests also run on the CPU.

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
#include <array>
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

// Blocks of `kernel` that `device` holds resident at once: its multiprocessors times what the
// kernel's registers and the block size let each of them hold (for herd's kernels 6 to 8 on
// sm_90, fewer for the wide f64/i64 reductions and the i8 ones). Asked once per kernel and device.
inline unsigned resident_blocks(const void* kernel, int device) {
  struct known {
    const void* kernel;
    int device;
    unsigned blocks;
  };
  thread_local std::vector<known> answers;
  for (const known& k : answers) {
    if (k.kernel == kernel && k.device == device) return k.blocks;
  }
  int per_multiprocessor = 0;
  HERD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, block_threads, 0));
  const unsigned blocks = static_cast<unsigned>(std::max(per_multiprocessor, 1) * multiprocessors(device));
  answers.push_back({kernel, device, blocks});
  return blocks;
}

// Blocks for `work` grid-stride items of `kernel` on `device` (current): one wave of every block
// the device holds at once, no more than the work needs.
template <class... Args> unsigned grid_blocks(void (*kernel)(Args...), std::size_t work, int device) {
  const std::size_t wanted = (work + block_threads - 1) / block_threads;
  const unsigned most = resident_blocks(reinterpret_cast<const void*>(kernel), device);
  return static_cast<unsigned>(std::clamp<std::size_t>(wanted, 1, most));
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

// The launchers are templates of an unused parameter so that a translation unit compiles the kernels
// (every dtype x op of them) only when it calls one: a file that includes herd and launches
// nothing compiles no device code.
template <class = void>
void reduce(dtype type, reduce_op op, void* out, const void* a, const void* b, std::size_t n, int avg_ranks,
                   cudaStream_t stream) {
  if (n == 0) return;
  if (!supports(type, op)) {
    herd::detail::raise({"cuda::reduce"}, "reduce_op::" + std::string(name(op)) + " is not defined on " + std::string(name(type)),
          "Check supports(dtype, reduce_op) first");
  }
  for (const void* p : {static_cast<const void*>(out), a, b}) require_element_aligned("cuda::reduce", p, type);
  const int device = device_of(stream);
  const device_guard on(device);
  visit(type, [&](auto element) {
    using T = decltype(element);
    const detail::reduce_args<T> args{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, avg_ranks};
    const std::size_t work = n / (16 / sizeof(T)) + 1;
    auto launch = [&](auto kernel) { kernel<<<grid_blocks(kernel, work, device), block_threads, 0, stream>>>(args); };
    switch (op) {
      case reduce_op::sum: return launch(kernels::reduce<T, reduce_op::sum>);
      case reduce_op::avg: return launch(kernels::reduce<T, reduce_op::avg>);
      case reduce_op::min: return launch(kernels::reduce<T, reduce_op::min>);
      case reduce_op::max: return launch(kernels::reduce<T, reduce_op::max>);
      case reduce_op::prod: return launch(kernels::reduce<T, reduce_op::prod>);
      default:
        if constexpr (std::is_integral_v<T>) {
          if (op == reduce_op::band) return launch(kernels::reduce<T, reduce_op::band>);
          if (op == reduce_op::bor) return launch(kernels::reduce<T, reduce_op::bor>);
          if (op == reduce_op::bxor) return launch(kernels::reduce<T, reduce_op::bxor>);
        }
    }
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// data = data / ranks: herd's avg of values summed elsewhere.
template <class = void> void finalize_avg(dtype type, void* data, std::size_t n, int ranks, cudaStream_t stream) {
  if (n == 0 || ranks == 1) return;
  require_element_aligned("cuda::finalize_avg", data, type);
  const int device = device_of(stream);  // the stream may be a communicator's, on another device than the current one
  const device_guard on(device);
  visit(type, [&](auto element) {
    using T = decltype(element);
    auto* kernel = kernels::finalize_avg<T>;
    kernel<<<grid_blocks(kernel, n, device), block_threads, 0, stream>>>(static_cast<T*>(data), n, ranks);
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// out = out_type(in * scale). Same dtype and scale 1 is a plain copy.
template <class = void>
void cast(void* out, dtype out_type, const void* in, dtype in_type, std::size_t n, double scale,
                 cudaStream_t stream) {
  if (n == 0) return;
  if (out_type == in_type && scale == 1.0) {
    if (out != in) HERD_CUDA_CHECK(cudaMemcpyAsync(out, in, n * size_of(in_type), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  require_element_aligned("cuda::cast", out, out_type);
  require_element_aligned("cuda::cast", in, in_type);
  const int device = device_of(stream);
  const device_guard on(device);
  visit_floating(out_type, "cuda::cast", [&](auto d) {
    visit_floating(in_type, "cuda::cast", [&](auto s) {
      using D = decltype(d);
      using S = decltype(s);
      const detail::cast_args<D, S> args{static_cast<D*>(out), static_cast<const S*>(in), n, scale};
      auto* kernel = kernels::cast<D, S>;
      kernel<<<grid_blocks(kernel, n / 4 + 1, device), block_threads, 0, stream>>>(args);
    });
  });
  HERD_CUDA_CHECK(cudaGetLastError());
}

// Packs many tensors into one buffer, or unpacks them, in one launch. The descriptor table goes
// to the device with each launch, from one of a few page-locked slots used in turn: the host
// rewrites a slot only once the launch that last read it is done, which by then it almost
// always is, so run() does not wait for the previous launch.
class batched_copy {
 public:
  struct item {
    const void* in;
    void* out;
    std::size_t count;  // elements
  };

  // Work per block: 16 elements per thread when casting, and 64 KiB (256 bytes a thread, four
  // 16-byte words in flight at a time) when copying bytes. Blocks of 4 KiB left an H100 at 0.4-0.6
  // of a device copy from 64 MiB: each block's table search and start cost more than its copy.
  static constexpr std::uint64_t elements_per_block = 4096;
  static constexpr std::uint64_t bytes_per_block = 65536;

  // out_type(in * scale) for every item; same dtype and scale 1 copies bytes.
  template <class = void> void run(std::span<const item> items, dtype out_type, dtype in_type, double scale, cudaStream_t stream) {
    if (items.empty()) return;
    const bool bytes = out_type == in_type && scale == 1.0;
    const std::uint64_t per_element = bytes ? size_of(in_type) : 1;
    const std::uint64_t per_block = bytes ? bytes_per_block : elements_per_block;
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
      blocks += detail::batch_blocks(count, per_block);
    }
    if (blocks == 0) return;
    if (blocks > 0x7fffffffu) herd::detail::raise({"cuda::batched_copy"}, "too many blocks", "Split the batch");
    const device_guard on(device_of(stream));
    slot& turn = slot_for(table, per_block, stream);
    const detail::batch_args args{turn.device_table, turn.device_owners, per_block, scale};
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
    turn.used->record(stream);
  }

 private:
  struct slot {
    device_buffer on_device;
    pinned_buffer on_host;
    std::optional<event> used;  // recorded after the launch that last read this slot
    std::vector<detail::batch_entry> table;  // what the slot holds on the device
    std::uint64_t per_block = 0;
    cudaStream_t stream = nullptr;           // where it was last read
    const detail::batch_entry* device_table = nullptr;
    const std::uint32_t* device_owners = nullptr;  // each block's entry, after the table
  };

  // A slot holding `table` (and each block's entry) on the device. A training loop packs the same
  // tensors every step, so a slot that already holds this table and was last read on this stream
  // is used again as it is (sending it again cost as long as packing 30 MB on an H100). Otherwise
  // the next slot in turn gets it: its page-locked copy is rewritten once the launch that last
  // read it is done, which by then it almost always is, and sent on the stream.
  slot& slot_for(const std::vector<detail::batch_entry>& table, std::uint64_t per_block, cudaStream_t stream) {
    const std::size_t bytes = table.size() * sizeof(detail::batch_entry);
    for (slot& s : slots_) {
      if (s.device_table != nullptr && s.stream == stream && s.per_block == per_block && s.table.size() == table.size() &&
          std::memcmp(s.table.data(), table.data(), bytes) == 0) {
        return s;
      }
    }
    slot& s = slots_[next_];
    next_ = (next_ + 1) % slots_.size();
    if (s.used) {
      s.used->synchronize();
    } else {
      s.used.emplace();
    }
    const std::vector<std::uint32_t> owners = detail::batch_block_entries(table, per_block);
    const std::size_t owner_bytes = owners.size() * sizeof(std::uint32_t);
    auto* staging = static_cast<std::byte*>(s.on_host.get(bytes + owner_bytes));
    std::memcpy(staging, table.data(), bytes);
    std::memcpy(staging + bytes, owners.data(), owner_bytes);
    auto* on_device = static_cast<std::byte*>(s.on_device.get(bytes + owner_bytes));
    HERD_CUDA_CHECK(cudaMemcpyAsync(on_device, staging, bytes + owner_bytes, cudaMemcpyHostToDevice, stream));
    s.table = table;
    s.per_block = per_block;
    s.stream = stream;
    s.device_table = reinterpret_cast<const detail::batch_entry*>(on_device);
    s.device_owners = reinterpret_cast<const std::uint32_t*>(on_device + bytes);
    return s;
  }

  std::array<slot, 4> slots_;
  std::size_t next_ = 0;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::cuda
#endif

#endif  // HERD_CUDA_KERNELS_HPP
