#ifndef HERD_NN_SYNC_BATCH_NORM_HPP
#define HERD_NN_SYNC_BATCH_NORM_HPP
// Synchronized batch normalization (PyTorch's SyncBatchNorm): the batch statistics of every rank's
// batch together, as if one rank normalized the whole global batch.
//
// For any tensor library, the two exchanges it needs, each one allreduce of f64 values:
//
//   herd::batch_moments m = herd::sync_batch_moments(sum, sum_sq, count, comm);
//       forward: this rank's per-channel sums of x and x^2 over `count` elements per channel ->
//       the global per-channel mean and (biased) variance, and the global count
//   herd::sync_batch_norm_sums(sum_dy, sum_dy_xhat, comm);
//       backward: this rank's per-channel sums of dy and dy * xhat -> the global sums, in place
//
// and herd::sync_batch_norm, a layer for f32 host data laid out N x C x S (S: the spatial
// elements of a channel, 1 for N x C), built on them. Its weight and bias gradients are this
// rank's contributions, as any layer's: the distributed optimizer reduces them with the others.
// Running statistics follow BatchNorm's: momentum 0.1, the unbiased variance.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace herd {

struct batch_moments {
  std::vector<double> mean;
  std::vector<double> var;  // biased: what normalization divides by
  double count = 0;         // elements per channel over every rank
};

struct sync_batch_norm_options {
  double eps = 1e-5;
  double momentum = 0.1;
};

HERD_CONFIG_NAMESPACE_BEGIN

// A rank whose sums do not pair up says so in the allreduce's agreement: every rank raises it,
// rather than the others waiting there for a rank that raised alone.
template <communicator C>
batch_moments sync_batch_moments(std::span<const double> sum, std::span<const double> sum_sq, double count, C& comm) {
  detail::call_check check(detail::op_kind::allreduce, comm.rank(), comm.size());
  if (sum.size() != sum_sq.size()) {
    check.fail(7, "sync_batch_moments: " + std::to_string(sum.size()) + " channel sums but " + std::to_string(sum_sq.size()) +
                      " sums of squares",
               "Pass one sum and one sum of squares per channel");
  }
  const std::size_t c = check.ok() ? sum.size() : 0;
  std::vector<double> fused(2 * c + 1);  // sums, sums of squares, count: one allreduce
  std::copy_n(sum.begin(), c, fused.begin());
  std::copy_n(sum_sq.begin(), c, fused.begin() + static_cast<std::ptrdiff_t>(c));
  fused[2 * c] = count;
  detail::allreduce_checked(std::move(check), buffer_view{fused.data(), fused.size(), dtype::f64, device::cpu()}, comm,
                            reduce_op::sum);
  batch_moments m;
  m.count = fused[2 * c];
  if (m.count < 2) {
    detail::raise({"sync_batch_moments", comm.rank(), comm.size()},
                  "the global batch has " + std::to_string(static_cast<long long>(m.count)) + " value(s) per channel",
                  "Batch normalization in training needs more than one value per channel over all ranks");
  }
  m.mean.resize(c);
  m.var.resize(c);
  for (std::size_t i = 0; i < c; ++i) {
    m.mean[i] = fused[i] / m.count;
    m.var[i] = std::max(0.0, fused[c + i] / m.count - m.mean[i] * m.mean[i]);
  }
  return m;
}

template <communicator C> void sync_batch_norm_sums(std::span<double> sum_dy, std::span<double> sum_dy_xhat, C& comm) {
  const std::size_t c = sum_dy.size();
  std::vector<double> fused(sum_dy.begin(), sum_dy.end());
  fused.insert(fused.end(), sum_dy_xhat.begin(), sum_dy_xhat.end());
  allreduce(fused, comm);
  std::copy(fused.begin(), fused.begin() + static_cast<std::ptrdiff_t>(c), sum_dy.begin());
  std::copy(fused.begin() + static_cast<std::ptrdiff_t>(c), fused.end(), sum_dy_xhat.begin());
}

// A synchronized BatchNorm layer for f32 host data N x C x S. forward() in training normalizes
// with the global statistics and keeps what backward() needs; evaluate() uses the running ones.
// (In the configuration namespace with the collectives its members call.)
class sync_batch_norm {
 public:
  explicit sync_batch_norm(std::size_t channels, sync_batch_norm_options options = {});

  std::vector<float> weight, bias, running_mean, running_var;
  std::vector<float> grad_weight, grad_bias;  // this rank's, from the last backward()

  template <communicator C> void forward(const float* x, float* y, std::size_t n, std::size_t spatial, C& comm) {
    const std::size_t c = channels_;
    std::vector<double> sum(c, 0.0), sum_sq(c, 0.0);
    for_each(n, spatial, [&](std::size_t ch, std::size_t at) {
      sum[ch] += x[at];
      sum_sq[ch] += static_cast<double>(x[at]) * x[at];
    });
    const batch_moments m = sync_batch_moments(sum, sum_sq, static_cast<double>(n * spatial), comm);
    n_ = n;
    spatial_ = spatial;
    count_ = m.count;
    xhat_.resize(n * c * spatial);
    invstd_.resize(c);
    for (std::size_t ch = 0; ch < c; ++ch) {
      invstd_[ch] = 1.0 / std::sqrt(m.var[ch] + options_.eps);
      const double unbiased = m.var[ch] * m.count / (m.count - 1);
      running_mean[ch] = static_cast<float>((1 - options_.momentum) * running_mean[ch] + options_.momentum * m.mean[ch]);
      running_var[ch] = static_cast<float>((1 - options_.momentum) * running_var[ch] + options_.momentum * unbiased);
    }
    for_each(n, spatial, [&](std::size_t ch, std::size_t at) {
      const double h = (x[at] - m.mean[ch]) * invstd_[ch];
      xhat_[at] = static_cast<float>(h);
      y[at] = static_cast<float>(weight[ch] * h + bias[ch]);
    });
  }

  // Inference: the running statistics, no communication.
  void evaluate(const float* x, float* y, std::size_t n, std::size_t spatial) const;

  // dx from dy, with the global sums of dy and dy * xhat; grad_weight and grad_bias: this rank's.
  template <communicator C> void backward(const float* dy, float* dx, C& comm) {
    const std::size_t c = channels_;
    std::vector<double> sum_dy(c, 0.0), sum_dy_xhat(c, 0.0);
    for_each(n_, spatial_, [&](std::size_t ch, std::size_t at) {
      sum_dy[ch] += dy[at];
      sum_dy_xhat[ch] += static_cast<double>(dy[at]) * xhat_[at];
    });
    for (std::size_t ch = 0; ch < c; ++ch) {
      grad_bias[ch] = static_cast<float>(sum_dy[ch]);
      grad_weight[ch] = static_cast<float>(sum_dy_xhat[ch]);
    }
    sync_batch_norm_sums(sum_dy, sum_dy_xhat, comm);
    for_each(n_, spatial_, [&](std::size_t ch, std::size_t at) {
      const double mean_dy = sum_dy[ch] / count_, mean_dy_xhat = sum_dy_xhat[ch] / count_;
      dx[at] = static_cast<float>(weight[ch] * invstd_[ch] * (dy[at] - mean_dy - xhat_[at] * mean_dy_xhat));
    });
  }

  std::size_t channels() const noexcept { return channels_; }

 private:
  // f(channel, index) for every element of an N x C x S batch.
  template <class F> void for_each(std::size_t n, std::size_t spatial, F&& f) const {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t ch = 0; ch < channels_; ++ch)
        for (std::size_t s = 0; s < spatial; ++s) f(ch, (i * channels_ + ch) * spatial + s);
  }

  sync_batch_norm_options options_;
  std::size_t channels_;
  std::size_t n_ = 0, spatial_ = 0;
  double count_ = 0;
  std::vector<float> xhat_;
  std::vector<double> invstd_;
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE sync_batch_norm::sync_batch_norm(std::size_t channels, sync_batch_norm_options options)
    : weight(channels, 1.0f), bias(channels, 0.0f), running_mean(channels, 0.0f), running_var(channels, 1.0f),
      grad_weight(channels, 0.0f), grad_bias(channels, 0.0f), options_(options), channels_(channels) {}

HERD_SEPARATE void sync_batch_norm::evaluate(const float* x, float* y, std::size_t n, std::size_t spatial) const {
  for_each(n, spatial, [&](std::size_t ch, std::size_t at) {
    const double h = (x[at] - running_mean[ch]) / std::sqrt(static_cast<double>(running_var[ch]) + options_.eps);
    y[at] = static_cast<float>(weight[ch] * h + bias[ch]);
  });
}

#endif  // HERD_SEPARATE_DEFINITIONS

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_NN_SYNC_BATCH_NORM_HPP
