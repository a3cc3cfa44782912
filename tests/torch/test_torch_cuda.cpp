// libtorch on CUDA reduced over NCCL from a file that g++ compiles (herd's own kernels absent:
// libtorch's are lent to herd, torch/detail/streams.hpp and torch/detail/device_arithmetic.hpp). Every rank trains on its own batches; the result
// must equal one process that computes each rank's gradients itself on the CPU, averages them and
// steps the same optimizer (what data-parallel training must equal, computed without herd).
// Covered: the DDP wrapper (buckets during backward, fp16 compression, gradient predivision, a
// stream of libtorch's pool), distributed_optimizer over torch_gradients with two passes summed
// by copy (herd's accumulation), and SyncBatchNorm on f16 activations with f32 parameters.
// Run by tools/gpu-check.sh on a GPU machine at 1 and 2 processes, one GPU each (NCCL refuses two
// ranks on one GPU); where a node has fewer GPUs than ranks, or none, it exits 77 (skipped).

#include <torch/torch.h>

#include <herd/comm/nccl.hpp>
#include <herd/herd.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/gradients.hpp>
#include <herd/torch/sync_batch_norm.hpp>

#include <c10/core/StreamGuard.h>

#include "../support/mpi_test.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

static_assert(!HERD_WITH_CUDA_KERNELS, "this test is of the host-compiled path: compile it with g++");

namespace {

constexpr std::int64_t features = 12, hidden = 32, outputs = 4, batch = 8;
constexpr int steps = 3;
constexpr double lr = 0.1, momentum = 0.9;

torch::nn::Sequential make_net(torch::ScalarType type) {
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(features, hidden), torch::nn::Tanh(), torch::nn::Linear(hidden, outputs));
  net->to(type);
  return net;
}

// Rank r's batch for pass `pass` of step `step`: the same on every process, different per rank.
std::pair<torch::Tensor, torch::Tensor> batch_of(int rank, int step, int pass, torch::ScalarType type) {
  torch::manual_seed(static_cast<std::uint64_t>(1000 + 100 * step + 10 * pass + rank));
  return {torch::randn({batch, features}, torch::kDouble).to(type), torch::randn({batch, outputs}, torch::kDouble).to(type)};
}

struct run_options {
  torch::ScalarType type = torch::kDouble;
  int passes = 1;  // backward passes summed per step
};

// One process, no herd: each step, the sum over passes of the average over ranks of each rank's
// gradient, then SGD. In f64 on the CPU.
std::vector<torch::Tensor> reference(int world, const run_options& o) {
  auto net = make_net(torch::kDouble);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  for (int s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> total;
    for (auto& p : net->parameters()) total.push_back(torch::zeros_like(p));
    for (int r = 0; r < world; ++r) {
      for (int k = 0; k < o.passes; ++k) {
        sgd.zero_grad();
        auto [x, y] = batch_of(r, s, k, torch::kDouble);
        torch::mse_loss(net->forward(x.to(o.type).to(torch::kDouble)), y.to(o.type).to(torch::kDouble)).backward();
        auto params = net->parameters();
        for (std::size_t i = 0; i < params.size(); ++i) total[i] += params[i].grad() / world;
      }
    }
    auto params = net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = total[i];
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// max |a - b| over every parameter, a on any device and type, b the f64 reference.
double worst_difference(torch::nn::Sequential& net, const std::vector<torch::Tensor>& expected) {
  double worst = 0;
  auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    worst = std::max(worst, (params[i].detach().to(torch::kCPU, torch::kDouble) - expected[i]).abs().max().item<double>());
  }
  return worst;
}

torch::Device this_gpu() {
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(herd::mpi::local_rank() % static_cast<int>(torch::cuda::device_count()))};
}

// Trains with the DDP wrapper over `gpus`, on a stream of libtorch's pool when `own_stream`.
std::vector<torch::Tensor> with_ddp(herd::nccl_communicator& gpus, herd::optimizer_options options,
                                                   const run_options& o, bool own_stream) {
  const torch::Device device = this_gpu();
  auto net = make_net(o.type);
  net->to(device);
  std::optional<c10::StreamGuard> on_pool;
  if (own_stream) {
    on_pool.emplace(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStreamFromGlobalPool(device));
  }
  herd::torch::DistributedDataParallel ddp(net, gpus, options);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  for (int s = 0; s < steps; ++s) {
    sgd.zero_grad();
    auto [x, y] = batch_of(gpus.rank(), s, 0, o.type);
    torch::mse_loss(ddp->forward(x.to(device)), y.to(device)).backward();
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().to(torch::kCPU, torch::kDouble));
  return out;
}

}  // namespace

HERD_MPI_TEST_CASE("DDP wrapper on CUDA over NCCL from a g++ build: the average of every rank's gradients", 1) {
  herd::mpi_communicator world;
  herd::nccl_communicator gpus(world, static_cast<int>(this_gpu().index()));
  struct variant {
    const char* name;
    herd::optimizer_options options;
    run_options run;
    bool own_stream;
    double tolerance;
  };
  const std::vector<variant> variants = {
      {"f64", {}, {torch::kDouble, 1}, false, 1e-12},
      {"f64, predivide 2, small buckets", {.gradient_predivide_factor = 2.0, .bucket_bytes = 2048, .first_bucket_bytes = 512},
       {torch::kDouble, 1}, false, 1e-12},
      {"f32 on a stream of libtorch's pool", {}, {torch::kFloat, 1}, true, 1e-5},
      {"f32, fp16 compression", {.compression = herd::compression::fp16}, {torch::kFloat, 1}, false, 2e-3},
      {"f16 parameters and gradients", {}, {torch::kHalf, 1}, false, 2e-2},
  };
  for (const variant& v : variants) {
    CAPTURE(v.name);
    const auto got = with_ddp(gpus, v.options, v.run, v.own_stream);
    auto expected = reference(world.size(), v.run);
    auto net = make_net(torch::kDouble);
    {
      const torch::NoGradGuard no_grad;
      auto params = net->parameters();
      for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(got[i]);
    }
    const double difference = worst_difference(net, expected);
    INFO(v.name, ": largest difference from the reference ", difference);
    CHECK(difference <= v.tolerance);
    // Not a no-op: the parameters moved, and differ from rank 0 training alone.
    if (world.size() > 1) CHECK(worst_difference(net, reference(1, v.run)) > 10 * v.tolerance);
  }
}

HERD_MPI_TEST_CASE("distributed_optimizer over torch_gradients on CUDA: two passes summed by copy, over NCCL", 1) {
  herd::mpi_communicator world;
  herd::nccl_communicator gpus(world, static_cast<int>(this_gpu().index()));
  const torch::Device device = this_gpu();
  const run_options o{torch::kFloat, 2};
  auto net = make_net(o.type);
  net->to(device);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), gpus,
                                  {.backward_passes_per_step = 2, .accumulate = herd::accumulation::by_copy,
                                   .compression = herd::compression::bf16});
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < o.passes; ++k) {
      sgd.zero_grad();  // by_copy: each pass overwrites the gradients; herd keeps the sum
      auto [x, y] = batch_of(gpus.rank(), s, k, o.type);
      torch::mse_loss(net->forward(x.to(device)), y.to(device)).backward();
      opt.step();
    }
  }
  const double difference = worst_difference(net, reference(world.size(), o));
  INFO("largest difference from the reference: ", difference);
  CHECK(difference <= 1e-2);  // bf16 on the wire
  if (world.size() > 1) CHECK(worst_difference(net, reference(1, o)) > 0.1);
}

HERD_MPI_TEST_CASE("SyncBatchNorm on CUDA over NCCL: f16 activations, f32 parameters, channels_last", 1) {
  herd::mpi_communicator world;
  herd::nccl_communicator gpus(world, static_cast<int>(this_gpu().index()));
  const torch::Device device = this_gpu();
  const int w = world.size();
  torch::manual_seed(3);
  const torch::Tensor all = torch::randn({4 * w, 3, 5, 5}, torch::kDouble) * 3 + 2;  // every rank's batch
  const torch::Tensor upstream = torch::randn({4 * w, 3, 5, 5}, torch::kDouble);
  // Reference: BatchNorm2d over the whole batch, in f64 on the CPU.
  torch::nn::BatchNorm2d plain(3);
  plain->to(torch::kDouble);
  torch::Tensor x_all = all.to(torch::kHalf).to(torch::kDouble).requires_grad_(true);
  const torch::Tensor y_all = plain->forward(x_all);
  (y_all * upstream).sum().backward();

  herd::torch::SyncBatchNorm bn(torch::nn::BatchNormOptions(3), gpus);
  bn->to(device);  // f32 parameters
  const auto mine = all.slice(0, 4 * gpus.rank(), 4 * (gpus.rank() + 1));
  torch::Tensor x = mine.to(device, torch::kHalf).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
  torch::Tensor y = bn->forward(x);
  CHECK((y.scalar_type() == torch::kHalf));
  CHECK(y.is_contiguous(torch::MemoryFormat::ChannelsLast));
  (y.to(torch::kDouble) * upstream.slice(0, 4 * gpus.rank(), 4 * (gpus.rank() + 1)).to(device)).sum().backward();
  const torch::Tensor y_ref = y_all.slice(0, 4 * gpus.rank(), 4 * (gpus.rank() + 1)).detach();
  CHECK((y.to(torch::kCPU, torch::kDouble) - y_ref).abs().max().item<double>() <= 1e-2);  // f16 output
  CHECK((x.grad().to(torch::kCPU, torch::kDouble) - x_all.grad().slice(0, 4 * gpus.rank(), 4 * (gpus.rank() + 1)))
            .abs().max().item<double>() <= 1e-2);
  CHECK((bn->weight.grad().scalar_type() == torch::kFloat));  // the parameters' type, not the input's
  // Weight and bias gradients are this rank's: summed over the ranks, they are the whole batch's.
  torch::Tensor sums = torch::cat({bn->weight.grad(), bn->bias.grad()});
  herd::allreduce(sums, gpus, herd::reduce_op::sum);
  const torch::Tensor sums_ref = torch::cat({plain->weight.grad(), plain->bias.grad()});
  CHECK((sums.to(torch::kCPU, torch::kDouble) - sums_ref).abs().max().item<double>() <= 1e-2 * (1 + sums_ref.abs().max().item<double>()));
  CHECK((bn->running_mean.to(torch::kCPU, torch::kDouble) - plain->running_mean).abs().max().item<double>() <= 1e-3);
  CHECK((bn->running_var.to(torch::kCPU, torch::kDouble) - plain->running_var).abs().max().item<double>() <= 1e-3);
}
