#ifndef HERD_OPTIM_DETAIL_GRADIENT_MOVERS_HPP
#define HERD_OPTIM_DETAIL_GRADIENT_MOVERS_HPP
// Where the distributed optimizer packs gradients into fusion buffers, casts them for
// compression, and accumulates them across backward passes:
// - host_mover: loops over host memory;
// - device_mover: for GPU gradients, herd's kernels on a stream of herd's own (under nvcc), or,
//   in a host-compiled file linking herd::nccl, the kernels a tensor library linked into the
//   program lends (libtorch's, through herd/torch/: see lent_device_arithmetic), else
//   plain device-to-device copies, which cover fusion without compression, predivision or
//   accumulation.
// Both take the same calls, so the reducer's bucketing is written once; mover_set picks one.

#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/cuda/kernels.hpp>
#include <herd/cuda/runtime.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <cstring>
#include <string>
#include <span>
#include <utility>
#include <vector>

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN

struct move_item {
  const void* in;
  void* out;
  std::size_t count;
};

class host_mover {
 public:
  void begin() {}
  void finish() {}
  buffer_view fusion(dtype type, std::size_t count) {
    fusion_.reserve(type, count);
    return fusion_.view();
  }
  // out_type(in * scale) for every item.
  void move(std::span<const move_item> items, dtype out_type, dtype in_type, double scale) {
    for (const move_item& it : items) host_cast(it.out, out_type, it.in, in_type, it.count, scale);
  }
  buffer_view accumulator(std::size_t index, dtype type, std::size_t count) {
    if (accumulators_.size() <= index) accumulators_.resize(index + 1);
    accumulators_[index].reserve(type, count);
    return accumulators_[index].view();
  }
  void accumulate(const buffer_view& acc, const buffer_view& grad, bool first) {
    host_accumulate(acc.data, acc.type, grad.data, grad.type, grad.count, first);
  }
  // grad = acc + grad
  void fold(const buffer_view& grad, const buffer_view& acc) {
    host_fold(grad.data, grad.type, acc.data, acc.type, grad.count);
  }
  // The storage of bucket `index` (kept between steps: a bucket's operation may still read it).
  buffer_view bucket(std::size_t index, dtype type, std::size_t count) {
    if (buckets_.size() <= index) buckets_.resize(index + 1);
    buckets_[index].reserve(type, count);
    return buckets_[index].view();
  }
  void zero(const buffer_view& v) {
    if (v.count != 0) std::memset(v.data, 0, v.bytes());
  }

 private:
  host_tensor fusion_;
  std::vector<host_tensor> accumulators_;
  std::vector<host_tensor> buckets_;
};

// The streams whose queued work herd's stream must wait for before it packs gradients: always
// the caller's, even the default stream (0), which a non-blocking stream does not wait for by
// itself; and the followed one (a communicator's stream) when there is one and it is another.
template <class Stream> struct upstream_set {
  Stream stream[2];
  std::size_t count = 0;
};
template <class Stream> upstream_set<Stream> upstreams_of(Stream caller, const std::optional<Stream>& followed) {
  upstream_set<Stream> set;
  set.stream[set.count++] = caller;
  if (followed && *followed != caller) set.stream[set.count++] = *followed;
  return set;
}

#if !HERD_WITH_CUDA_KERNELS && defined(HERD_WITH_NCCL)
// GPU arithmetic that a file compiled by a host compiler cannot have from herd (its kernels need
// nvcc) but can borrow from a tensor library that brings its own: casting and scaling gradients
// into and out of fusion buffers, and summing the passes of backward_passes_per_step. Each call
// runs after the work queued on `stream` (herd's) so far, and the work queued there after it
// waits for it; where the lender computes is its own business (libtorch: its current stream).
struct lent_device_arithmetic {
  // out_type(in * scale) for every item.
  void (*move)(int device, cudaStream_t stream, std::span<const move_item> items, dtype out_type, dtype in_type,
               double scale);
  // acc = grad (first) or acc + grad, in acc's type.
  void (*accumulate)(int device, cudaStream_t stream, const buffer_view& acc, const buffer_view& grad, bool first);
  // grad = grad + acc, summed in acc's type.
  void (*fold)(int device, cudaStream_t stream, const buffer_view& grad, const buffer_view& acc);
};

// The lender, if any: set once, before main, by the header of the library that lends.
inline const lent_device_arithmetic*& device_arithmetic_lender() noexcept {
  static const lent_device_arithmetic* lent = nullptr;
  return lent;
}
#endif

#if HERD_WITH_CUDA_KERNELS || defined(HERD_WITH_NCCL)
class device_mover {
 public:
  explicit device_mover(int device) : device_(device) {}

  // The communicator's stream, when it has one: packing waits for it too (it may be the stream
  // the caller's framework computes the gradients on).
  void follow(cudaStream_t stream) noexcept { followed_ = stream; }

  // Orders herd's stream, by events, after the caller's stream (cuda::current_stream()) and the
  // followed one, which produced the gradients.
  void begin() {
    const cuda::device_guard on(device_);
    if (!stream_) {
      stream_.emplace();
      ready_.emplace();
    }
    const upstream_set<cudaStream_t> upstreams = upstreams_of(cuda::current_stream(), followed_);
    for (std::size_t k = 0; k < upstreams.count; ++k) {
      ready_->record(upstreams.stream[k]);  // the wait takes the event as recorded now: it may be reused
      HERD_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), ready_->get(), 0));
    }
  }
  void finish() { stream_->synchronize(); }

  buffer_view fusion(dtype type, std::size_t count) {
    const cuda::device_guard on(device_);
    return {fusion_.get(count * size_of(type)), count, type, device::cuda(device_)};
  }

  template <class = void>  // templates, as the kernels' launchers: compiled only where called
  void move(std::span<const move_item> items, dtype out_type, dtype in_type, double scale) {
    const cuda::device_guard on(device_);
#if HERD_WITH_CUDA_KERNELS
    batch_.clear();
    for (const move_item& it : items) batch_.push_back({it.in, it.out, it.count});
    copier_.run(batch_, out_type, in_type, scale, stream_->get());
#else
    if (const lent_device_arithmetic* lent = device_arithmetic_lender()) {
      return lent->move(device_, stream_->get(), items, out_type, in_type, scale);
    }
    if (out_type != in_type || scale != 1.0) needs_kernels("compression or gradient predivision");
    for (const move_item& it : items) {
      HERD_CUDA_CHECK(cudaMemcpyAsync(it.out, it.in, it.count * size_of(in_type), cudaMemcpyDeviceToDevice, stream_->get()));
    }
#endif
  }

  buffer_view accumulator(std::size_t index, dtype type, std::size_t count) {
    const cuda::device_guard on(device_);
    while (accumulators_.size() <= index) accumulators_.emplace_back(std::make_unique<cuda::device_buffer>());
    return {accumulators_[index]->get(count * size_of(type)), count, type, device::cuda(device_)};
  }

  template <class = void>
  void accumulate(const buffer_view& acc, const buffer_view& grad, bool first) {
#if HERD_WITH_CUDA_KERNELS
    const cuda::device_guard on(device_);
    if (first) return cuda::cast(acc.data, acc.type, grad.data, grad.type, grad.count, 1.0, stream_->get());
    void* widened = scratch_.get(grad.count * size_of(acc.type));
    cuda::cast(widened, acc.type, grad.data, grad.type, grad.count, 1.0, stream_->get());
    cuda::reduce(acc.type, reduce_op::sum, acc.data, acc.data, widened, grad.count, 0, stream_->get());
#else
    if (const lent_device_arithmetic* lent = device_arithmetic_lender()) {
      return lent->accumulate(device_, stream_->get(), acc, grad, first);
    }
    (void)acc, (void)grad, (void)first;
    needs_kernels("gradient accumulation (backward_passes_per_step > 1)");
#endif
  }

  template <class = void>
  void fold(const buffer_view& grad, const buffer_view& acc) {
#if HERD_WITH_CUDA_KERNELS
    const cuda::device_guard on(device_);
    void* sum = scratch_.get(grad.count * size_of(acc.type));
    cuda::cast(sum, acc.type, grad.data, grad.type, grad.count, 1.0, stream_->get());
    cuda::reduce(acc.type, reduce_op::sum, sum, acc.data, sum, grad.count, 0, stream_->get());
    cuda::cast(grad.data, grad.type, sum, acc.type, grad.count, 1.0, stream_->get());
#else
    if (const lent_device_arithmetic* lent = device_arithmetic_lender()) return lent->fold(device_, stream_->get(), grad, acc);
    (void)grad, (void)acc;
    needs_kernels("gradient accumulation (backward_passes_per_step > 1)");
#endif
  }

  buffer_view bucket(std::size_t index, dtype type, std::size_t count) {
    const cuda::device_guard on(device_);
    while (buckets_.size() <= index) buckets_.emplace_back(std::make_unique<cuda::device_buffer>());
    return {buckets_[index]->get(count * size_of(type)), count, type, device::cuda(device_)};
  }

  void zero(const buffer_view& v) {
    const cuda::device_guard on(device_);
    if (v.count != 0) HERD_CUDA_CHECK(cudaMemsetAsync(v.data, 0, v.bytes(), stream_->get()));
  }

 private:
  [[noreturn]] static void needs_kernels(const char* what) {
    raise({"distributed_optimizer"}, std::string(what) + " on GPU gradients needs herd's CUDA kernels",
          "Compile the file that steps the optimizer with nvcc, reduce libtorch tensors through herd/torch/ "
          "(torch_gradients, DistributedDataParallel), which lends libtorch's kernels, or turn the option off");
  }

  int device_;
  std::optional<cudaStream_t> followed_;
  std::optional<cuda::stream> stream_;
  std::optional<cuda::event> ready_;
  cuda::device_buffer fusion_;
  cuda::device_buffer scratch_;
  std::vector<std::unique_ptr<cuda::device_buffer>> accumulators_;
  std::vector<std::unique_ptr<cuda::device_buffer>> buckets_;
#if HERD_WITH_CUDA_KERNELS
  cuda::batched_copy copier_;
  std::vector<cuda::batched_copy::item> batch_;
#endif
};
#endif

// The mover for where a list of gradients lives (the host's, or one per GPU, made on first use),
// kept between steps with the storage it holds.
class mover_set {
 public:
  // Calls f with the mover for `grads` (the host's when there are none).
  template <class C, class F> void with([[maybe_unused]] C& comm, [[maybe_unused]] const std::vector<buffer_view>& grads, F&& f) {
#if HERD_WITH_CUDA_KERNELS || defined(HERD_WITH_NCCL)
    if (!grads.empty() && grads[0].device.is_cuda()) {
      if (!device_ || device_index_ != grads[0].device.index) {
        device_.emplace(grads[0].device.index);
        device_index_ = grads[0].device.index;
        if constexpr (requires { comm.stream(); }) device_->follow(comm.stream());
      }
      return f(*device_);
    }
#endif
    f(host_);
  }

  // Calls f with the mover for gradients on `where`.
  template <class C, class F> void with_device(C& comm, device where, F&& f) {
    std::vector<buffer_view> at;
    if (where.is_cuda()) at.push_back({nullptr, 0, dtype::f32, where});
    with(comm, at, std::forward<F>(f));
  }

 private:
  host_mover host_;
#if HERD_WITH_CUDA_KERNELS || defined(HERD_WITH_NCCL)
  std::optional<device_mover> device_;
  int device_index_ = -1;
#endif
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_GRADIENT_MOVERS_HPP
