#pragma once
// The model: a multilayer perceptron 784-256-128-10 with ReLU and softmax cross-entropy, on the
// CPU with Eigen. A batch is a matrix with one sample per column (inputs x batch), so that
// gathering a sample is one contiguous copy and every layer is one matrix product.
//
// Parameters and gradients are plain Eigen matrices and vectors, allocated once; train_batch()
// writes the gradients into them without reallocating, so the views herd holds stay valid.

#include <herd/core/random.hpp>

#include <Eigen/Core>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numbers>
#include <span>

namespace fashion {

struct batch_result {
  double loss = 0;          // mean cross-entropy over the batch
  std::size_t correct = 0;  // samples whose largest logit is the label
};

class mlp {
 public:
  static constexpr Eigen::Index inputs = 784;
  static constexpr Eigen::Index hidden1 = 256;
  static constexpr Eigen::Index hidden2 = 128;
  static constexpr Eigen::Index classes = 10;

  // He initialization (normal, variance 2 / fan_in) for the weights, zero biases. Every rank
  // draws the same numbers for the same seed; broadcasting from rank 0 makes that a certainty.
  explicit mlp(std::uint64_t seed) {
    herd::random_engine rng(seed);
    w1 = he_normal(hidden1, inputs, rng);
    w2 = he_normal(hidden2, hidden1, rng);
    w3 = he_normal(classes, hidden2, rng);
    b1 = Eigen::VectorXf::Zero(hidden1);
    b2 = Eigen::VectorXf::Zero(hidden2);
    b3 = Eigen::VectorXf::Zero(classes);
    grad_w1 = Eigen::MatrixXf::Zero(hidden1, inputs);
    grad_w2 = Eigen::MatrixXf::Zero(hidden2, hidden1);
    grad_w3 = Eigen::MatrixXf::Zero(classes, hidden2);
    grad_b1 = Eigen::VectorXf::Zero(hidden1);
    grad_b2 = Eigen::VectorXf::Zero(hidden2);
    grad_b3 = Eigen::VectorXf::Zero(classes);
  }

  // The gradients in the order herd is given them (params/grads lists in main.cpp).
  enum gradient : std::size_t { gw1, gb1, gw2, gb2, gw3, gb3 };

  // Forward and backward over one batch (x: inputs x n, labels: n): the gradients of the mean
  // loss end up in grad_*. `ready(g)` is called as soon as gradient g is final, layer by layer
  // from the last (so that its reduction can start while the earlier layers' are computed).
  batch_result train_batch(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels,
                           const std::function<void(gradient)>& ready = {}) {
    auto done = [&](gradient g) {
      if (ready) ready(g);
    };
    const batch_result result = forward(x, labels);
    const float scale = 1.0f / static_cast<float>(x.cols());

    // d loss / d logits of the mean cross-entropy: (softmax - one_hot) / n.
    for (Eigen::Index j = 0; j < x.cols(); ++j) probs_(labels[static_cast<std::size_t>(j)], j) -= 1.0f;
    probs_ *= scale;

    grad_w3.noalias() = probs_ * a2_.transpose();
    grad_b3.noalias() = probs_.rowwise().sum();
    done(gw3);
    done(gb3);
    delta2_.noalias() = w3.transpose() * probs_;
    delta2_.array() *= (a2_.array() > 0.0f).cast<float>();  // ReLU passes gradient where it was active

    grad_w2.noalias() = delta2_ * a1_.transpose();
    grad_b2.noalias() = delta2_.rowwise().sum();
    done(gw2);
    done(gb2);
    delta1_.noalias() = w2.transpose() * delta2_;
    delta1_.array() *= (a1_.array() > 0.0f).cast<float>();

    grad_w1.noalias() = delta1_ * x.transpose();
    grad_b1.noalias() = delta1_.rowwise().sum();
    done(gw1);
    done(gb1);
    return result;
  }

  // Forward only: loss and correct count, gradients untouched.
  batch_result forward(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels) {
    a1_.noalias() = w1 * x;
    a1_.colwise() += b1;
    a1_ = a1_.cwiseMax(0.0f);
    a2_.noalias() = w2 * a1_;
    a2_.colwise() += b2;
    a2_ = a2_.cwiseMax(0.0f);
    probs_.noalias() = w3 * a2_;
    probs_.colwise() += b3;

    // Softmax per column, shifted by the column's maximum so that exp() cannot overflow; the
    // loss uses log-sum-exp directly rather than log(prob), which could underflow to log(0).
    batch_result result;
    double loss_sum = 0;
    for (Eigen::Index j = 0; j < probs_.cols(); ++j) {
      auto logits = probs_.col(j);
      Eigen::Index best = 0;
      const float top = logits.maxCoeff(&best);
      const auto label = static_cast<Eigen::Index>(labels[static_cast<std::size_t>(j)]);
      const float label_logit = logits(label) - top;
      logits.array() = (logits.array() - top).exp();
      const float total = logits.sum();
      // -log softmax[label] = log(sum exp(logit - top)) - (logit[label] - top)
      loss_sum += std::log(static_cast<double>(total)) - static_cast<double>(label_logit);
      logits /= total;
      if (best == label) ++result.correct;
    }
    result.loss = probs_.cols() > 0 ? loss_sum / static_cast<double>(probs_.cols()) : 0.0;
    return result;
  }

  Eigen::MatrixXf w1, w2, w3;
  Eigen::VectorXf b1, b2, b3;
  Eigen::MatrixXf grad_w1, grad_w2, grad_w3;
  Eigen::VectorXf grad_b1, grad_b2, grad_b3;

 private:
  static Eigen::MatrixXf he_normal(Eigen::Index rows, Eigen::Index cols, herd::random_engine& rng) {
    const double stddev = std::sqrt(2.0 / static_cast<double>(cols));
    Eigen::MatrixXf w(rows, cols);
    for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(stddev * standard_normal(rng));
    return w;
  }

  // Box-Muller on 53-bit uniforms from herd's engine (std::normal_distribution differs between
  // standard libraries; this does not, apart from libm's last bits).
  static double standard_normal(herd::random_engine& rng) {
    const double u1 = (static_cast<double>(rng.next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log() stays finite
    const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  // Activations of the last batch, kept for the backward pass and reused to avoid allocations.
  Eigen::MatrixXf a1_, a2_, probs_;
  Eigen::MatrixXf delta1_, delta2_;
};

}  // namespace fashion
