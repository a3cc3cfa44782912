// The libtorch code blocks of docs/training.md, as the page shows them (the build copies each
// block into an .inc file that this program includes), around the names each block uses. Each
// block runs on every rank and its result is checked against plain libtorch on one process, fed
// every rank's data (generated here from the same seeds, or gathered with MPI itself): a page
// whose code stops compiling, or stops doing what its text says, fails this test.
//
//   mpiexec -n 3 torch_docs_snippets    prints "rank R: N libtorch blocks of docs/ ran and checked"
//                                       and exits 0 on every rank, or names each failed check and
//                                       exits 1

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/sync_batch_norm.hpp>

#include "snippet_checks.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace snippet_checks;

namespace {

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", x);
  return text;
}

double worst(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Every value of the tensors, as f64 (exact for the f64 and integer tensors it gets), in one flat vector.
std::vector<double> flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<double> values;
  for (const auto& t : tensors) {
    const torch::Tensor c = t.detach().to(torch::kFloat64).contiguous().view(-1);
    values.insert(values.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return values;
}

bool bitwise_same_on_every_rank(const std::vector<double>& v) {  // checked with MPI alone
  std::vector<double> lo(v.size()), hi(v.size());
  MPI_Allreduce(v.data(), lo.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v.data(), hi.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return std::memcmp(lo.data(), v.data(), v.size() * sizeof(double)) == 0 &&
         std::memcmp(hi.data(), v.data(), v.size() * sizeof(double)) == 0;
}

// Every rank's rows of an f32 tensor (dimension 0), in rank order: MPI_Allgatherv alone.
torch::Tensor gather_rows(const torch::Tensor& mine, int size) {
  const torch::Tensor c = mine.detach().contiguous();
  const int row = static_cast<int>(c.numel() / std::max<int64_t>(c.size(0), 1));
  const int count = static_cast<int>(c.numel());
  std::vector<int> counts(static_cast<std::size_t>(size)), offsets(static_cast<std::size_t>(size));
  MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<int64_t> shape = c.sizes().vec();
  shape[0] = total / row;
  torch::Tensor all = torch::empty(shape, torch::kFloat32);
  MPI_Allgatherv(c.data_ptr<float>(), count, MPI_FLOAT, all.data_ptr<float>(), counts.data(), offsets.data(), MPI_FLOAT,
                 MPI_COMM_WORLD);
  return all;
}

// f64 while it lives: the join check compares with the oracle to 1e-12.
struct default_dtype_f64 {
  default_dtype_f64() { torch::set_default_dtype(caffe2::TypeMeta::Make<double>()); }
  ~default_dtype_f64() { torch::set_default_dtype(caffe2::TypeMeta::Make<float>()); }
  default_dtype_f64(const default_dtype_f64&) = delete;
  default_dtype_f64& operator=(const default_dtype_f64&) = delete;
};

struct batch_of_data {
  torch::Tensor x, y;
};

// Rank r's batches for the join block: rank 0 has one per rank, rank r > 0 has r, so that rank 0
// is the last to join and, at 3 ranks, the rank the buffers come from changes from 2 to 0.
int batch_count(int r, int size) { return r == 0 ? size : r; }

batch_of_data make_batch(int r, int step) {
  torch::manual_seed(static_cast<uint64_t>(1000 + 100 * r + step));
  return {torch::randn({4 + r, 6}) * (1 + r), torch::randn({4 + r, 2})};
}

// The join block's model: a BatchNorm for buffers that the ranks' batches move apart.
torch::nn::Sequential make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::BatchNorm1d(5), torch::nn::Tanh(), torch::nn::Linear(5, 2));
}

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& target) { return torch::mse_loss(out, target); }

// training.md, "Uneven inputs: join", its second block: the libtorch wrapper under uneven inputs.
void join(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  const default_dtype_f64 f64;
  const double lr = 0.1, momentum = 0.9;
  auto loss = mse;

  // The oracle, plain libtorch on this one process: a replica per rank, built as rank 0's model
  // (which the wrapper broadcasts). Step s: the ranks with more than s batches still train; the
  // buffers come from the highest of them (DDP's choice in a Join); each of them computes its
  // gradients, the sum of theirs (a joined rank adds zeros) divided by the world size replaces
  // each one's, and each steps its own SGD. At the end every rank holds the last joiner's values.
  std::vector<torch::nn::Sequential> replica;
  std::vector<std::unique_ptr<torch::optim::SGD>> replica_sgd;
  int most = 0, last_expected = 0;
  for (int r = 0; r < size; ++r) {
    replica.push_back(make_model(10));
    replica_sgd.push_back(std::make_unique<torch::optim::SGD>(replica.back()->parameters(),
                                                              torch::optim::SGDOptions(lr).momentum(momentum)));
    if (batch_count(r, size) >= most) most = batch_count(r, size), last_expected = r;  // the highest, if several
  }
  for (int step = 0; step < most; ++step) {
    std::vector<std::size_t> training;
    for (int r = 0; r < size; ++r)
      if (batch_count(r, size) > step) training.push_back(static_cast<std::size_t>(r));
    {
      const torch::NoGradGuard no_grad;
      auto from = replica[training.back()]->buffers();
      for (auto& other : replica) {
        auto to = other->buffers();
        for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
      }
    }
    for (std::size_t r : training) {
      const batch_of_data b = make_batch(static_cast<int>(r), step);
      replica_sgd[r]->zero_grad();
      loss(replica[r]->forward(b.x), b.y).backward();
    }
    const auto params = replica[training.front()]->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      torch::Tensor sum = torch::zeros_like(params[i]);
      for (std::size_t r : training) sum += replica[r]->parameters()[i].grad();
      const torch::Tensor average = sum / size;
      for (std::size_t r : training) replica[r]->parameters()[i].mutable_grad().copy_(average);
    }
    for (std::size_t r : training) replica_sgd[r]->step();
  }
  const auto& expected = replica[static_cast<std::size_t>(last_expected)];

  // The names the block uses: each rank's own model (the wrapper broadcasts rank 0's), its SGD,
  // its batches.
  torch::nn::Sequential model = make_model(static_cast<uint64_t>(10 + rank));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));
  std::vector<batch_of_data> my_batches;
  for (int step = 0; step < batch_count(rank, size); ++step) my_batches.push_back(make_batch(rank, step));

#include "torch_join.inc"

  expect(last == last_expected, "join (libtorch): the last rank to join is " + std::to_string(last) + ", expected " +
                                    std::to_string(last_expected), rank);
  const std::vector<double> params = flat(model->parameters()), buffers = flat(model->buffers());
  expect(bitwise_same_on_every_rank(params), "join (libtorch): the same parameters, bit for bit, on every rank", rank);
  expect(bitwise_same_on_every_rank(buffers), "join (libtorch): the same buffers, bit for bit, on every rank", rank);
  const std::vector<double> want_params = flat(expected->parameters()), want_buffers = flat(expected->buffers());
  double error = params.size() == want_params.size() && buffers.size() == want_buffers.size() ? 0 : 1e9;
  for (std::size_t i = 0; i < std::min(params.size(), want_params.size()); ++i)
    error = std::max(error, std::abs(params[i] - want_params[i]));
  for (std::size_t i = 0; i < std::min(buffers.size(), want_buffers.size()); ++i)
    error = std::max(error, std::abs(buffers[i] - want_buffers[i]));
  expect(error <= 1e-12, "join (libtorch): parameters and buffers as plain libtorch's steps give them (off by " +
                             number(error) + ")", rank);
  // Not vacuous: the steps moved the parameters from rank 0's first values.
  expect(worst(model->parameters()[0], make_model(10)->parameters()[0]) > 1e-3, "join (libtorch): the parameters moved", rank);
  ++blocks;
}

// training.md, "Synchronized batch normalization": convert_sync_batchnorm and a SyncBatchNorm.
void sync_batch_norm(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  torch::manual_seed(7);  // the same Linear on every rank

#include "torch_sync_batch_norm.inc"

  // convert_sync_batchnorm replaced the BatchNorm1d, and only it.
  auto layer = [&](std::size_t i) { return i < model->size() ? model->ptr(i) : nullptr; };
  auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(layer(0));
  expect(model->size() == 3 && linear && std::dynamic_pointer_cast<herd::torch::SyncBatchNormImpl>(layer(1)) &&
             std::dynamic_pointer_cast<torch::nn::ReLUImpl>(layer(2)),
         "SyncBatchNorm: the converted Sequential is Linear, SyncBatchNorm, ReLU", rank);
  for (const auto& child : model->children())
    expect(!std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(child), "SyncBatchNorm: a BatchNorm1d is left", rank);
  if (!linear || !layer(1)) return;
  // The normalization layer's values, whatever its type (a check below fails if it is not synchronized).
  auto norm = layer(1);
  const torch::Tensor weight = norm->named_parameters()["weight"], bias = norm->named_parameters()["bias"];
  const torch::Tensor norm_mean = norm->named_buffers()["running_mean"], norm_var = norm->named_buffers()["running_var"];

  // Rank r's batch has r + 2 rows; the oracle normalizes every rank's rows together (gathered
  // with MPI alone), in f64, with torch::batch_norm in training mode.
  auto mine = [&](int seed, std::vector<int64_t> shape) {
    torch::manual_seed(static_cast<uint64_t>(seed + rank));
    shape.insert(shape.begin(), 2 + rank);
    return torch::randn(shape) * 2 + 1;
  };
  int64_t begin = 0;
  for (int r = 0; r < rank; ++r) begin += 2 + r;
  model->train();
  const torch::Tensor x = mine(100, {784});
  const torch::Tensor y = model->forward(x);
  const torch::Tensor x_all = gather_rows(x, size).to(torch::kFloat64);
  torch::Tensor running_mean = torch::zeros({256}, torch::kFloat64), running_var = torch::ones({256}, torch::kFloat64);
  const torch::Tensor h_all = torch::nn::functional::linear(x_all, linear->weight.detach().to(torch::kFloat64),
                                                            linear->bias.detach().to(torch::kFloat64));
  const torch::Tensor y_all = torch::relu(torch::batch_norm(h_all, weight.detach().to(torch::kFloat64),
                                                            bias.detach().to(torch::kFloat64), running_mean,
                                                            running_var, true, 0.1, 1e-5, false));
  expect(worst(y, y_all.narrow(0, begin, 2 + rank)) <= 1e-4,
         "SyncBatchNorm: the converted model's output is BatchNorm over every rank's batch (off by " +
             number(worst(y, y_all.narrow(0, begin, 2 + rank))) + ")", rank);
  expect(worst(norm_mean, running_mean) <= 1e-5 && worst(norm_var, running_var) <= 1e-4,
         "SyncBatchNorm: the running statistics are those of every rank's batch", rank);

  // The module built directly: output and input gradient. Each rank's loss is sum(out * upstream)
  // on its rows, so each rank's input gradient is its rows of the gradient of the sum of them all.
  bn->train();
  const torch::Tensor z = mine(200, {64, 3}).requires_grad_(true);
  const torch::Tensor upstream = mine(300, {64, 3});
  const torch::Tensor out = bn->forward(z);
  (out * upstream).sum().backward();
  const torch::Tensor z_all = gather_rows(z, size).to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor upstream_all = gather_rows(upstream, size).to(torch::kFloat64);
  const torch::Tensor out_all = torch::batch_norm(z_all, torch::ones({64}, torch::kFloat64), torch::zeros({64}, torch::kFloat64),
                                                  {}, {}, true, 0.1, 1e-5, false);
  (out_all * upstream_all).sum().backward();
  expect(worst(out, out_all.narrow(0, begin, 2 + rank)) <= 1e-4,
         "SyncBatchNorm: the module's output is BatchNorm over every rank's batch", rank);
  expect(worst(z.grad(), z_all.grad().narrow(0, begin, 2 + rank)) <= 1e-4,
         "SyncBatchNorm: the input gradient is that of BatchNorm over every rank's batch", rank);
  ++blocks;
}

}  // namespace

int main(int argc, char** argv) {
  return snippet_checks::run_blocks(argc, argv, "libtorch blocks", [](herd::mpi_communicator& comm) {
    torch::set_num_threads(1);  // one core per rank
    join(comm);
    sync_batch_norm(comm);
  });
}
