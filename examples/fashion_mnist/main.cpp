// Data-parallel training of an MLP on Fashion-MNIST with herd, the way a user of an existing
// tensor library (here Eigen) would add it to a single-process training loop:
//
//   mpiexec -n 2 build/examples/fashion_mnist
//
// Every rank holds the whole model and the whole dataset; each epoch, herd::distributed_sampler
// hands each rank its own share of the shuffled training set, and herd::distributed_optimizer
// averages the gradients over the ranks before every SGD step, so the ranks stay identical.
#include "idx.hpp"
#include "mlp.hpp"

#include <herd/herd.hpp>
#include <herd/checkpoint/checkpoint.hpp>

#include <Eigen/Core>
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
#include <type_traits>
#include <vector>

// herd's one customization point, for the two Eigen types the model uses. Both are dense and
// column-major with contiguous storage, so data() and size() describe the whole tensor.
template <> struct herd::tensor_traits<Eigen::MatrixXf> {
  static void* data(Eigen::MatrixXf& t) { return t.data(); }
  static std::size_t size(const Eigen::MatrixXf& t) { return static_cast<std::size_t>(t.size()); }
  static herd::dtype dtype(const Eigen::MatrixXf&) { return herd::dtype::f32; }
  static herd::device device(const Eigen::MatrixXf&) { return herd::device::cpu(); }
};

template <> struct herd::tensor_traits<Eigen::VectorXf> {
  static void* data(Eigen::VectorXf& t) { return t.data(); }
  static std::size_t size(const Eigen::VectorXf& t) { return static_cast<std::size_t>(t.size()); }
  static herd::dtype dtype(const Eigen::VectorXf&) { return herd::dtype::f32; }
  static herd::device device(const Eigen::VectorXf&) { return herd::device::cpu(); }
};

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// f32 values times `scale` rounded into a tensor of f16 or bf16, and back.
void round_into(herd::host_tensor& low, const herd::buffer_view& f32, float scale) {
  const auto* in = static_cast<const float*>(f32.data);
  herd::visit(low.type(), [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, herd::half> || std::is_same_v<T, herd::bfloat16>) {
      auto* out = static_cast<T*>(low.data());
      for (std::size_t i = 0; i < low.count(); ++i) out[i] = T(in[i] * scale);
    }
  });
}

void widen_into(const herd::buffer_view& f32, herd::host_tensor& low) {
  auto* out = static_cast<float*>(f32.data);
  herd::visit(low.type(), [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, herd::half> || std::is_same_v<T, herd::bfloat16>) {
      const auto* in = static_cast<const T*>(low.data());
      for (std::size_t i = 0; i < low.count(); ++i) out[i] = static_cast<float>(in[i]);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Command line

// Chosen on the real data for `mpiexec -n 2`: about 0.88-0.89 test accuracy in 12 epochs of a few
// seconds each. A base rate of 0.01 (0.02 once scaled for 2 ranks) ends higher and steadier than
// 0.02 or 0.05, which overshoot without a decay.
constexpr int default_epochs = 12;
constexpr double default_lr = 0.01;

struct options {
  std::filesystem::path data = "/usr/share/datasets/fashion-mnist";
  int epochs = default_epochs;
  std::size_t batch_size = 64;
  double lr = default_lr;
  std::uint64_t seed = 42;
  std::filesystem::path checkpoint;  // empty: no checkpoints
  bool resume = false;
  std::size_t train_samples = 0;  // 0: all
  bool overlap = false;           // mark gradients ready during backward (buckets)
  herd::dtype precision = herd::dtype::f32;  // f16/bf16: parameters and gradients on the wire
  bool help = false;
};

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: mpiexec -n N fashion_mnist [options]\n"
               "Trains an MLP 784-256-128-10 on Fashion-MNIST, data-parallel over the MPI ranks.\n"
               "  --data DIR           the gzip IDX files (default /usr/share/datasets/fashion-mnist,\n"
               "                       from the Debian package dataset-fashion-mnist)\n"
               "  --epochs N           epochs to train (default %d)\n"
               "  --batch-size N       samples per rank and step (default 64)\n"
               "  --lr X               single-rank learning rate, scaled by the number of ranks after a\n"
               "                       one-epoch warm-up (default %g)\n"
               "  --seed N             initialization and shuffling seed (default 42)\n"
               "  --checkpoint PATH    rank 0 saves the model, optimizer state and epoch after each epoch\n"
               "  --resume             continue from --checkpoint PATH if it exists\n"
               "  --train-samples N    train on the first N training images only (quick runs)\n"
               "  --overlap            reduce gradients in buckets during the backward pass, each layer's\n"
               "                       as soon as it is computed (mark_ready), instead of after it\n"
               "  --precision P        f32 (default), f16 or bf16: parameters kept in P with f32 master\n"
               "                       weights and a dynamic loss scale, gradients reduced in P; the\n"
               "                       matrix products still run in f32\n"
               "  --help               this text\n",
               default_epochs, default_lr);
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
    const auto no_value = [&] {
      if (inline_value) throw usage_error{std::string(arg) + " takes no value"};
    };
    if (arg == "--help" || arg == "-h") {
      no_value();
      o.help = true;
    } else if (arg == "--data") {
      o.data = std::string(value());
      if (o.data.empty()) throw usage_error{"--data needs a directory"};
    } else if (arg == "--epochs") {
      o.epochs = parse_integer<int>(arg, value(), 1);
    } else if (arg == "--batch-size") {
      o.batch_size = parse_integer<std::size_t>(arg, value(), 1);
    } else if (arg == "--lr") {
      o.lr = parse_positive(arg, value());
    } else if (arg == "--seed") {
      o.seed = parse_integer<std::uint64_t>(arg, value(), 0);
    } else if (arg == "--checkpoint") {
      o.checkpoint = std::string(value());
      if (o.checkpoint.empty()) throw usage_error{"--checkpoint needs a path"};
    } else if (arg == "--overlap") {
      no_value();
      o.overlap = true;
    } else if (arg == "--resume") {
      no_value();
      o.resume = true;
    } else if (arg == "--train-samples") {
      o.train_samples = parse_integer<std::size_t>(arg, value(), 1);
    } else if (arg == "--precision") {
      const std::string_view p = value();
      if (p == "f32") o.precision = herd::dtype::f32;
      else if (p == "f16") o.precision = herd::dtype::f16;
      else if (p == "bf16") o.precision = herd::dtype::bf16;
      else throw usage_error{"--precision takes f32, f16 or bf16, not '" + std::string(p) + "'"};
    } else {
      throw usage_error{"unknown option '" + std::string(argv[i]) + "'"};
    }
  }
  if (o.resume && o.checkpoint.empty()) throw usage_error{"--resume needs --checkpoint PATH"};
  if (o.precision != herd::dtype::f32 && o.overlap) {
    throw usage_error{"--precision f16/bf16 reduces after the backward pass; drop --overlap"};
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Data

struct dataset {
  idx::labeled_images train;
  idx::labeled_images test;
};

dataset load_dataset(const std::filesystem::path& dir) {
  constexpr std::size_t side = 28;
  constexpr unsigned classes = 10;
  dataset d;
  d.train = idx::read_split(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz", side, side, classes);
  d.test = idx::read_split(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz", side, side, classes);
  return d;
}

// Pixel byte -> model input: scaled to [0, 1], then standardized with Fashion-MNIST's training
// mean and standard deviation, which keeps the first layer's pre-activations near unit scale.
std::array<float, 256> make_pixel_table() {
  std::array<float, 256> table{};
  for (std::size_t v = 0; v < table.size(); ++v) table[v] = (static_cast<float>(v) / 255.0f - 0.2860f) / 0.3530f;
  return table;
}

// Copies the samples `indices` of `split` into x (one column each) and y.
void gather(const idx::labeled_images& split, std::span<const std::size_t> indices, const std::array<float, 256>& table,
            Eigen::MatrixXf& x, std::vector<std::uint8_t>& y) {
  const auto n = static_cast<Eigen::Index>(indices.size());
  x.resize(fashion::mlp::inputs, n);  // a no-op unless the batch size changed
  y.resize(indices.size());
  const std::size_t pixels = split.inputs.pixels_per_image();
  for (Eigen::Index j = 0; j < n; ++j) {
    const std::size_t sample = indices[static_cast<std::size_t>(j)];
    const std::uint8_t* src = split.inputs.image(sample);
    float* dst = x.col(j).data();
    for (std::size_t k = 0; k < pixels; ++k) dst[k] = table[src[k]];
    y[static_cast<std::size_t>(j)] = split.labels[sample];
  }
}

// Test accuracy over all ranks: each rank scores its own slice of the test set (no padding,
// so no image counts twice), and the correct and sample counts are summed.
double evaluate(fashion::mlp& model, const idx::labeled_images& test, const std::array<float, 256>& table,
                herd::mpi_communicator& comm) {
  herd::distributed_sampler shard = herd::distributed_sampler::for_evaluation(test.labels.size(), comm);
  Eigen::MatrixXf x;
  std::vector<std::uint8_t> y;
  std::array<std::int64_t, 2> counts = {0, 0};  // correct, scored
  for (std::span<const std::size_t> batch : shard.batches(1000)) {
    gather(test, batch, table, x, y);
    counts[0] += static_cast<std::int64_t>(model.forward(x, y).correct);
    counts[1] += static_cast<std::int64_t>(batch.size());
  }
  herd::allreduce(counts, comm, herd::reduce_op::sum);
  return counts[1] > 0 ? static_cast<double>(counts[0]) / static_cast<double>(counts[1]) : 0.0;
}

// ---------------------------------------------------------------------------------------------
// Training

int train(const options& opts, herd::mpi_communicator& comm) {
  const bool lead = comm.rank() == 0;  // the only rank that prints

  // Every rank reads the files (each needs all of the training set, as the shuffle moves samples
  // between ranks every epoch). The ranks agree on success before going on, so a missing file on
  // any of them ends every rank with exit status 1 instead of leaving the others waiting.
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
    // The lowest failing rank reports, so the message appears once.
    if (comm.rank() == first_failing[0]) {
      if (lead) std::fprintf(stderr, "fashion_mnist: %s\n", problem.c_str());
      else std::fprintf(stderr, "fashion_mnist (rank %d): %s\n", comm.rank(), problem.c_str());
    }
    return 1;
  }

  std::size_t train_count = data->train.labels.size();
  if (opts.train_samples != 0 && opts.train_samples < train_count) train_count = opts.train_samples;
  const std::array<float, 256> table = make_pixel_table();

  // The model, identical on every rank: same seed, and rank 0's values broadcast to be sure.
  fashion::mlp model(opts.seed);
  const std::vector<herd::buffer_view> params = herd::views(model.w1, model.b1, model.w2, model.b2, model.w3, model.b3);
  const std::vector<herd::buffer_view> grads =
      herd::views(model.grad_w1, model.grad_b1, model.grad_w2, model.grad_b2, model.grad_w3, model.grad_b3);
  herd::broadcast_parameters(params, comm, 0);

  herd::sgd sgd(params, grads, {.lr = opts.lr, .momentum = 0.9});
  // This model has 0.9 MB of gradients, under DDP's 1 MiB first bucket: a first bucket of 128 KiB
  // holds the last two layers' gradients, which then reduce (with --overlap) while the first
  // layer's are computed; the first layer's gradients make the second bucket.
  herd::distributed_optimizer opt(sgd, grads, comm, {.first_bucket_bytes = 128 << 10});

  // --precision f16|bf16: the parameters live in f16/bf16, and SGD updates f32 masters of them
  // (herd::mixed_precision), which are rounded back after each step. Eigen's matrix products run in
  // f32 (its f16 ones are slow), on the rounded parameters: so the low precision is in the weights
  // and on the wire. Each step's f32 gradients are multiplied by the loss scale (as scaling the loss
  // would, backward being linear in it), rounded into f16/bf16, averaged in that dtype, and
  // unscaled into f32 by the mixed_precision step, which skips (on every rank) a step that overflowed.
  const bool low = opts.precision != herd::dtype::f32;
  std::vector<herd::host_tensor> low_params, low_grads;
  std::vector<herd::buffer_view> low_param_views, low_grad_views;
  for (const auto& p : params) {
    low_params.emplace_back(low ? opts.precision : herd::dtype::f32, low ? p.count : 0);
    low_grads.emplace_back(low ? opts.precision : herd::dtype::f32, low ? p.count : 0);
  }
  for (std::size_t i = 0; low && i < params.size(); ++i) {
    round_into(low_params[i], params[i], 1.0f);
    widen_into(params[i], low_params[i]);  // the model computes with the rounded values
    low_param_views.push_back(low_params[i].view());
    low_grad_views.push_back(low_grads[i].view());
  }
  herd::loss_scaler scaler;
  std::optional<herd::mixed_precision<herd::sgd>> amp;
  std::optional<herd::distributed_optimizer<herd::mixed_precision<herd::sgd>, herd::mpi_communicator>> low_opt;
  if (low) {
    amp.emplace(low_param_views, low_grad_views, scaler, [&](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = opts.lr, .momentum = 0.9});
    });
    low_opt.emplace(*amp, low_grad_views, comm);
  }
  herd::sgd& stepped = low ? amp->inner() : sgd;  // the SGD whose rate follows the schedule

  herd::distributed_sampler sampler(train_count, comm, {.shuffle = true, .seed = opts.seed});
  const std::size_t steps_per_epoch = sampler.batch_count(opts.batch_size);
  // Goyal et al.: the rate grows with the global batch, reached gradually over the first epoch.
  const herd::scaled_learning_rate schedule{.base = opts.lr, .ranks = comm.size(), .warmup_steps = steps_per_epoch};

  // The checkpoint holds the parameters, SGD's state (momentum buffers and step count, which also
  // drives the schedule) and the number of finished epochs; the sampler's order follows from the
  // seed and the epoch, so nothing else is needed for a resumed run to continue bit for bit.
  std::int64_t epochs_done = 0;
  herd::checkpoint state;
  state.add("w1", model.w1).add("b1", model.b1).add("w2", model.w2).add("b2", model.b2).add("w3", model.w3).add(
      "b3", model.b3);
  if (low) {
    for (std::size_t i = 0; i < low_params.size(); ++i) state.add("low." + std::to_string(i), low_params[i]);
    state.add_optimizer_state("amp.", *amp);
  } else {
    state.add_optimizer_state("sgd.", sgd);
  }
  state.add_value("epochs_done", epochs_done);

  if (opts.resume) {
    if (state.load(opts.checkpoint, comm, 0)) {
      if (lead) std::printf("resumed from %s after epoch %lld\n", opts.checkpoint.c_str(), static_cast<long long>(epochs_done));
    } else if (lead) {
      std::printf("no checkpoint at %s yet; starting from scratch\n", opts.checkpoint.c_str());
    }
  }

  if (lead) {
    std::printf("fashion_mnist: %d rank%s, %zu training samples (%zu per rank), batch %zu per rank, %zu steps per epoch, "
                "lr %g -> %g\n",
                comm.size(), comm.size() == 1 ? "" : "s", train_count, sampler.size(), opts.batch_size, steps_per_epoch,
                schedule(0), schedule(steps_per_epoch));
    std::fflush(stdout);
  }

  Eigen::MatrixXf x;
  std::vector<std::uint8_t> y;
  double accuracy = -1;
  double train_seconds_total = 0;  // the slowest rank's, summed over this run's epochs
  int epochs_run = 0;
  double reduce_total = 0;
  double train_local_total = 0;

  for (auto epoch = static_cast<int>(epochs_done); epoch < opts.epochs; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    herd::metric train_loss;
    double running_loss = 0;  // this rank's since the last progress line
    std::size_t running_batches = 0;
    const double reduce_before = low ? low_opt->reduce_seconds() : opt.reduce_seconds();
    const auto start = clock_type::now();
    auto last_print = start;

    const herd::batch_range batches = sampler.batches(opts.batch_size);
    std::size_t step = 0;
    for (std::span<const std::size_t> batch : batches) {
      gather(data->train, batch, table, x, y);
      fashion::batch_result r;
      if (opts.overlap) {  // each layer's gradients start reducing while the layers below are computed
        r = model.train_batch(x, y, [&](fashion::mlp::gradient g) { opt.mark_ready(g); });
      } else {
        r = model.train_batch(x, y);
      }
      stepped.set_lr(schedule(stepped.steps()));
      if (low) {  // scaled and rounded gradients averaged in f16/bf16, then the masters' step
        for (std::size_t i = 0; i < grads.size(); ++i) round_into(low_grads[i], grads[i], static_cast<float>(scaler.scale()));
        low_opt->step();
        for (std::size_t i = 0; i < params.size(); ++i) widen_into(params[i], low_params[i]);
      } else {
        opt.step();  // averages the gradients over the ranks (waits for the buckets), then steps SGD
      }
      train_loss.add(r.loss, static_cast<double>(batch.size()));
      running_loss += r.loss;
      ++running_batches;
      ++step;
      // Only rank 0 looks at the clock, so the others never wait on a print.
      if (lead && std::chrono::duration<double>(clock_type::now() - last_print).count() >= 2.0) {
        last_print = clock_type::now();
        const double samples = static_cast<double>(step * opts.batch_size * static_cast<std::size_t>(comm.size()));
        std::printf("epoch %d/%d  batch %zu/%zu  %.0f samples/s  loss %.4f\n", epoch + 1, opts.epochs, step,
                    batches.size(), samples / seconds_since(start), running_loss / static_cast<double>(running_batches));
        std::fflush(stdout);
        running_loss = 0;
        running_batches = 0;
      }
    }
    const double train_seconds = seconds_since(start);
    const double reduce_seconds = (low ? low_opt->reduce_seconds() : opt.reduce_seconds()) - reduce_before;

    const double mean_loss = train_loss.global_mean(comm);
    const auto eval_start = clock_type::now();
    accuracy = evaluate(model, data->test, table, comm);
    const double eval_seconds = seconds_since(eval_start);

    std::array<double, 1> slowest = {train_seconds};
    herd::allreduce(slowest, comm, herd::reduce_op::max);
    const double fraction = herd::average(train_seconds > 0 ? reduce_seconds / train_seconds : 0.0, comm);
    train_seconds_total += slowest[0];
    reduce_total += reduce_seconds;
    train_local_total += train_seconds;
    ++epochs_run;

    if (!opts.checkpoint.empty()) {
      epochs_done = epoch + 1;
      state.save(opts.checkpoint, comm, 0);
    }
    if (lead) {
      std::printf("epoch %d/%d: train loss %.4f  test accuracy %.4f  time %.1f s (train %.1f s, eval %.1f s)  "
                  "gradient reduction %.1f%% of step time\n",
                  epoch + 1, opts.epochs, mean_loss, accuracy, train_seconds + eval_seconds, train_seconds,
                  eval_seconds, 100.0 * fraction);
      std::fflush(stdout);
    }
  }

  if (accuracy < 0) accuracy = evaluate(model, data->test, table, comm);  // resumed past the last epoch
  const double overall_fraction = herd::average(train_local_total > 0 ? reduce_total / train_local_total : 0.0, comm);
  if (lead) {
    if (opts.overlap) {
      const herd::overlap_stats& o = opt.overlap();
      const double per_step = o.steps > 0 ? 1e3 / static_cast<double>(o.steps) : 0.0;
      std::printf("overlap: %zu bucket(s), %zu steps, per step %.3f ms reducing, %.3f ms of it waited for\n",
                  opt.buckets().size(), o.steps, o.communication * per_step, o.waiting * per_step);
    }
    if (low) {
      std::printf("mixed precision: %s parameters and gradients, loss scale %g, %lld step(s) skipped for overflow\n",
                  std::string(herd::name(opts.precision)).c_str(), scaler.scale(), static_cast<long long>(scaler.skipped_steps()));
    }
    std::printf("final test accuracy: %.4f\n", accuracy);
    std::printf("summary: ranks=%d epochs=%d seconds_per_epoch=%.3f reduce_fraction=%.4f test_accuracy=%.4f\n",
                comm.size(), opts.epochs, epochs_run > 0 ? train_seconds_total / epochs_run : 0.0, overall_fraction,
                accuracy);
    std::fflush(stdout);
  }
  return 0;
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
        std::fprintf(stderr, "fashion_mnist: %s\n", e.message.c_str());
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
      // herd raises its errors on every rank together, but other failures (out of memory, say)
      // may hit one rank alone while the others wait in a collective: abort the whole job.
      std::fprintf(stderr, "fashion_mnist (rank %d): %s\n", comm.rank(), e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  return status;
}
