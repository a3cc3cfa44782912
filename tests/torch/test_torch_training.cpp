// A libtorch model trained with herd on real MPI ranks: every rank holds bitwise-identical
// parameters after several steps, and they equal one rank's training at the combined batch
// (relative difference <= 1e-5), with libtorch's SGD (momentum) and Adam.

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/optim/torch.hpp>

#include "../support/mpi_test.hpp"

#include <cstdint>
#include <vector>

namespace {

torch::nn::Sequential make_model(std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
}

// Max over parameters of ||a - b|| / ||b||.
double relative_difference(torch::nn::Sequential& a, torch::nn::Sequential& b) {
  double worst = 0;
  auto pa = a->parameters();
  auto pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, ((pa[i] - pb[i]).norm() / pb[i].norm()).item<double>());
  return worst;
}

bool identical_on_all_ranks(torch::nn::Sequential& model, herd::mpi_communicator& comm) {
  bool same = true;
  for (auto& p : model->parameters()) {
    torch::Tensor gathered = torch::empty({comm.size(), p.numel()});
    torch::Tensor flat = p.detach().reshape({-1}).contiguous();
    herd::allgather(flat, gathered, comm);
    for (int r = 1; r < comm.size(); ++r) same = same && gathered[r].equal(gathered[0]);
  }
  return same;
}

template <class MakeOptimizer> void train_and_compare(herd::mpi_communicator& comm, MakeOptimizer make) {
  torch::set_num_threads(1);
  const int steps = 5;
  const std::int64_t batch = 4;  // per rank
  const std::int64_t world = comm.size();
  torch::manual_seed(1234);  // the same data on every rank
  const torch::Tensor x = torch::randn({steps * world * batch, 6});
  const torch::Tensor y = torch::randn({steps * world * batch, 3});

  auto model = make_model(comm.rank() == 0 ? 7 : 100 + static_cast<std::uint64_t>(comm.rank()));
  auto inner = make(model);
  herd::distributed_optimizer opt(inner, herd::torch_gradients(inner), comm);
  herd::broadcast_parameters(*model, comm, 0);  // ranks started from different weights

  auto alone = make_model(7);
  auto reference = make(alone);
  for (std::int64_t s = 0; s < steps; ++s) {
    const std::int64_t begin = s * world * batch + comm.rank() * batch;
    inner.zero_grad();
    torch::mse_loss(model->forward(x.slice(0, begin, begin + batch)), y.slice(0, begin, begin + batch)).backward();
    CHECK(opt.step());
    reference.zero_grad();
    const std::int64_t round = s * world * batch;
    torch::mse_loss(alone->forward(x.slice(0, round, round + world * batch)), y.slice(0, round, round + world * batch))
        .backward();
    reference.step();
  }
  CHECK(identical_on_all_ranks(model, comm));
  const double difference = relative_difference(model, alone);
  INFO("relative difference to one rank at the combined batch: ", difference);
  CHECK(difference <= 1e-5);
}

}  // namespace

HERD_MPI_TEST_CASE("libtorch SGD with momentum: identical on every rank, equal to one rank at the combined batch", 1) {
  herd::mpi_communicator comm;
  train_and_compare(comm, [](torch::nn::Sequential& m) {
    return torch::optim::SGD(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  });
}

HERD_MPI_TEST_CASE("libtorch Adam: identical on every rank, equal to one rank at the combined batch", 1) {
  herd::mpi_communicator comm;
  train_and_compare(comm, [](torch::nn::Sequential& m) {
    return torch::optim::Adam(m->parameters(), torch::optim::AdamOptions(0.01));
  });
}

HERD_MPI_TEST_CASE("broadcast_optimizer_state gives every rank the root's libtorch optimizer state", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto model = make_model(3);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01 * (comm.rank() + 1)));
  if (comm.rank() == 1) {  // only the root has stepped (as after loading a checkpoint there)
    for (int i = 0; i < 3; ++i) {
      adam.zero_grad();
      model->forward(torch::ones({2, 6})).sum().backward();
      adam.step();
    }
  }
  herd::broadcast_parameters(*model, comm, 1);
  herd::broadcast_optimizer_state(adam, comm, 1);
  CHECK(adam.param_groups()[0].options().get_lr() == doctest::Approx(0.02));
  for (auto& p : model->parameters()) {
    auto& state = static_cast<torch::optim::AdamParamState&>(*adam.state().at(herd::detail::torch_state_key(p)));
    CHECK(state.step() == 3);
    torch::Tensor all = torch::empty({comm.size(), p.numel()});
    torch::Tensor flat = state.exp_avg().reshape({-1}).contiguous();
    herd::allgather(flat, all, comm);
    for (int r = 0; r < comm.size(); ++r) CHECK(all[r].equal(all[1]));
  }
  // One more identical step keeps every rank identical.
  adam.zero_grad();
  model->forward(torch::ones({2, 6})).sum().backward();
  adam.step();
  torch::Tensor first = model->parameters()[0].detach().reshape({-1}).contiguous();
  torch::Tensor gathered = torch::empty({comm.size(), first.numel()});
  herd::allgather(first, gathered, comm);
  for (int r = 0; r < comm.size(); ++r) CHECK(gathered[r].equal(gathered[0]));
}
