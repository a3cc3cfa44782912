#pragma once
// A small fp32 MLP (in -> hidden, tanh -> out) with mean-squared-error loss, written with plain
// loops, and a seeded synthetic regression dataset: enough of a model to check that distributed
// training computes what one rank with the combined batch computes.

#include <herd/tensor/buffer_view.hpp>

#include "reference.hpp"

#include <cmath>
#include <cstddef>
#include <vector>

namespace herd_test {

struct regression_data {
  std::size_t inputs;
  std::size_t outputs;
  std::vector<float> x;  // samples x inputs
  std::vector<float> y;  // samples x outputs

  regression_data(std::size_t samples, std::size_t in, std::size_t out, std::uint64_t seed) : inputs(in), outputs(out) {
    rng g(seed);
    x.resize(samples * in);
    y.resize(samples * out);
    for (auto& v : x) v = static_cast<float>(g.unit() * 2 - 1);
    for (std::size_t s = 0; s < samples; ++s) {
      float sum = 0;
      for (std::size_t i = 0; i < in; ++i) sum += x[s * in + i] * static_cast<float>(i % 3 + 1);
      for (std::size_t o = 0; o < out; ++o) y[s * out + o] = std::sin(sum + static_cast<float>(o));
    }
  }
};

struct tiny_mlp {
  std::size_t in, hidden, out;
  std::vector<float> w1, b1, w2, b2;
  std::vector<float> gw1, gb1, gw2, gb2;

  tiny_mlp(std::size_t in_, std::size_t hidden_, std::size_t out_, std::uint64_t seed)
      : in(in_), hidden(hidden_), out(out_), w1(in * hidden), b1(hidden), w2(hidden * out), b2(out),
        gw1(w1.size()), gb1(b1.size()), gw2(w2.size()), gb2(b2.size()) {
    rng g(seed);
    const double s1 = 1.0 / std::sqrt(static_cast<double>(in));
    const double s2 = 1.0 / std::sqrt(static_cast<double>(hidden));
    for (auto& v : w1) v = static_cast<float>((g.unit() * 2 - 1) * s1);
    for (auto& v : b1) v = static_cast<float>((g.unit() * 2 - 1) * 0.1);
    for (auto& v : w2) v = static_cast<float>((g.unit() * 2 - 1) * s2);
    for (auto& v : b2) v = static_cast<float>((g.unit() * 2 - 1) * 0.1);
  }

  std::vector<herd::buffer_view> params() { return herd::views(w1, b1, w2, b2); }
  std::vector<herd::buffer_view> grads() { return herd::views(gw1, gb1, gw2, gb2); }

  // Overwrites the gradients with those of the mean loss over samples [begin, end); returns the loss.
  float forward_backward(const regression_data& d, std::size_t begin, std::size_t end) {
    for (auto* g : {&gw1, &gb1, &gw2, &gb2}) std::fill(g->begin(), g->end(), 0.0f);
    const auto n = static_cast<float>(end - begin);
    std::vector<float> h(hidden), o(out), dh(hidden);
    float loss = 0;
    for (std::size_t s = begin; s < end; ++s) {
      const float* x = &d.x[s * in];
      const float* y = &d.y[s * out];
      for (std::size_t j = 0; j < hidden; ++j) {
        float a = b1[j];
        for (std::size_t i = 0; i < in; ++i) a += x[i] * w1[i * hidden + j];
        h[j] = std::tanh(a);
      }
      std::fill(dh.begin(), dh.end(), 0.0f);
      for (std::size_t k = 0; k < out; ++k) {
        float a = b2[k];
        for (std::size_t j = 0; j < hidden; ++j) a += h[j] * w2[j * out + k];
        const float diff = a - y[k];
        loss += diff * diff / n;
        const float da = 2 * diff / n;
        gb2[k] += da;
        for (std::size_t j = 0; j < hidden; ++j) {
          gw2[j * out + k] += h[j] * da;
          dh[j] += w2[j * out + k] * da;
        }
      }
      for (std::size_t j = 0; j < hidden; ++j) {
        const float da = dh[j] * (1 - h[j] * h[j]);
        gb1[j] += da;
        for (std::size_t i = 0; i < in; ++i) gw1[i * hidden + j] += x[i] * da;
      }
    }
    return loss;
  }
};

// The largest relative difference ||a - b|| / ||b|| over the model's parameter tensors.
inline double relative_difference(tiny_mlp& a, tiny_mlp& b) {
  double worst = 0;
  const auto pa = a.params();
  const auto pb = b.params();
  for (std::size_t t = 0; t < pa.size(); ++t) {
    const auto* x = static_cast<const float*>(pa[t].data);
    const auto* y = static_cast<const float*>(pb[t].data);
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < pa[t].count; ++i) {
      diff += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      norm += static_cast<double>(y[i]) * y[i];
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

}  // namespace herd_test
