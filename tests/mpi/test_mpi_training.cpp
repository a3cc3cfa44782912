// Data-parallel training on real MPI ranks computes what one rank computes with the combined
// batch: K steps with W ranks at per-rank batch b give the parameters of 1 rank at batch W*b
// over the same samples (fp32, relative difference <= 1e-5), for SGD and AdamW, with fusion on,
// off and below one tensor's size, with two backward passes per step (which are summed, so each
// pass divides its loss by two), and with the buckets of mark_ready.

#include <herd/herd.hpp>

#include "../support/mpi_test.hpp"
#include "../support/tiny_mlp.hpp"

#include <string>
#include <utility>
#include <vector>

namespace {

struct fusion_case {
  const char* name;
  std::size_t threshold;
};

// One run: `steps` optimizer steps of `passes` backward passes; on each pass rank r takes
// `batch` samples right after those of ranks 0..r-1. The reference runs on every rank alone
// with the whole round's samples as one batch.
template <class Make>
void check_equivalence(herd::mpi_communicator& comm, Make make_optimizer, std::size_t threshold, int passes,
                       bool overlap) {
  const std::size_t batch = 8;
  const int steps = 6;
  const auto world = static_cast<std::size_t>(comm.size());
  const herd_test::regression_data data(batch * world * static_cast<std::size_t>(passes * steps), 7, 3, 99);

  herd_test::tiny_mlp distributed(7, 12, 3, 5);
  herd_test::tiny_mlp alone(7, 12, 3, 5);
  auto inner = make_optimizer(distributed);
  auto reference = make_optimizer(alone);
  herd::optimizer_options options;
  options.fusion_threshold_bytes = threshold;
  options.backward_passes_per_step = passes;
  options.accumulate = herd::accumulation::by_copy;  // forward_backward overwrites the gradients
  options.bucket_bytes = 200;  // several buckets of this small model
  options.first_bucket_bytes = 100;
  herd::distributed_optimizer opt(inner, distributed.grads(), comm, options);

  std::size_t at = 0;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < passes; ++k) {
      const std::size_t mine = at + static_cast<std::size_t>(comm.rank()) * batch;
      distributed.forward_backward(data, mine, mine + batch);
      for (auto g : distributed.grads()) {  // the loss divided by the passes: their sum is the mean
        for (std::size_t i = 0; i < g.count; ++i) static_cast<float*>(g.data)[i] /= static_cast<float>(passes);
      }
      if (overlap) {
        for (std::size_t i = 4; i-- > 0;) opt.mark_ready(i);  // as a backward pass would, last layer first
      }
      CHECK(opt.step() == (k == passes - 1));
      at += world * batch;
    }
    const std::size_t round = world * batch * static_cast<std::size_t>(passes);
    alone.forward_backward(data, at - round, at);
    reference.step();
  }
  const double difference = herd_test::relative_difference(distributed, alone);
  INFO("relative difference ", difference);
  CHECK(difference <= 1e-5);
}

const fusion_case fusions[] = {{"fused", std::size_t{128} << 20}, {"unfused", 0}, {"below one tensor", 40}};

}  // namespace

HERD_MPI_TEST_CASE("distributed SGD equals one rank with the combined batch", 1) {
  herd::mpi_communicator comm;
  auto make = [](herd_test::tiny_mlp& m) {
    return herd::sgd(m.params(), m.grads(), {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3});
  };
  for (const auto& fusion : fusions) {
    for (int passes : {1, 2}) {
      INFO("fusion ", fusion.name, ", backward passes per step ", passes);
      check_equivalence(comm, make, fusion.threshold, passes, false);
    }
  }
  for (int passes : {1, 2}) {
    INFO("buckets (mark_ready), backward passes per step ", passes);
    check_equivalence(comm, make, 0, passes, true);
  }
}

HERD_MPI_TEST_CASE("distributed AdamW equals one rank with the combined batch", 1) {
  herd::mpi_communicator comm;
  auto make = [](herd_test::tiny_mlp& m) { return herd::adamw(m.params(), m.grads(), {.lr = 1e-2}); };
  for (const auto& fusion : fusions) {
    for (int passes : {1, 2}) {
      INFO("fusion ", fusion.name, ", backward passes per step ", passes);
      check_equivalence(comm, make, fusion.threshold, passes, false);
    }
  }
  for (int passes : {1, 2}) {
    INFO("buckets (mark_ready), backward passes per step ", passes);
    check_equivalence(comm, make, 0, passes, true);
  }
}

HERD_MPI_TEST_CASE("broadcast_parameters and broadcast_optimizer_state make diverged ranks identical", 2) {
  herd::mpi_communicator comm;
  // Every rank starts from its own weights and takes a local step, so weights and momentum differ.
  herd_test::tiny_mlp model(5, 6, 2, 100 + static_cast<std::uint64_t>(comm.rank()));
  const herd_test::regression_data data(16, 5, 2, 7 + static_cast<std::uint64_t>(comm.rank()));
  herd::adamw opt(model.params(), model.grads(), {.lr = 0.01});
  model.forward_backward(data, 0, 16);
  opt.step();

  herd::broadcast_parameters(model.params(), comm, 1);
  herd::broadcast_optimizer_state(opt, comm, 1);
  // Identical state and identical gradients give identical weights after another step.
  const herd_test::regression_data same(16, 5, 2, 3);
  model.forward_backward(same, 0, 16);
  opt.step();
  std::vector<float> all(model.w1.size() * static_cast<std::size_t>(comm.size()));
  herd::allgather(model.w1, all, comm);
  for (std::size_t r = 1; r < static_cast<std::size_t>(comm.size()); ++r)
    CHECK(herd_test::same_bytes(all.data(), all.data() + r * model.w1.size(), model.w1.size() * sizeof(float)));
  CHECK(opt.steps() == 2);
}

HERD_MPI_TEST_CASE("gradient lists that differ across ranks fail on every rank", 2) {
  herd::mpi_communicator comm;
  std::vector<float> w(10), g(comm.rank() == 1 ? 11 : 10);
  std::vector<float> w2(10);
  struct no_op {
    void step() {}
  } inner;
  herd::distributed_optimizer opt(inner, herd::views(g), comm);
  std::string message = "(no error)";
  try {
    opt.step();
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("gradient 0 is 10 elements of f32 on rank 0 but 11 elements of f32 on rank 1") != std::string::npos);
}

// ZeRO-1: each rank steps its shard of the 135 parameters (W = 2, 4 do not divide them) and keeps
// only that shard's state; the parameters still equal one rank's with the combined batch.
HERD_MPI_TEST_CASE("zero_optimizer training equals one rank with the combined batch, SGD and AdamW", 1) {
  herd::mpi_communicator comm;
  const std::size_t batch = 8;
  const auto world = static_cast<std::size_t>(comm.size());
  for (bool use_adamw : {false, true}) {
    auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = 1e-2});
    };
    auto make_sgd = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
    };
    const std::size_t samples = batch * world * 6;
    const herd_test::regression_data data(samples, 7, 3, 77);
    herd_test::tiny_mlp distributed(7, 12, 3, 5), alone(7, 12, 3, 5);
    auto run = [&](auto& zero, auto& reference) {
      for (std::size_t at = 0; at < samples; at += world * batch) {
        const std::size_t mine = at + static_cast<std::size_t>(comm.rank()) * batch;
        distributed.forward_backward(data, mine, mine + batch);
        zero.step();
        alone.forward_backward(data, at, at + world * batch);
        reference.step();
      }
    };
    if (use_adamw) {
      herd::zero_optimizer zero(distributed.params(), distributed.grads(), comm, make);
      auto reference = make(alone.params(), alone.grads());
      run(zero, reference);
    } else {
      herd::zero_optimizer zero(distributed.params(), distributed.grads(), comm, make_sgd);
      auto reference = make_sgd(alone.params(), alone.grads());
      run(zero, reference);
    }
    const double difference = herd_test::relative_difference(distributed, alone);
    const std::string optimizer = use_adamw ? "adamw" : "sgd";
    INFO(optimizer, " relative difference ", difference);
    CHECK(difference <= 1e-5);
  }
}

// join() on MPI ranks: rank r has W-1-r batches (the last rank none), then joins; the ranks that
// trained to the end equal one rank that saw each round's samples, averaged over the world size.
// Also with two backward passes per step over each batch's halves (accumulated by copy: twice the
// batch's mean), whose first pass, held back, checks the gradients with the rank that has joined.
HERD_MPI_TEST_CASE("join: uneven batch counts on MPI ranks finish and match one rank's training", 2) {
  herd::mpi_communicator comm;
  const std::size_t batch = 4, world = static_cast<std::size_t>(comm.size());
  const int rounds = comm.size() - 1;
  const herd_test::regression_data data(static_cast<std::size_t>(rounds) * world * batch, 7, 3, 21);
  auto make = [](herd_test::tiny_mlp& m) { return herd::adamw(m.params(), m.grads(), {.lr = 1e-2}); };
  for (const auto& [buckets, passes] : {std::pair{false, 1}, {true, 1}, {false, 2}, {true, 2}}) {
    herd_test::tiny_mlp distributed(7, 12, 3, 5), alone(7, 12, 3, 5);
    auto inner = make(distributed);
    auto reference = make(alone);
    herd::optimizer_options options{
        .backward_passes_per_step = passes, .accumulate = herd::accumulation::by_copy, .uneven_inputs = true};
    options.bucket_bytes = 200;
    options.first_bucket_bytes = 100;
    herd::distributed_optimizer opt(inner, distributed.grads(), comm, options);
    const int mine = comm.size() - 1 - comm.rank();
    for (int k = 0; k < mine; ++k) {
      const std::size_t at = static_cast<std::size_t>(k) * world * batch + static_cast<std::size_t>(comm.rank()) * batch;
      const std::size_t part = batch / static_cast<std::size_t>(passes);
      for (int p = 0; p < passes; ++p) {
        const std::size_t from = at + static_cast<std::size_t>(p) * part;
        distributed.forward_backward(data, from, from + part);
        if (buckets)
          for (std::size_t i = 4; i-- > 0;) opt.mark_ready(i);
        CHECK(opt.step() == (p == passes - 1));
      }
    }
    CHECK(opt.join() == 0);
    for (int k = 0; k < rounds; ++k) {
      const auto active = static_cast<std::size_t>(comm.size() - 1 - k);
      const std::size_t at = static_cast<std::size_t>(k) * world * batch;
      alone.forward_backward(data, at, at + active * batch);
      for (auto g : alone.grads())
        for (std::size_t i = 0; i < g.count; ++i)
          static_cast<float*>(g.data)[i] *= static_cast<float>(passes) * static_cast<float>(active) / static_cast<float>(world);
      reference.step();
    }
    INFO("buckets ", buckets, ", passes per step ", passes);
    if (comm.rank() == 0) CHECK(herd_test::relative_difference(distributed, alone) <= 1e-5);
  }
}
