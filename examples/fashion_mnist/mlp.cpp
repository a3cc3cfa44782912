// The model of mlp.hpp: initialization, forward and backward with Eigen.

#include "mlp.hpp"

#include <herd/core/random.hpp>

#include <cmath>
#include <numbers>

namespace fashion {
namespace {

// Box-Muller on 53-bit uniforms from herd's engine (std::normal_distribution differs between
// standard libraries; this does not, apart from libm's last bits).
double standard_normal(herd::random_engine& rng) {
  const double u1 = (static_cast<double>(rng.next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]: log() stays finite
  const double u2 = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Eigen::MatrixXf he_normal(Eigen::Index rows, Eigen::Index cols, herd::random_engine& rng) {
  const double stddev = std::sqrt(2.0 / static_cast<double>(cols));
  Eigen::MatrixXf w(rows, cols);
  for (Eigen::Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(stddev * standard_normal(rng));
  return w;
}

}  // namespace

mlp::mlp(std::uint64_t seed) {
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

batch_result mlp::train_batch(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels,
                              const std::function<void(gradient)>& ready) {
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

batch_result mlp::forward(const Eigen::MatrixXf& x, std::span<const std::uint8_t> labels) {
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

}  // namespace fashion
