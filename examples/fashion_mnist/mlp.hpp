#pragma once
// The model: a multilayer perceptron 784-256-128-10 with ReLU and softmax cross-entropy, on the
// CPU with Eigen. A batch is a matrix with one sample per column (inputs x batch), so that
// gathering a sample is one contiguous copy and every layer is one matrix product.
//
// Parameters and gradients are plain Eigen matrices and vectors, allocated once; train_batch()
// writes the gradients into them without reallocating, so the views herd holds stay valid.
//
// The model's code is in mlp.cpp, a translation unit of its own, as a project keeps its model
// apart from its training loop: Eigen's matrix products compile there once, and main.cpp, which
// uses herd, compiles herd's part alone.

#include <Eigen/Core>

#include <cstddef>
#include <cstdint>
#include <functional>
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
  explicit mlp(std::uint64_t seed);

  // The gradients in the order herd is given them (params/grads lists in main.cpp).
  enum gradient : std::size_t { gw1, gb1, gw2, gb2, gw3, gb3 };

  // Forward and backward over one batch (x: inputs x n, labels: n): the gradients of the mean
  // loss end up in grad_*. `ready(g)` is called as soon as gradient g is final, layer by layer
  // from the last (so that its reduction can start while the earlier layers' are computed).
  batch_result train_batch(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels,
                           const std::function<void(gradient)>& ready = {});

  // Forward only: loss and correct count, gradients untouched.
  batch_result forward(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels);

  Eigen::MatrixXf w1, w2, w3;
  Eigen::VectorXf b1, b2, b3;
  Eigen::MatrixXf grad_w1, grad_w2, grad_w3;
  Eigen::VectorXf grad_b1, grad_b2, grad_b3;

 private:
  // Activations of the last batch, kept for the backward pass and reused to avoid allocations.
  Eigen::MatrixXf a1_, a2_, probs_;
  Eigen::MatrixXf delta1_, delta2_;
};

}  // namespace fashion
