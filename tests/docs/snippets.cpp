// The code blocks of README.md, docs/training.md and docs/api.md, as the pages show them (the
// build copies each block into an .inc file that this program includes), around the names each
// block uses. Each block runs on every rank and its result is checked against the same arithmetic
// done here in plain loops, or against MPI itself: a page whose code stops compiling, or stops
// doing what its text says, fails this test.
//
//   mpiexec -n 3 docs_snippets    prints "rank R: N blocks of docs/ ran and checked" and exits 0
//                                 on every rank, or names each failed check and exits 1

#include <herd/herd.hpp>

#include "snippet_checks.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

using namespace snippet_checks;

namespace {

bool close(double a, double b, double relative = 1e-6) { return std::abs(a - b) <= relative * std::max(1.0, std::abs(b)); }

bool same_on_every_rank(const std::vector<float>& v) {  // checked with MPI alone
  std::vector<float> lo(v.size()), hi(v.size());
  MPI_Allreduce(v.data(), lo.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v.data(), hi.data(), static_cast<int>(v.size()), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

struct dataset_stand_in {
  std::size_t size() const { return 1000; }
};

// training.md, the opening loop: sampler, broadcast, distributed_optimizer over herd::sgd; and
// README.md's, the same program, run and checked alike.
enum class page { training_md, readme };

void training_loop(herd::mpi_communicator& comm, page from) {
  const int rank = comm.rank(), size = comm.size();
  const std::string name = from == page::readme ? "training loop (README.md)" : "training loop (docs/training.md)";
  dataset_stand_in dataset;
  const std::uint64_t epochs = 2;
  std::vector<float> w(5), b(2), grad_w(5), grad_b(2);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(10 * rank + static_cast<int>(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(-rank);
  std::vector<int> seen(dataset.size(), 0);
  std::size_t steps = 0;
  auto forward_backward = [&](std::span<const std::size_t> batch) {
    for (std::size_t index : batch) seen[index] = 1;
    for (float& g : grad_w) g = static_cast<float>(rank + 1);
    for (float& g : grad_b) g = static_cast<float>(2 * (rank + 1));
    ++steps;
  };

  if (from == page::training_md) {
#include "training_loop.inc"
  } else {
#include "readme_training_loop.inc"
  }

  // Every sample seen by some rank in the last epoch (MPI's own max over the ranks' marks).
  std::vector<int> anywhere(seen.size());
  MPI_Allreduce(seen.data(), anywhere.data(), static_cast<int>(seen.size()), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  expect(std::count(anywhere.begin(), anywhere.end(), 1) == static_cast<std::ptrdiff_t>(dataset.size()),
         name + ": the sampler's batches cover the dataset", rank);
  // The same number of steps on every rank: ceil(ceil(1000 / size) / 64) per epoch.
  const std::size_t per_rank = (dataset.size() + static_cast<std::size_t>(size) - 1) / static_cast<std::size_t>(size);
  expect(steps == epochs * ((per_rank + 63) / 64), name + ": steps per rank", rank);
  // SGD with momentum 0.9 over the average of the ranks' gradients, from rank 0's values.
  const double mean = (size + 1) / 2.0;
  for (int k = 0; k < 2; ++k) {
    const double g = mean * (k + 1);
    double buffer = 0, moved = 0;
    for (std::size_t s = 0; s < steps; ++s) {
      buffer = s == 0 ? g : 0.9 * buffer + g;
      moved += 0.01 * buffer;
    }
    const std::vector<float>& values = k == 0 ? w : b;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double start = k == 0 ? static_cast<double>(i) : 0.0;
      expect(close(values[i], start - moved, 1e-5), name + ": parameter " + std::to_string(i) + " after SGD", rank);
    }
  }
  expect(same_on_every_rank(w) && same_on_every_rank(b), name + ": the same parameters on every rank", rank);
  ++blocks;
}

// training.md, "Overlapping the reduction with the backward pass", its second block: mark_ready.
void mark_ready(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<float> w1(300, 1.0f), w2(200, 2.0f), grad_w1(300), grad_w2(200);
  herd::sgd sgd(herd::views(w1, w2), herd::views(grad_w1, grad_w2), {.lr = 0.5});
  auto backward_layer2 = [&] { std::fill(grad_w2.begin(), grad_w2.end(), static_cast<float>(rank + 1)); };
  auto backward_layer1 = [&] { std::fill(grad_w1.begin(), grad_w1.end(), static_cast<float>(3 * (rank + 1))); };

#include "mark_ready.inc"

  const double mean = (size + 1) / 2.0;
  expect(close(w1[0], 1.0 - 0.5 * 3 * mean) && close(w1[299], 1.0 - 0.5 * 3 * mean), "mark_ready: w1 after the step", rank);
  expect(close(w2[0], 2.0 - 0.5 * mean) && close(w2[199], 2.0 - 0.5 * mean), "mark_ready: w2 after the step", rank);
  ++blocks;
}

// training.md, "Uneven inputs: join", its first block: rank r has r + 2 batches.
void join(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<float> w(4, 0.0f), grad(4);
  herd::parameters params{herd::views(w), herd::views(grad)};
  auto grads = herd::views(grad);
  herd::sgd sgd(params, {.lr = 0.25});
  std::vector<int> my_batches(static_cast<std::size_t>(rank + 2));
  auto forward_backward = [&](int) { std::fill(grad.begin(), grad.end(), 1.0f); };

#include "join.inc"

  // Step s reduces the gradients of the ranks with more than s batches (1 each) and zeros from
  // the rest, divided by the world size; the last rank to join steps every time.
  double moved = 0;
  for (int s = 0; s < size + 1; ++s) {
    int training = 0;
    for (int r = 0; r < size; ++r) training += s < r + 2 ? 1 : 0;
    moved += 0.25 * training / size;
  }
  expect(last == size - 1, "join: the last rank to join", rank);
  expect(close(w[0], -moved) && close(w[3], -moved), "join: every rank has the last joiner's parameters", rank);
  ++blocks;
}

// training.md, "Sharding the optimizer's state (ZeRO-1)", its first block: AdamW on shards.
void zero(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<float> w1(40, 1.0f), b1(7, -1.0f), w2(33, 0.5f), b2(3, 0.0f);
  std::vector<float> gw1(40), gb1(7), gw2(33), gb2(3);
  for (auto* g : {&gw1, &gb1, &gw2, &gb2}) {
    for (std::size_t i = 0; i < g->size(); ++i) (*g)[i] = static_cast<float>((rank + 1) * (i % 2 == 0 ? 1 : -1));
  }

#include "zero.inc"

  // One AdamW step from zero moments moves each value by lr * g / (|g| + eps) after the decay.
  const double lr = 1e-3, decay = 1e-2;
  const double mean = (size + 1) / 2.0;
  auto expected = [&](double p, std::size_t i) {
    const double g = i % 2 == 0 ? mean : -mean;
    return p * (1 - lr * decay) - lr * g / (std::abs(g) + 1e-8);
  };
  bool right = true;
  for (std::size_t i = 0; i < w1.size(); ++i) right = right && close(w1[i], expected(1.0, i));
  for (std::size_t i = 0; i < b1.size(); ++i) right = right && close(b1[i], expected(-1.0, i));
  for (std::size_t i = 0; i < w2.size(); ++i) right = right && close(w2[i], expected(0.5, i));
  for (std::size_t i = 0; i < b2.size(); ++i) right = right && close(b2[i], expected(0.0, i));
  expect(right, "ZeRO: every shard stepped by AdamW and gathered on every rank", rank);
  ++blocks;
}

// training.md, ZeRO's second block: the loss scaler and clipping of the reduced shards.
void zero_scaled(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<float> p1(6, 1.0f), p2(5, 2.0f), g1(6), g2(5);
  auto params = herd::views(p1, p2);
  auto grads = herd::views(g1, g2);
  auto make = [](auto shard_params, auto shard_grads) {
    return herd::sgd(std::move(shard_params), std::move(shard_grads), {.lr = 0.1});
  };
  {
    herd::loss_scaler probe;
    const float scale = static_cast<float>(probe.scale());  // what the block's scaler starts with
    std::fill(g1.begin(), g1.end(), 3.0f * scale * static_cast<float>(rank + 1));  // backward from loss * scale
    std::fill(g2.begin(), g2.end(), 4.0f * scale * static_cast<float>(rank + 1));
  }

#include "zero_scaled.inc"

  // The mean gradient (3m for 6 values, 4m for 5) has norm m * sqrt(54 + 80) > 1: clipped to 1.
  const double mean = (size + 1) / 2.0;
  const double norm = mean * std::sqrt(6 * 9.0 + 5 * 16.0);
  const double factor = 1.0 / (norm + 1e-6);
  expect(close(p1[0], 1.0 - 0.1 * 3 * mean * factor, 1e-5) && close(p2[4], 2.0 - 0.1 * 4 * mean * factor, 1e-5),
         "ZeRO with the loss scaler: unscaled, clipped to norm 1, stepped", rank);
  ++blocks;
}

// training.md, "Mixed precision", both blocks in a row: a step, then a step with clipping.
void mixed_precision(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<herd::half> w16(64, herd::half(1.0f)), b16(2, herd::half(0.5f)), gw16(64), gb16(2);
  // Backward from loss * scale: gradients gw and gb times the rank + 1, small enough that the
  // ranks' sum of the scaled f16 values stays finite at 3 ranks (else the step is skipped).
  constexpr double gw = 1.0 / 32, gb = 1.0 / 16;
  auto set_gradients = [&](double w_gradient, double b_gradient, double scale) {
    for (auto& g : gw16) g = herd::half(static_cast<float>(w_gradient * scale * (rank + 1)));
    for (auto& g : gb16) g = herd::half(static_cast<float>(b_gradient * scale * (rank + 1)));
  };
  {
    herd::loss_scaler probe;
    set_gradients(gw, gb, probe.scale());
  }

#include "mixed_precision.inc"

  const double mean = (size + 1) / 2.0;
  // The first step: SGD with momentum 0.9 on the f32 masters, mean gradients gw m and gb m.
  double master_w = 1.0 - 0.01 * gw * mean, master_b = 0.5 - 0.01 * gb * mean;
  expect(static_cast<float>(w16[0]) == static_cast<float>(herd::half(static_cast<float>(master_w))) &&
             static_cast<float>(b16[1]) == static_cast<float>(herd::half(static_cast<float>(master_b))),
         "mixed precision: the f16 parameters after the first step (w " + std::to_string(static_cast<float>(w16[0])) +
             ", expected " + std::to_string(master_w) + "; scale now " + std::to_string(scaler.scale()) + ")", rank);

  // The second step's gradients, 0.15 each times the rank + 1: their mean's norm, 0.15 m sqrt(66),
  // is over 1, so the block's clip_grad_norm scales them down.
  constexpr double g2 = 0.15;
  set_gradients(g2, g2, scaler.scale());

#include "mixed_precision_clip.inc"

  // The second step: the master gradients clipped to norm 1, momentum 0.9.
  const double norm = g2 * mean * std::sqrt(66.0);
  const double factor = 1.0 / (norm + 1e-6);
  expect(norm > 1, "mixed precision: the second step's gradients need clipping", rank);
  master_w -= 0.01 * (0.9 * gw * mean + g2 * mean * factor);
  master_b -= 0.01 * (0.9 * gb * mean + g2 * mean * factor);
  expect(close(static_cast<float>(w16[0]), static_cast<float>(herd::half(static_cast<float>(master_w))), 1e-3) &&
             close(static_cast<float>(b16[1]), static_cast<float>(herd::half(static_cast<float>(master_b))), 1e-3),
         "mixed precision: the f16 parameters after the clipped step", rank);
  const auto masters = amp.master_grads();
  const auto* g0 = static_cast<const float*>(masters[0].data);
  expect(close(g0[0], g2 * mean * factor, 1e-3), "mixed precision: the clipped f32 master gradient", rank);
  blocks += 2;
}

// api.md, "Process sets": a subset in the listed order and a split with no_color (3 ranks or more).
void process_sets(herd::mpi_communicator& world) {
  const int rank = world.rank();
  std::vector<float> grad(16, static_cast<float>(rank));

#include "process_sets.inc"

  const bool in_pair = rank == 0 || rank == 2;
  expect(pair.is_member() == in_pair, "process sets: who is in the subset", rank);
  if (in_pair) expect(pair.rank() == (rank == 2 ? 0 : 1) && pair.size() == 2, "process sets: ranks in the listed order", rank);
  expect(grad[0] == (in_pair ? 1.0f : static_cast<float>(rank)) && grad[15] == grad[0], "process sets: the subset's average", rank);
  expect(odd.is_member() == (rank % 2 == 1), "process sets: who is in the split", rank);
  if (odd.is_member()) expect(odd.size() == (world.size() / 2), "process sets: the split's size", rank);
  else expect(odd.rank() == -1 && odd.size() == 0, "process sets: a rank left out", rank);
  ++blocks;
}

// api.md, "Asynchronous operations".
void asynchronous(herd::mpi_communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<std::vector<float>> grads_in_reverse;
  for (int k = 0; k < 5; ++k) grads_in_reverse.emplace_back(static_cast<std::size_t>(100 * (k + 1)), static_cast<float>(k * size + rank));
  double other_work = 0;
  auto compute_something_else = [&] {
    for (int i = 1; i <= 1000; ++i) other_work += 1.0 / i;
  };

#include "asynchronous.inc"

  bool right = other_work > 0;
  for (int k = 0; k < 5; ++k) {
    const float expected = static_cast<float>(k * size) + static_cast<float>(size - 1) / 2.0f;
    for (float v : grads_in_reverse[static_cast<std::size_t>(k)]) right = right && v == expected;
  }
  expect(right, "asynchronous operations: every average after wait()", rank);
  ++blocks;
}

// api.md, "Reproducible sums": the result is the correctly rounded sum of the ranks' values (here
// each element's float sum in double is exact, and one rounding gives it), on every rank.
void reproducible(herd::mpi_communicator& world) {
  const int rank = world.rank(), size = world.size();
  std::vector<float> grad(5000);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i + static_cast<std::size_t>(rank)) * 0.1f;

#include "reproducible.inc"

  bool right = comm.options().reproducible;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    double exact = 0;
    for (int r = 0; r < size; ++r) exact += static_cast<double>(static_cast<float>(i + static_cast<std::size_t>(r)) * 0.1f);
    right = right && grad[i] == static_cast<float>(exact);
  }
  expect(right, "reproducible sums: the correctly rounded sum", rank);
  ++blocks;
}

}  // namespace

int main(int argc, char** argv) {
  return snippet_checks::run_blocks(argc, argv, "blocks", [](herd::mpi_communicator& comm) {
    training_loop(comm, page::training_md);
    training_loop(comm, page::readme);
    mark_ready(comm);
    join(comm);
    zero(comm);
    zero_scaled(comm);
    mixed_precision(comm);
    if (comm.size() >= 3) process_sets(comm);
    asynchronous(comm);
    reproducible(comm);
  });
}
