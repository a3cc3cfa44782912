// herd::torch::SyncBatchNorm on real MPI ranks: each rank normalizes its part of a global batch
// (even parts, and parts of different sizes) and gets what libtorch's BatchNorm computes on the
// whole batch on one rank: outputs, running statistics, input gradients, and weight and bias
// gradients once summed over the ranks (within 1e-5); eval() uses the running statistics alike;
// convert_sync_batchnorm swaps the BatchNorms of a Sequential.

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/sync_batch_norm.hpp>
#include <herd/torch/tensor_traits.hpp>

#include "../support/mpi_test.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace {

double worst(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

void set_affine(torch::nn::BatchNorm2d& bn) {
  const torch::NoGradGuard no_grad;
  bn->weight.copy_(torch::tensor({0.5f, 1.5f, -1.0f}));
  bn->bias.copy_(torch::tensor({0.1f, -0.2f, 0.3f}));
}

}  // namespace

HERD_MPI_TEST_CASE("SyncBatchNorm over the ranks equals BatchNorm2d over the whole batch", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  const auto r = static_cast<std::size_t>(comm.rank());
  for (bool uneven : {false, true}) {
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(p), 4);
    if (uneven)
      for (int q = 0; q < p; ++q) sizes[static_cast<std::size_t>(q)] = 1 + 2 * q;
    const std::int64_t total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
    const std::int64_t begin = std::accumulate(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(r), std::int64_t{0});
    torch::manual_seed(11);
    const torch::Tensor x = torch::randn({total, 3, 2, 2}) * 2 + 1;
    const torch::Tensor upstream = torch::randn({total, 3, 2, 2});  // the loss: sum(y * upstream)

    // One rank, the whole batch: libtorch's own BatchNorm2d.
    torch::nn::BatchNorm2d plain(3);
    set_affine(plain);
    torch::Tensor x_all = x.clone().requires_grad_(true);
    torch::Tensor y_all;
    for (int step = 0; step < 2; ++step) {
      if (x_all.grad().defined()) x_all.grad().zero_();
      plain->zero_grad();
      y_all = plain->forward(x_all);
      (y_all * upstream).sum().backward();
    }

    // This rank's part, through a converted Sequential.
    torch::nn::BatchNorm2d original(3);
    set_affine(original);
    torch::nn::Sequential model = herd::torch::convert_sync_batchnorm(torch::nn::Sequential(original), comm);
    auto sync = model->ptr<herd::torch::SyncBatchNormImpl>(0);
    REQUIRE(sync != nullptr);
    torch::Tensor x_mine = x.narrow(0, begin, sizes[r]).clone().requires_grad_(true);
    torch::Tensor y_mine;
    for (int step = 0; step < 2; ++step) {
      if (x_mine.grad().defined()) x_mine.grad().zero_();
      model->zero_grad();
      y_mine = model->forward(x_mine);
      (y_mine * upstream.narrow(0, begin, sizes[r])).sum().backward();
    }
    torch::Tensor grad_weight = sync->weight.grad().clone(), grad_bias = sync->bias.grad().clone();
    herd::allreduce(grad_weight, comm);  // what DDP's reduction (a sum here) does to this rank's part
    herd::allreduce(grad_bias, comm);

    const std::string parts = uneven ? "uneven" : "even";
    INFO(parts, " parts, rank ", r);
    CHECK(worst(y_mine, y_all.narrow(0, begin, sizes[r])) <= 1e-5);
    CHECK(worst(x_mine.grad(), x_all.grad().narrow(0, begin, sizes[r])) <= 1e-5);
    CHECK(worst(sync->running_mean, plain->running_mean) <= 1e-5);
    CHECK(worst(sync->running_var, plain->running_var) <= 1e-5);
    CHECK(sync->num_batches_tracked.item<std::int64_t>() == 2);
    CHECK(worst(grad_weight, plain->weight.grad()) <= 1e-5);
    CHECK(worst(grad_bias, plain->bias.grad()) <= 1e-5);

    model->eval();
    plain->eval();
    CHECK(worst(model->forward(x), plain->forward(x)) <= 1e-5);
  }
}

HERD_MPI_TEST_CASE("convert_sync_batchnorm: every BatchNorm swapped, other layers shared, wrong channel counts explained", 1) {
  herd::mpi_communicator comm;
  torch::nn::Linear linear(4, 6);
  torch::nn::Sequential model(linear, torch::nn::BatchNorm1d(6), torch::nn::ReLU(), torch::nn::BatchNorm1d(6));
  torch::nn::Sequential converted = herd::torch::convert_sync_batchnorm(model, comm);
  CHECK(converted->ptr(0).get() == linear.ptr().get());
  CHECK(converted->ptr<herd::torch::SyncBatchNormImpl>(1) != nullptr);
  CHECK(converted->ptr<torch::nn::ReLUImpl>(2) != nullptr);
  CHECK(converted->ptr<herd::torch::SyncBatchNormImpl>(3) != nullptr);
  const torch::Tensor y = converted->forward(torch::randn({5, 4}));
  CHECK(y.sizes() == torch::IntArrayRef({5, 6}));
  herd::torch::SyncBatchNorm bn(torch::nn::BatchNormOptions(3), comm);
  CHECK_THROWS_WITH_AS(bn->forward(torch::randn({2, 5})), doctest::Contains("input of shape [2, 5] for 3 channels"),
                       herd::error);
  herd::torch::SyncBatchNorm by_count(3, comm);  // BatchNormOptions from the channel count, as BatchNorm2d(3)
  CHECK(by_count->options.num_features() == 3);
}

HERD_MPI_TEST_CASE("convert_sync_batchnorm keeps the BatchNorms' tensors, requires_grad and training mode, as PyTorch's", 1) {
  herd::mpi_communicator comm;
  torch::nn::BatchNorm1d bn(6);
  torch::nn::BatchNorm1d frozen(6);
  frozen->weight.requires_grad_(false);
  torch::nn::Sequential model(torch::nn::Linear(4, 6), bn, frozen);
  model->eval();
  // An optimizer made before the conversion, as a DDP script makes it.
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
  torch::nn::Sequential converted = herd::torch::convert_sync_batchnorm(model, comm);
  auto sync = converted->ptr<herd::torch::SyncBatchNormImpl>(1);
  REQUIRE(sync != nullptr);
  CHECK(sync->weight.is_same(bn->weight));
  CHECK(sync->bias.is_same(bn->bias));
  CHECK(sync->running_mean.is_same(bn->running_mean));
  CHECK(sync->running_var.is_same(bn->running_var));
  CHECK(sync->num_batches_tracked.is_same(bn->num_batches_tracked));
  CHECK(!converted->ptr<herd::torch::SyncBatchNormImpl>(2)->weight.requires_grad());
  CHECK(!converted->is_training());
  CHECK(!sync->is_training());
  converted->train();
  const torch::Tensor before = bn->bias.detach().clone();
  optimizer.zero_grad();
  converted->forward(torch::randn({5, 4})).sum().backward();
  optimizer.step();
  CHECK(!bn->bias.equal(before));  // the optimizer's step moved the converted model's bias
  CHECK(bn->bias.equal(sync->bias));
}

HERD_MPI_TEST_CASE("SyncBatchNorm is not shadowed by DistributedDataParallel's join(): every rank raises at once, none waits", 2) {
  herd::mpi_communicator comm;  // the default watchdog (30 minutes): an error in time must come from the agreement
  torch::set_num_threads(1);
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6), torch::nn::Linear(6, 2));
  model = herd::torch::convert_sync_batchnorm(model, comm);
  herd::optimizer_options options;
  options.uneven_inputs = true;
  herd::torch::DistributedDataParallel net(model, comm, options);
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    if (comm.rank() != 0) net.forward(torch::randn({3, 4})).sum().backward();  // rank 0 has no batch left
    net.join();
  } catch (const herd::error& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(message);
  // The joined rank's roster exchange meets SyncBatchNorm's statistics: the agreement names the
  // difference it sees first (the operation, or, both being allgathers, the dtype).
  const bool told = message.find("the ranks are in different operations") != std::string::npos ||
                    message.find("differs across ranks") != std::string::npos;
  CHECK(told);
  CHECK(seconds < 5);
}

HERD_MPI_TEST_CASE("SyncBatchNorm: 16-bit activations with f32 parameters (mixed precision) sum in f32 and keep channels_last", 1) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  for (const auto type : {torch::kHalf, torch::kBFloat16}) {
    const std::string type_name = c10::toString(type);
    CAPTURE(type_name);
    herd::torch::SyncBatchNorm bn(torch::nn::BatchNormOptions(2), comm);  // f32 weight and bias
    torch::manual_seed(4);
    // 70000 values per channel on each rank: their sum is exact in f32, inf in f16 (and 70144 in bf16).
    torch::Tensor x = (torch::randn({10, 2, 70, 100}) * 3 + 1).to(type).contiguous(torch::MemoryFormat::ChannelsLast);
    x.requires_grad_(true);
    torch::Tensor y = bn->forward(x);
    CHECK((y.scalar_type() == type));
    CHECK(y.is_contiguous(torch::MemoryFormat::ChannelsLast));
    y.backward(torch::ones_like(y));  // dy = 1: bias.grad is the count of this rank's values
    REQUIRE(bn->bias.grad().defined());
    CHECK((bn->bias.grad().scalar_type() == torch::kFloat));
    CHECK((bn->weight.grad().scalar_type() == torch::kFloat));
    CHECK(bn->bias.grad().equal(torch::full({2}, 70000.0f)));
    CHECK((x.grad().scalar_type() == type));
    CHECK(std::isfinite(x.grad().to(torch::kFloat).abs().max().item<float>()));
  }
}

namespace {

// A layer after a SyncBatchNorm that one rank skips: with find_unused_parameters its gradients are
// unused there, and backward's collectives are the buckets and SyncBatchNorm's statistics.
struct skipping_after_sync_bn : torch::nn::Module {
  skipping_after_sync_bn(herd::mpi_communicator& comm, bool skip) : skip_b(skip) {
    a = register_module("a", torch::nn::Linear(4, 6));
    bn = register_module("bn", herd::torch::SyncBatchNorm(torch::nn::BatchNormOptions(6), comm));
    b = register_module("b", torch::nn::Linear(6, 6));
    c = register_module("c", torch::nn::Linear(6, 2));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = bn->forward(a->forward(x));
    return c->forward(skip_b ? h : b->forward(h));
  }
  bool skip_b;
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
  herd::torch::SyncBatchNorm bn{nullptr};
};

}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel with find_unused_parameters and SyncBatchNorm: a layer one rank skips reduces as DDP's, its buckets where the others' are", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(11);
  const bool skip = comm.rank() == comm.size() - 1;
  auto model = std::make_shared<skipping_after_sync_bn>(comm, skip);
  herd::optimizer_options options;
  options.find_unused_parameters = true;
  options.bucket_bytes = options.first_bucket_bytes = 16;  // a bucket per parameter: several start during backward
  herd::torch::DistributedDataParallel ddp(model, comm, options);
  torch::manual_seed(static_cast<std::uint64_t>(100 + comm.rank()));
  const torch::Tensor x = torch::randn({5, 4});
  // This rank's own gradients of b (none where it skips b), from a pass under no_sync().
  {
    const auto guard = ddp.no_sync();
    ddp.forward(x).sum().backward();
  }
  torch::Tensor own_b = model->b->weight.grad().defined() ? model->b->weight.grad().clone() : torch::zeros({6, 6});
  herd::allreduce(own_b, comm, herd::reduce_op::avg);  // what DDP gives b: the mean, zeros from the rank that skipped it
  ddp.zero_grad();
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    ddp.forward(x).sum().backward();
    REQUIRE(model->b->weight.grad().defined());
    CHECK(worst(model->b->weight.grad(), own_b) < 1e-6);
    torch::Tensor everywhere = model->b->weight.grad().clone();
    herd::broadcast(everywhere, comm, 0);
    CHECK(worst(model->b->weight.grad(), everywhere) == 0);
    ddp.zero_grad();
  }
}
