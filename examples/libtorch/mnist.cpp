// Horovod's PyTorch MNIST example (examples/pytorch/pytorch_mnist.py) in C++, with libtorch for
// the model and herd in place of horovod.torch, trained on Fashion-MNIST:
//
//   mpiexec -n 2 build/examples/libtorch_mnist
//
// The steps map one to one onto the Python original:
//   hvd.init()                              herd::mpi::environment + herd::mpi_communicator
//   torch.cuda.set_device(hvd.local_rank()) torch::Device(kCUDA, herd::mpi::local_rank())
//   DistributedSampler                      herd::distributed_sampler (+ for_evaluation for test)
//   optim.SGD(lr * hvd.size(), momentum)    torch::optim::SGD, lr scaled by the world size
//   hvd.broadcast_parameters / _optimizer_state   herd::broadcast_parameters / _optimizer_state
//   hvd.DistributedOptimizer                herd::torch::DistributedDataParallel(model, comm): buckets
//                                           reduced during backward, as PyTorch's DDP; or, with
//                                           --reduction optimizer, Horovod's form:
//                                           herd::distributed_optimizer(sgd, torch_gradients(sgd), comm)
//   metric_average(test_loss)               herd::metric (a sample-weighted mean over the ranks)
//
// On GPUs (built with herd::nccl), the gradients are reduced over a herd::nccl_communicator made
// from the MPI one, on the GPU, as Horovod and DDP do with NCCL; the file stays g++-compiled.
//
// --model mlp trains an MLP 784-2048-2048-10 instead (23 MB of gradients per step, where
// overlapping the reduction with backward matters).
//
// benchmarks/vs_pytorch_ddp/run.sh runs this binary (with --steps and --epochs) against the same
// training under PyTorch DDP; the `summary:` and `phases:` lines at the end are for that script.
#include "../fashion_mnist/idx.hpp"

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/broadcast.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/gradients.hpp>

#include <mpi.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// ---------------------------------------------------------------------------------------------
// Command line

// Horovod's learning rate and momentum learn this net slowly on Fashion-MNIST (its dropout is
// heavy): measured with `mpiexec -n 2` on 2 cores, test accuracy 0.85 after 10 epochs, 0.88
// after 30, about 0.89 from 45 on; an epoch takes 3.5-4 s on quiet cores (README.md here).
constexpr int default_epochs = 50;
constexpr double default_lr = 0.01;        // Horovod's default, before scaling by the world size
constexpr double default_momentum = 0.5;   // Horovod's default
constexpr std::int64_t test_batch = 1000;  // Horovod's --test-batch-size

struct options {
  std::filesystem::path data = "/usr/share/datasets/fashion-mnist";
  int epochs = default_epochs;
  std::int64_t batch_size = 64;
  double lr = default_lr;
  double momentum = default_momentum;
  std::uint64_t seed = 42;
  int threads = 1;
  std::filesystem::path checkpoint;  // empty: none
  std::size_t train_samples = 0;     // 0: all
  std::size_t steps = 0;             // 0: a whole epoch
  bool mlp = false;                  // --model mlp
  bool ddp = true;                   // --reduction ddp (else optimizer)
  std::size_t bucket_bytes = 0;      // 0: herd's defaults (1 MiB first bucket, then HERD_BUCKET_BYTES)
  bool help = false;
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: mpiexec -n N libtorch_mnist [options]\n"
               "Horovod's PyTorch MNIST example with libtorch and herd: a small CNN trained on Fashion-MNIST,\n"
               "data-parallel over the MPI ranks (one GPU per rank when CUDA is available, else the CPU).\n"
               "  --data DIR           the gzip IDX files (default /usr/share/datasets/fashion-mnist,\n"
               "                       from the Debian package dataset-fashion-mnist)\n"
               "  --epochs N           epochs to train (default %d)\n"
               "  --batch-size N       samples per rank and step (default 64)\n"
               "  --lr X               single-rank learning rate; SGD uses X times the number of ranks\n"
               "                       (default %g)\n"
               "  --momentum X         SGD momentum (default %g)\n"
               "  --seed N             initialization, dropout and shuffling seed (default 42)\n"
               "  --threads N          torch intra-op threads per rank (default 1: ranks share the cores)\n"
               "  --checkpoint PATH    rank 0 saves the model there (torch::save) after each epoch\n"
               "  --train-samples N    train on the first N training images only (quick runs)\n"
               "  --steps N            at most N steps per epoch (benchmarks)\n"
               "  --model cnn|mlp      Horovod's CNN (default), or an MLP 784-2048-2048-10 (23 MB of gradients)\n"
               "  --reduction ddp|optimizer\n"
               "                       ddp (default): herd::torch::DistributedDataParallel reduces buckets of\n"
               "                       gradients during backward; optimizer: herd::distributed_optimizer reduces\n"
               "                       them all after backward, as Horovod's DistributedOptimizer\n"
               "  --bucket-bytes N     with ddp: buckets of at most N bytes, the first included (as DDP's\n"
               "                       bucket_cap_mb; default: 1 MiB first, then HERD_BUCKET_BYTES or 25 MiB)\n"
               "  --help               this text\n",
               default_epochs, default_lr, default_momentum);
}

struct usage_error {
  std::string message;
};

template <class T> T parse_integer(std::string_view flag, std::string_view text, T minimum) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) throw usage_error{std::string(flag) + " " + std::string(text) + " is too large"};
  if (ec != std::errc() || end != text.data() + text.size() || value < minimum) {
    throw usage_error{std::string(flag) + " needs an integer of at least " + std::to_string(minimum) + ", not '" +
                      std::string(text) + "'"};
  }
  return value;
}

double parse_positive(std::string_view flag, std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || !std::isfinite(value) || value <= 0) {
    throw usage_error{std::string(flag) + " needs a positive number, not '" + copy + "'"};
  }
  return value;
}

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string_view> inline_value;  // --flag=value
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw usage_error{std::string(arg) + " needs a value"};
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      if (inline_value) throw usage_error{std::string(arg) + " takes no value"};
      o.help = true;
    } else if (arg == "--data") {
      o.data = std::string(value());
      if (o.data.empty()) throw usage_error{"--data needs a directory"};
    } else if (arg == "--epochs") {
      o.epochs = parse_integer<int>(arg, value(), 1);
    } else if (arg == "--batch-size") {
      o.batch_size = parse_integer<std::int64_t>(arg, value(), 1);
    } else if (arg == "--lr") {
      o.lr = parse_positive(arg, value());
    } else if (arg == "--momentum") {
      o.momentum = parse_positive(arg, value());
    } else if (arg == "--seed") {
      o.seed = parse_integer<std::uint64_t>(arg, value(), 0);
    } else if (arg == "--threads") {
      o.threads = parse_integer<int>(arg, value(), 1);
    } else if (arg == "--checkpoint") {
      o.checkpoint = std::string(value());
      if (o.checkpoint.empty()) throw usage_error{"--checkpoint needs a path"};
    } else if (arg == "--train-samples") {
      o.train_samples = parse_integer<std::size_t>(arg, value(), 1);
    } else if (arg == "--steps") {
      o.steps = parse_integer<std::size_t>(arg, value(), 1);
    } else if (arg == "--model") {
      const std::string_view v = value();
      if (v != "cnn" && v != "mlp") throw usage_error{"--model takes cnn or mlp, not '" + std::string(v) + "'"};
      o.mlp = v == "mlp";
    } else if (arg == "--reduction") {
      const std::string_view v = value();
      if (v != "ddp" && v != "optimizer") {
        throw usage_error{"--reduction takes ddp or optimizer, not '" + std::string(v) + "'"};
      }
      o.ddp = v == "ddp";
    } else if (arg == "--bucket-bytes") {
      o.bucket_bytes = parse_integer<std::size_t>(arg, value(), 1);
    } else {
      throw usage_error{"unknown option '" + std::string(argv[i]) + "'"};
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Model: Horovod's Net, layer for layer; or (mlp) an MLP 784-2048-2048-10.

struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool mlp = false) : mlp_(mlp) {
    if (mlp_) {
      fc1 = register_module("fc1", torch::nn::Linear(784, 2048));
      fc2 = register_module("fc2", torch::nn::Linear(2048, 2048));
      fc3 = register_module("fc3", torch::nn::Linear(2048, 10));
    } else {
      conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 10, 5)));
      conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(10, 20, 5)));
      conv2_drop = register_module("conv2_drop", torch::nn::Dropout2d());
      fc1 = register_module("fc1", torch::nn::Linear(320, 50));
      fc2 = register_module("fc2", torch::nn::Linear(50, 10));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    if (mlp_) {
      x = torch::relu(fc1->forward(x.view({-1, 784})));
      x = torch::relu(fc2->forward(x));
      return torch::log_softmax(fc3->forward(x), 1);
    }
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2->forward(x), 1);
  }

  bool mlp_;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::Dropout2d conv2_drop{nullptr};
  torch::nn::Linear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
};
TORCH_MODULE(Net);

// ---------------------------------------------------------------------------------------------
// Data

// One split as tensors: images [N, 1, 28, 28] float, normalized; labels [N] int64.
struct split_tensors {
  torch::Tensor images;
  torch::Tensor labels;
  std::size_t size() const { return static_cast<std::size_t>(labels.size(0)); }
};

// Pixels scaled to [0, 1], then standardized with Fashion-MNIST's training mean and standard
// deviation (Horovod's example uses MNIST's 0.1307 and 0.3081 the same way).
split_tensors to_tensors(idx::labeled_images& split) {
  const auto n = static_cast<std::int64_t>(split.inputs.count);
  const auto rows = static_cast<std::int64_t>(split.inputs.rows);
  const auto cols = static_cast<std::int64_t>(split.inputs.cols);
  split_tensors t;
  // from_blob borrows the bytes; the conversions below copy them, so the result owns its memory.
  t.images = torch::from_blob(split.inputs.pixels.data(), {n, 1, rows, cols}, torch::kUInt8)
                 .to(torch::kFloat32)
                 .div_(255.0)
                 .sub_(0.2860)
                 .div_(0.3530);
  t.labels = torch::from_blob(split.labels.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return t;
}

struct dataset {
  split_tensors train;
  split_tensors test;
};

dataset load_dataset(const std::filesystem::path& dir) {
  constexpr std::size_t side = 28;
  constexpr unsigned classes = 10;
  auto train = idx::read_split(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz", side, side, classes);
  auto test = idx::read_split(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz", side, side, classes);
  return {to_tensors(train), to_tensors(test)};
}

// The sampler's indices as an int64 tensor, for index_select.
torch::Tensor index_tensor(std::span<const std::size_t> indices) {
  torch::Tensor t = torch::empty({static_cast<std::int64_t>(indices.size())}, torch::kInt64);
  auto* out = t.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < indices.size(); ++i) out[i] = static_cast<std::int64_t>(indices[i]);
  return t;
}

// ---------------------------------------------------------------------------------------------
// GPUs

// Built with herd::nccl (CMake links it wherever NCCL and the CUDA toolkit are found), CUDA
// gradients are reduced on their GPU over a nccl_communicator: libtorch's own kernels pack and
// scale them in this g++-compiled file. Without it, herd reaches host memory only, so on a GPU
// the gradients travel through host copies: the distributed optimizer reduces those, and this
// wrapper's step() copies them back before SGD steps.
#if !defined(HERD_WITH_NCCL)
class host_staged_sgd {
 public:
  explicit host_staged_sgd(torch::optim::SGD& sgd) : sgd_(sgd) {}

  std::vector<herd::buffer_view> gradients() {
    std::vector<herd::buffer_view> views;
    std::size_t i = 0;
    for (auto& group : sgd_.param_groups()) {
      for (auto& p : group.params()) {
        if (i == host_.size()) {
          host_.push_back(torch::empty(p.sizes(), torch::TensorOptions().dtype(p.dtype()).pinned_memory(true)));
        }
        if (p.grad().defined()) host_[i].copy_(p.grad());
        else host_[i].zero_();  // unused this step: every rank must still reduce the same list
        views.push_back(herd::view_of(host_[i]));
        ++i;
      }
    }
    return views;
  }

  void step() {
    std::size_t i = 0;
    for (auto& group : sgd_.param_groups()) {
      for (auto& p : group.params()) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
        p.mutable_grad().copy_(host_[i++]);
      }
    }
    sgd_.step();
  }

 private:
  torch::optim::SGD& sgd_;
  std::vector<torch::Tensor> host_;
};
#endif

// ---------------------------------------------------------------------------------------------
// Training

struct evaluation {
  double loss = 0;
  double accuracy = 0;
};

// Test loss and accuracy over all ranks: each rank scores its own slice of the test set (no
// padding, so every image counts once), and herd::metric weighs each rank's means by its count.
evaluation evaluate(Net& model, const split_tensors& test, torch::Device device, herd::mpi_communicator& comm) {
  model->eval();
  torch::NoGradGuard no_grad;
  const herd::distributed_sampler shard = herd::distributed_sampler::for_evaluation(test.size(), comm);
  herd::metric loss;
  herd::metric accuracy;
  for (std::span<const std::size_t> batch : shard.batches(static_cast<std::size_t>(test_batch))) {
    const torch::Tensor index = index_tensor(batch);
    const torch::Tensor x = test.images.index_select(0, index).to(device);
    const torch::Tensor y = test.labels.index_select(0, index).to(device);
    const torch::Tensor output = model->forward(x);
    const auto n = static_cast<double>(batch.size());
    loss.add(torch::nll_loss(output, y).item<double>(), n);
    accuracy.add(output.argmax(1).eq(y).sum().item<double>() / n, n);
  }
  return {loss.global_mean(comm), accuracy.global_mean(comm)};
}

// Wall time of each part of a training step, on this rank, summed over steps.
struct phase_times {
  double batch = 0;      // index_select of the batch (and the copy to the device)
  double forward = 0;    // forward pass and loss
  double backward = 0;   // backward pass (without the reduction's time on this thread)
  double reduce = 0;     // herd's gradient reduction on the caller's thread (waiting for the other
                         // ranks included); with DDP it happens inside backward
  double optimizer = 0;  // SGD's update (the rest of the step)
};

// SGD stepped after DistributedDataParallel reduced the gradients during backward; the shape of
// herd::distributed_optimizer (step, reduce_seconds, overlap) for run_epochs.
template <class Communicator> struct ddp_step {
  herd::torch::DistributedDataParallel<Net, Communicator>& ddp;
  torch::optim::SGD& sgd;
  bool step() {
    sgd.step();
    return true;
  }
  double reduce_seconds() const { return ddp.overlap().exposed; }
  const herd::overlap_stats& overlap() const { return ddp.overlap(); }
};

// Writes to a temporary file first, so a crash mid-write never leaves a truncated checkpoint.
// Returns an empty string or what went wrong.
std::string save_checkpoint(Net& model, const std::filesystem::path& path) {
  const std::filesystem::path temporary = path.string() + ".tmp";
  try {
    torch::save(model, temporary.string());
    std::filesystem::rename(temporary, path);
  } catch (const std::exception& e) {
    return "cannot save the checkpoint " + path.string() + ": " + e.what();
  }
  return {};
}

// A 64-bit FNV-1a digest of the parameters' bytes, in the module's order: two runs that end with
// the same bits print the same digest (tests compare runs with it; torch::save's archive differs
// from run to run even for the same tensors).
std::uint64_t parameters_digest(Net& model) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& p : model->parameters()) {
    const torch::Tensor t = p.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ULL;
  }
  return h;
}

// The epochs, with `opt` the distributed optimizer over `sgd` (or ddp_step): a template because
// on a GPU it reduces over NCCL, or wraps host_staged_sgd rather than SGD itself.
// `forward`: the model's, or the DDP wrapper's (which must see every training forward).
template <class DistributedOptimizer, class Forward>
int run_epochs(const options& opts, herd::mpi_communicator& comm, Net& model, torch::optim::SGD& sgd,
               DistributedOptimizer& opt, Forward& forward, const dataset& data, std::size_t train_count,
               torch::Device device) {
  const bool lead = comm.rank() == 0;
  const auto world = static_cast<std::size_t>(comm.size());
  herd::distributed_sampler sampler(train_count, comm, {.shuffle = true, .seed = opts.seed});
  const auto batch_size = static_cast<std::size_t>(opts.batch_size);
  std::size_t steps = sampler.batch_count(batch_size);
  if (opts.steps != 0 && opts.steps < steps) steps = opts.steps;

  if (lead) {
    std::printf("libtorch_mnist: %d rank%s on %s, %d intra-op / %d inter-op torch threads per rank, %zu training "
                "samples (%zu per rank), batch %zu per rank, %zu steps per epoch, SGD lr %g (%g x %d ranks) momentum %g\n",
                comm.size(), comm.size() == 1 ? "" : "s", device.is_cuda() ? "CUDA" : "CPU", static_cast<int>(at::get_num_threads()),
                static_cast<int>(at::get_num_interop_threads()), train_count, sampler.size(), batch_size, steps, opts.lr * comm.size(),
                opts.lr, comm.size(), opts.momentum);
    std::fflush(stdout);
  }

  evaluation result{-1, -1};
  double train_seconds_total = 0;  // the slowest rank's step-loop time, summed over epochs
  double local_seconds_total = 0;  // this rank's
  std::int64_t samples_total = 0;  // over all ranks
  phase_times phases;
  const double reduce_start = opt.reduce_seconds();
  const herd::overlap_stats overlap_start = opt.overlap();

  for (int epoch = 0; epoch < opts.epochs; ++epoch) {
    model->train();
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const herd::batch_range batches = sampler.batches(batch_size);
    herd::metric train_loss;
    double running_loss = 0;  // this rank's, since the last progress line
    std::size_t running_batches = 0;

    // Ranks start the timed loop together, so that the slowest rank's time is the loop's alone.
    herd::barrier(comm);
    const auto start = clock_type::now();
    auto last_print = start;
    for (std::size_t step = 0; step < steps; ++step) {
      const std::span<const std::size_t> batch = batches[step];
      auto t0 = clock_type::now();
      const torch::Tensor index = index_tensor(batch);
      const torch::Tensor x = data.train.images.index_select(0, index).to(device);
      const torch::Tensor y = data.train.labels.index_select(0, index).to(device);
      auto t1 = clock_type::now();
      sgd.zero_grad();
      const torch::Tensor loss = torch::nll_loss(forward(x), y);
      auto t2 = clock_type::now();
      const double r0 = opt.reduce_seconds();
      loss.backward();  // with DDP, buckets reduce meanwhile, and the last ones are waited for here
      auto t3 = clock_type::now();
      const double r1 = opt.reduce_seconds();
      opt.step();  // without DDP, averages the gradients over the ranks first; then SGD steps
      auto t4 = clock_type::now();
      const double r2 = opt.reduce_seconds();
      phases.batch += std::chrono::duration<double>(t1 - t0).count();
      phases.forward += std::chrono::duration<double>(t2 - t1).count();
      phases.backward += std::chrono::duration<double>(t3 - t2).count() - (r1 - r0);
      phases.reduce += r2 - r0;
      phases.optimizer += std::chrono::duration<double>(t4 - t3).count() - (r2 - r1);

      const double value = loss.item<double>();
      train_loss.add(value, static_cast<double>(batch.size()));
      running_loss += value;
      ++running_batches;
      // Only rank 0 looks at the clock, so the others never wait on a print.
      if (lead && seconds_since(last_print) >= 2.0) {
        last_print = clock_type::now();
        const double samples = static_cast<double>((step + 1) * batch_size * world);
        std::printf("epoch %d/%d  batch %zu/%zu  %.0f samples/s  loss %.4f\n", epoch + 1, opts.epochs, step + 1, steps,
                    samples / seconds_since(start), running_loss / static_cast<double>(running_batches));
        std::fflush(stdout);
        running_loss = 0;
        running_batches = 0;
      }
    }
    const double train_seconds = seconds_since(start);

    std::array<double, 1> slowest = {train_seconds};
    herd::allreduce(slowest, comm, herd::reduce_op::max);
    std::array<std::int64_t, 1> samples = {0};  // herd has no u64
    for (std::size_t step = 0; step < steps; ++step) samples[0] += static_cast<std::int64_t>(batches[step].size());
    herd::allreduce(samples, comm, herd::reduce_op::sum);
    train_seconds_total += slowest[0];
    local_seconds_total += train_seconds;
    samples_total += samples[0];

    const double mean_loss = train_loss.global_mean(comm);
    const auto eval_start = clock_type::now();
    result = evaluate(model, data.test, device, comm);
    const double eval_seconds = seconds_since(eval_start);

    std::array<int, 1> save_failed = {0};
    if (!opts.checkpoint.empty() && lead) {
      const std::string problem = save_checkpoint(model, opts.checkpoint);
      if (!problem.empty()) {
        std::fprintf(stderr, "libtorch_mnist: %s\n", problem.c_str());
        save_failed[0] = 1;
      }
    }
    // Every rank learns whether rank 0 could save, so that all stop together if not.
    if (!opts.checkpoint.empty()) herd::broadcast(save_failed, comm, 0);
    if (save_failed[0] != 0) return 1;

    if (lead) {
      std::printf("epoch %d/%d: train loss %.4f  test loss %.4f  test accuracy %.4f  time %.1f s (train %.1f s, "
                  "eval %.1f s)  %.0f samples/s\n",
                  epoch + 1, opts.epochs, mean_loss, result.loss, result.accuracy, slowest[0] + eval_seconds,
                  slowest[0], eval_seconds, static_cast<double>(samples[0]) / slowest[0]);
      std::fflush(stdout);
    }
  }

  // Fractions of this rank's step-loop time, averaged over the ranks.
  const double local = local_seconds_total > 0 ? local_seconds_total : 1.0;
  const double reduce_fraction = herd::average((opt.reduce_seconds() - reduce_start) / local, comm);
  const double per_step = 1e3 / static_cast<double>(steps * static_cast<std::size_t>(opts.epochs));
  // The reduction's own time (on the progress thread for buckets but the last; on the caller's
  // without buckets) and the part of it the caller waited for after its backward pass: the rest
  // was hidden by it.
  const herd::overlap_stats& o = opt.overlap();
  const bool overlapped = o.steps > overlap_start.steps;
  const double communication = overlapped ? o.communication - overlap_start.communication : phases.reduce;
  const double waited = overlapped ? o.waiting - overlap_start.waiting : phases.reduce;
  const std::array<double, 7> mine = {phases.batch, phases.forward,   phases.backward, phases.reduce,
                                      phases.optimizer, communication, waited};
  std::array<double, 7> mean{};
  for (std::size_t i = 0; i < mine.size(); ++i) mean[i] = herd::average(mine[i], comm) * per_step;
  if (lead) {
    std::printf("final test accuracy: %.4f\n", result.accuracy);
    std::printf("parameters digest: %016llx\n", static_cast<unsigned long long>(parameters_digest(model)));
    std::printf("summary: ranks=%d epochs=%d seconds_per_epoch=%.3f samples_per_second=%.1f reduce_fraction=%.4f "
                "test_accuracy=%.4f\n",
                comm.size(), opts.epochs, train_seconds_total / opts.epochs,
                static_cast<double>(samples_total) / train_seconds_total, reduce_fraction, result.accuracy);
    std::printf("phases: ms_per_step batch=%.3f forward=%.3f backward=%.3f reduce=%.3f optimizer=%.3f\n", mean[0],
                mean[1], mean[2], mean[3], mean[4]);
    std::printf("overlap: ms_per_step communication=%.3f waited=%.3f hidden=%.3f\n", mean[5], mean[6],
                mean[5] - mean[6]);
    std::fflush(stdout);
  }
  return 0;
}

herd::optimizer_options bucket_options(const options& opts) {
  herd::optimizer_options o;
  if (opts.bucket_bytes != 0) o.bucket_bytes = o.first_bucket_bytes = opts.bucket_bytes;
  return o;
}

int train(const options& opts, herd::mpi_communicator& comm) {
  const bool lead = comm.rank() == 0;
  torch::set_num_threads(opts.threads);

  // Every rank reads the files and the ranks agree on success before going on, so a missing file
  // on any of them ends every rank with exit status 1 instead of leaving the others waiting.
  std::optional<dataset> data;
  std::string problem;
  try {
    data = load_dataset(opts.data);
  } catch (const std::exception& e) {
    problem = e.what();
  }
  std::array<std::int32_t, 1> first_failing = {problem.empty() ? comm.size() : comm.rank()};
  herd::allreduce(first_failing, comm, herd::reduce_op::min);
  if (first_failing[0] < comm.size()) {
    if (comm.rank() == first_failing[0]) {  // one message, from the lowest failing rank
      if (lead) std::fprintf(stderr, "libtorch_mnist: %s\n", problem.c_str());
      else std::fprintf(stderr, "libtorch_mnist (rank %d): %s\n", comm.rank(), problem.c_str());
    }
    return 1;
  }
  std::size_t train_count = data->train.size();
  if (opts.train_samples != 0 && opts.train_samples < train_count) train_count = opts.train_samples;

  // One GPU per rank on a node, as Horovod's torch.cuda.set_device(hvd.local_rank()).
  torch::Device device(torch::kCPU);
  if (torch::cuda::is_available()) {
    const int local = herd::mpi::local_rank();
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local % static_cast<int>(torch::cuda::device_count())));
  }

  torch::manual_seed(opts.seed);
  Net model(opts.mlp);
  torch::optim::SGD sgd(model->parameters(),
                        torch::optim::SGDOptions(opts.lr * comm.size()).momentum(opts.momentum));
  // Rank 0's initial weights and optimizer state everywhere. herd broadcasts host memory from a
  // g++-compiled file, so this happens before the model moves to a GPU.
  herd::broadcast_parameters(*model, comm, 0);
  herd::broadcast_optimizer_state(sgd, comm, 0);
  // Different dropout masks per rank, as independent workers would draw (Horovod seeds every
  // rank alike, which makes the ranks drop the same units).
  torch::manual_seed(opts.seed + static_cast<std::uint64_t>(comm.rank()) + 1);

  if (device.is_cuda()) {
    // Module::to keeps each parameter's TensorImpl, which keys SGD's state; move that state too.
    model->to(device);
    for (auto& entry : sgd.state()) {
      auto& state = static_cast<torch::optim::SGDParamState&>(*entry.second);
      state.momentum_buffer(state.momentum_buffer().to(device));
    }
#if defined(HERD_WITH_NCCL)
    herd::nccl_communicator gpus(comm, device.index());
    if (opts.ddp) {
      herd::torch::DistributedDataParallel ddp(model, gpus, bucket_options(opts));
      ddp_step<herd::nccl_communicator> opt{ddp, sgd};
      return run_epochs(opts, comm, model, sgd, opt, ddp, *data, train_count, device);
    }
    herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), gpus);
    return run_epochs(opts, comm, model, sgd, opt, model, *data, train_count, device);
#else
    host_staged_sgd staged(sgd);
    herd::distributed_optimizer opt(staged, [&staged] { return staged.gradients(); }, comm);
    return run_epochs(opts, comm, model, sgd, opt, model, *data, train_count, device);
#endif
  }
  if (opts.ddp) {
    herd::torch::DistributedDataParallel ddp(model, comm, bucket_options(opts));  // checks and broadcasts again: a no-op here
    ddp_step<herd::mpi_communicator> opt{ddp, sgd};
    return run_epochs(opts, comm, model, sgd, opt, ddp, *data, train_count, device);
  }
  herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm);
  return run_epochs(opts, comm, model, sgd, opt, model, *data, train_count, device);
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  int status = 0;
  {
    herd::mpi_communicator comm;
    const bool lead = comm.rank() == 0;
    options opts;
    try {
      opts = parse_options(argc, argv);
    } catch (const usage_error& e) {
      // Every rank sees the same arguments, so every rank stops here; rank 0 explains.
      if (lead) {
        std::fprintf(stderr, "libtorch_mnist: %s\n", e.message.c_str());
        print_usage(stderr);
      }
      return 2;
    }
    if (opts.help) {
      if (lead) print_usage(stdout);
      return 0;
    }
    try {
      status = train(opts, comm);
    } catch (const std::exception& e) {
      // herd raises its errors on every rank together, but others (out of memory, a libtorch
      // error) may hit one rank while the rest wait in a collective: end the whole job.
      std::fprintf(stderr, "libtorch_mnist (rank %d): %s\n", comm.rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  return status;
}
