#pragma once
// A short data-parallel training of tiny_mlp: eight steps of momentum SGD on the synthetic
// regression data, each rank on its own batches, the gradients reduced by herd's distributed
// optimizer with a given fusion threshold (0: one allreduce per gradient). Returns the parameters,
// flattened: tests compare them across algorithms, node layouts and modes.

#include <herd/herd.hpp>

#include "tiny_mlp.hpp"

#include <cstddef>
#include <vector>

namespace herd_test {

template <class Communicator> std::vector<float> train_tiny_mlp(Communicator& comm, std::size_t fusion_threshold) {
  const std::size_t batch = 16;
  const int steps = 8;
  const auto p = static_cast<std::size_t>(comm.size());
  const regression_data data(batch * p * static_cast<std::size_t>(steps), 7, 3, 99);
  tiny_mlp model(7, 400, 3, 5);  // about 4400 parameters: 17 KiB of gradients
  auto inner = herd::sgd(model.params(), model.grads(), {.lr = 0.05, .momentum = 0.9});
  herd::optimizer_options options;
  options.fusion_threshold_bytes = fusion_threshold;
  herd::distributed_optimizer opt(inner, model.grads(), comm, options);
  herd::broadcast_parameters(model.params(), comm, 0);
  for (int s = 0; s < steps; ++s) {
    const std::size_t at = (static_cast<std::size_t>(s) * p + static_cast<std::size_t>(comm.rank())) * batch;
    model.forward_backward(data, at, at + batch);
    opt.step();
  }
  std::vector<float> out;
  for (auto v : model.params()) {
    const float* f = static_cast<const float*>(v.data);
    out.insert(out.end(), f, f + v.count);
  }
  return out;
}

}  // namespace herd_test
