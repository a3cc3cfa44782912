// A libtorch model trained with herd on real MPI ranks: every rank holds bitwise-identical
// parameters after several steps, and they equal one rank's training at the combined batch
// (relative difference <= 1e-5), with libtorch's SGD (momentum) and Adam; and
// herd::torch::DistributedDataParallel, whose hooks reduce during backward, gives the bits of the
// manual path (distributed_optimizer over torch_gradients).

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/broadcast.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/gradients.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"

#include <cstdint>
#include <string>
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
  // Every hyperparameter differs by rank; the root's must reach every rank, not only its rate.
  const double k = comm.rank();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01 * (k + 1))
                                                   .betas({0.9 - 0.01 * k, 0.999 - 0.001 * k})
                                                   .eps(1e-8 * (k + 1))
                                                   .weight_decay(0.1 * k));
  if (comm.rank() == 1) {  // only the root has stepped (as after loading a checkpoint there)
    for (int i = 0; i < 3; ++i) {
      adam.zero_grad();
      model->forward(torch::ones({2, 6})).sum().backward();
      adam.step();
    }
  }
  herd::broadcast_parameters(*model, comm, 1);
  herd::broadcast_optimizer_state(adam, comm, 1);
  const auto& o = static_cast<const torch::optim::AdamOptions&>(adam.param_groups()[0].options());
  CHECK(o.lr() == 0.02);
  CHECK(std::get<0>(o.betas()) == 0.9 - 0.01);
  CHECK(std::get<1>(o.betas()) == 0.999 - 0.001);
  CHECK(o.eps() == 2e-8);
  CHECK(o.weight_decay() == 0.1);
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

HERD_MPI_TEST_CASE("broadcast_parameters and broadcast_optimizer_state take tensors in any memory layout, element by element", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  // A convolution whose weight is channels_last on even ranks and row-major on odd ones (the
  // layouts need not agree), with values and a momentum that differ by rank.
  torch::manual_seed(20 + static_cast<std::uint64_t>(comm.rank()));
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 2));
  if (comm.rank() % 2 == 0) conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
  torch::optim::SGD sgd(conv->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  conv->forward(torch::randn({2, 2, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast)).sum().backward();
  sgd.step();  // the momentum of a channels_last weight is channels_last
  herd::broadcast_parameters(*conv, comm, 0);
  herd::broadcast_optimizer_state(sgd, comm, 0);
  CHECK(conv->weight.is_contiguous(comm.rank() % 2 == 0 ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous));
  auto same_everywhere = [&](const torch::Tensor& t) {  // row-major copies gathered: the values by index
    torch::Tensor flat = t.detach().contiguous().reshape({-1});
    torch::Tensor all = torch::empty({comm.size(), flat.numel()});
    herd::allgather(flat, all, comm);
    for (int r = 0; r < comm.size(); ++r) CHECK(all[r].equal(all[0]));
  };
  for (auto& p : conv->parameters()) {
    same_everywhere(p);
    auto& state = static_cast<torch::optim::SGDParamState&>(*sgd.state().at(herd::detail::torch_state_key(p)));
    same_everywhere(state.momentum_buffer());
  }
}

// A tensor herd refuses on one rank alone (a dtype it has not) is raised on every rank, in the check
// of the tensors that comes first; the others once waited there for that rank, which had raised
// alone. The next broadcast, of tensors every rank can send, goes through.
HERD_MPI_TEST_CASE("broadcast_parameters of a module: a tensor refused on one rank raises on every rank", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  const bool odd_one = comm.rank() == comm.size() - 1;
  torch::nn::Linear linear(3, 2);
  linear->register_buffer("extra", torch::zeros({2}, odd_one ? torch::kComplexFloat : torch::kFloat));
  std::string message = "(no error)";
  try {
    herd::broadcast_parameters(*linear, comm, 0);
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(herd_test::has(message, odd_one ? "torch dtype ComplexFloat" : "rank " + std::to_string(comm.size() - 1) + " found a problem with its parameters"));
  torch::nn::Linear plain(3, 2);
  herd::broadcast_parameters(*plain, comm, 0);
  torch::Tensor all = torch::empty({comm.size(), 6});
  herd::allgather(plain->weight.detach().reshape({-1}), all, comm);
  for (int r = 0; r < comm.size(); ++r) CHECK(all[r].equal(all[0]));
}

HERD_MPI_TEST_CASE("torch_gradients: a gradient that is not row-major is refused, saying where it is taken", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 2));
  conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
  torch::optim::SGD sgd(conv->parameters(), torch::optim::SGDOptions(0.1));
  herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm);
  conv->forward(torch::ones({1, 2, 3, 3})).sum().backward();
  std::string message = "(no error)";
  try {
    opt.step();
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("the gradient of the optimizer's parameter 0 is not row-major") != std::string::npos);
  CHECK(message.find("herd::torch::DistributedDataParallel, which takes parameters in any layout") != std::string::npos);
}

namespace {

// K steps of SGD with momentum on rank-dependent slices of shared data, through
// DistributedDataParallel (ddp) or through distributed_optimizer + torch_gradients (manual); with
// `alone`, one rank on the combined batch of every rank.
enum class path { ddp, manual, alone };
torch::nn::Sequential train_with(herd::mpi_communicator& comm, path how, herd::optimizer_options options = {},
                                 herd::overlap_stats* stats = nullptr) {
  torch::set_num_threads(1);
  const std::int64_t steps = 4, batch = 4, world = comm.size();
  torch::manual_seed(99);
  const torch::Tensor x = torch::randn({steps * world * batch, 6});
  const torch::Tensor y = torch::randn({steps * world * batch, 3});
  auto model = make_model(comm.rank() == 0 || how == path::alone ? 7 : 50 + static_cast<std::uint64_t>(comm.rank()));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto loss_through = [&](std::int64_t s, auto&& forward) {
    const std::int64_t begin = s * world * batch + (how == path::alone ? 0 : comm.rank() * batch);
    const std::int64_t end = how == path::alone ? begin + world * batch : begin + batch;
    return torch::mse_loss(forward(x.slice(0, begin, end)), y.slice(0, begin, end));
  };
  auto loss_of = [&](std::int64_t s) { return loss_through(s, [&](const torch::Tensor& in) { return model->forward(in); }); };
  if (how == path::ddp) {
    herd::torch::DistributedDataParallel net(model, comm, options);
    for (std::int64_t s = 0; s < steps; ++s) {
      sgd.zero_grad();
      loss_through(s, [&](const torch::Tensor& in) { return net.forward(in); }).backward();
      sgd.step();
    }
    CHECK(net.overlap().steps == static_cast<std::size_t>(comm.size() > 1 ? steps : 0));
    if (stats) *stats = net.overlap();
  } else if (how == path::manual) {
    herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm);
    herd::broadcast_parameters(*model, comm, 0);
    for (std::int64_t s = 0; s < steps; ++s) {
      sgd.zero_grad();
      loss_of(s).backward();
      opt.step();
    }
  } else {
    for (std::int64_t s = 0; s < steps; ++s) {
      sgd.zero_grad();
      loss_of(s).backward();
      sgd.step();
    }
  }
  return model;
}

}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel: the bits of the manual path, and one rank at the combined batch", 1) {
  herd::mpi_communicator comm;
  herd::optimizer_options several;
  several.first_bucket_bytes = 64;  // buckets of one or two tensors in this small model
  several.bucket_bytes = 256;
  auto with_ddp = train_with(comm, path::ddp, several);
  auto manual = train_with(comm, path::manual);
  auto alone = train_with(comm, path::alone);
  auto pa = with_ddp->parameters();
  auto pb = manual->parameters();
  if (comm.size() <= 2) {
    // Sums of two are exact in either order: the buckets and the fusion buffer give the same bits.
    for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].equal(pb[i]));
  } else {
    // From 3 ranks the ring adds each element in an order that depends on where it lies in its
    // buffer, and buckets lay gradients out differently from one fusion buffer.
    CHECK(relative_difference(with_ddp, manual) <= 1e-6);
  }
  CHECK(identical_on_all_ranks(with_ddp, comm));
  const double difference = relative_difference(with_ddp, alone);
  INFO("relative difference to one rank at the combined batch: ", difference);
  CHECK(difference <= 1e-5);
}

HERD_MPI_TEST_CASE("DistributedDataParallel: gradient_as_bucket_view reduces in place, to the same parameters", 2) {
  herd::mpi_communicator comm;
  herd::optimizer_options several;
  several.first_bucket_bytes = 64;
  several.bucket_bytes = 256;
  herd::optimizer_options in_buckets = several;
  in_buckets.gradient_as_bucket_view = true;
  herd::overlap_stats copied, in_place;
  auto a = train_with(comm, path::ddp, several, &copied);
  auto b = train_with(comm, path::ddp, in_buckets, &in_place);
  CHECK(copied.packed_bytes > 0);
  CHECK(in_place.packed_bytes == 0);  // zero_grad() and backward() kept the gradients in their buckets
  // The first plan is kept instead of the rebuilt one: other buckets, so from 3 ranks other sums.
  if (comm.size() <= 2) {
    auto pa = a->parameters();
    auto pb = b->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) CHECK(pa[i].equal(pb[i]));
  } else {
    CHECK(relative_difference(a, b) <= 1e-6);
  }
  CHECK(identical_on_all_ranks(b, comm));
  // After a pass the gradients are tensors on their bucket's storage (neighbours in a bucket are
  // adjacent), and again after zero_grad(true) set them to undefined, as DDP re-points them.
  auto model = make_model(3);
  herd::torch::DistributedDataParallel net(model, comm, in_buckets);
  auto params = model->parameters();
  std::vector<std::pair<std::size_t, herd::dtype>> shapes;
  for (const auto& p : params) shapes.emplace_back(static_cast<std::size_t>(p.numel()), herd::dtype::f32);
  const auto layout = herd::bucket_layout(shapes, in_buckets);
  REQUIRE(layout.size() >= 2);
  for (bool to_none : {false, true}) {
    INFO("after zero_grad(", to_none, ")");
    model->zero_grad(to_none);
    net.forward(torch::ones({2, 6})).sum().backward();
    for (const auto& bucket : layout) {
      for (std::size_t k = 0; k < bucket.members.size(); ++k) {
        const auto& first = params[bucket.members.front()].grad();
        REQUIRE(params[bucket.members[k]].grad().defined());
        CHECK(static_cast<const float*>(first.data_ptr()) + bucket.offsets[k] == params[bucket.members[k]].grad().data_ptr());
      }
    }
  }
}

HERD_MPI_TEST_CASE("DistributedDataParallel: no_sync leaves passes to add up in param.grad; the next one reduces the sum", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto model = make_model(5);
  herd::torch::DistributedDataParallel net(model, comm);
  const auto r = static_cast<float>(comm.rank());
  auto last_bias_grad = [&] { return model->parameters()[3].grad()[0].item<float>(); };
  model->zero_grad();
  {
    auto guard = net.no_sync();
    (net.forward(torch::ones({1, 6})).sum() * (r + 1)).backward();  // d/d(last bias) = r + 1
  }
  CHECK(last_bias_grad() == r + 1);  // not reduced
  (net.forward(torch::ones({1, 6})).sum() * 10).backward();  // adds 10 locally, then reduces the sum
  const float p = static_cast<float>(comm.size());
  CHECK(last_bias_grad() == doctest::Approx(11 + (p - 1) / 2));  // mean over ranks of r + 11
}

namespace {
// Two layers, of which forward() uses the first only.
struct first_of_two : torch::nn::Module {
  first_of_two() {
    first = register_module("first", torch::nn::Linear(6, 3));
    second = register_module("second", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return first->forward(x); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel: a parameter without a gradient raises from backward() on every rank", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto pair = std::make_shared<first_of_two>();
  herd::torch::DistributedDataParallel net(pair, comm);
  std::string message = "(no error)";
  try {
    net.forward(torch::ones({1, 6})).sum().backward();  // `second` gets no gradient
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("were not marked ready in this backward pass") != std::string::npos);
  // With find_unused_parameters the same pass goes through; `second`, which no rank used, keeps
  // its gradient undefined, as DDP leaves it.
  herd::optimizer_options unused;
  unused.find_unused_parameters = true;
  auto pair2 = std::make_shared<first_of_two>();
  herd::torch::DistributedDataParallel net2(pair2, comm, unused);
  pair2->zero_grad();
  net2.forward(torch::ones({1, 6}) * (comm.rank() + 1)).sum().backward();
  const float p = static_cast<float>(comm.size());
  CHECK(pair2->parameters()[0].grad()[0][0].item<float>() == doctest::Approx((p + 1) / 2));  // mean of r + 1
  CHECK_FALSE(pair2->parameters()[2].grad().defined());
  CHECK_FALSE(pair2->parameters()[3].grad().defined());
}

HERD_MPI_TEST_CASE("DistributedDataParallel: join() shadows the others' forwards, no_sync passes and reductions", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  const int p = comm.size(), r = comm.rank();
  for (const bool by_active : {false, true}) {
    auto model = make_model(6);
    herd::optimizer_options options;
    options.uneven_inputs = true;
    options.divide_by_active_ranks = by_active;
    herd::torch::DistributedDataParallel net(model, comm, options);
    auto last_bias_grad = [&] { return model->parameters()[3].grad()[0].item<float>(); };
    float mine = 0;
    for (int it = 0; it <= r; ++it) {  // rank r has r + 1 iterations: ranks it..p-1 train in iteration it
      model->zero_grad();
      {
        const torch::NoGradGuard no_grad;
        (void)net.forward(torch::ones({1, 6}));  // an evaluation: no reduction follows
      }
      {
        auto guard = net.no_sync();
        (net.forward(torch::ones({1, 6})).sum() * (r + 1)).backward();
      }
      (net.forward(torch::ones({1, 6})).sum() * (r + 1)).backward();  // 2 (r + 1) here, reduced
      float sum = 0;
      for (int q = it; q < p; ++q) sum += 2.0f * static_cast<float>(q + 1);
      mine = last_bias_grad();
      CHECK(mine == doctest::Approx(sum / static_cast<float>(by_active ? p - it : p)));
    }
    CHECK(net.join() == p - 1);
    CHECK(last_bias_grad() == mine);  // the shadowed rounds reduced zeros of their own
  }
}

HERD_MPI_TEST_CASE("DistributedDataParallel: static_graph on some ranks only raises from backward() on every rank", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto model = make_model(7);
  herd::optimizer_options options;
  options.find_unused_parameters = true;
  options.static_graph = comm.rank() == 1;  // the used flags would be allreduced by some ranks only
  herd::torch::DistributedDataParallel net(model, comm, options);
  std::string message = "(no error)";
  try {
    net.forward(torch::ones({1, 6})).sum().backward();
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("option static_graph differs between rank 0 and rank 1") != std::string::npos);
}

namespace {
// A layer `p` that a pass uses or not, as its caller says.
struct optional_layer : torch::nn::Module {
  optional_layer() {
    a = register_module("a", torch::nn::Linear(4, 3));
    p = register_module("p", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(torch::Tensor x, bool use_p) { return use_p ? a->forward(x) + p->forward(x) : a->forward(x); }
  torch::nn::Linear a{nullptr}, p{nullptr};
};

// Every rank's copy of `t`, flattened, equal to rank 0's.
bool same_on_every_rank(const torch::Tensor& t, herd::mpi_communicator& comm) {
  const torch::Tensor flat = t.detach().reshape({-1}).to(torch::kDouble).contiguous();
  torch::Tensor all = torch::empty({comm.size(), flat.numel()}, torch::kDouble);
  herd::allgather(flat, all, comm);
  bool same = true;
  for (int r = 1; r < comm.size(); ++r) same = same && all[r].equal(all[0]);
  return same;
}
}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel with find_unused_parameters: a layer unused, then used by one rank, then unused keeps every rank alike", 2) {
  // The schedule where an earlier pass's bookkeeping once leaked into the next: the layer's
  // gradient stayed undefined on the ranks that never used it and defined on the one that did,
  // and SGD's momentum then moved the layer on one rank only.
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(2);
  auto net = std::make_shared<optional_layer>();
  herd::optimizer_options options;
  options.find_unused_parameters = true;
  herd::torch::DistributedDataParallel ddp(net, comm, options);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  const bool uses[3] = {false, comm.rank() == 1, false};
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    for (auto& q : net->parameters()) {  // zero_grad in place (set_to_none = false), spelled out for every libtorch
      if (q.grad().defined()) q.mutable_grad().zero_();
    }
    torch::manual_seed(static_cast<std::uint64_t>(10 * step + comm.rank()));
    ddp.forward(torch::randn({5, 4}), uses[step]).pow(2).sum().backward();
    sgd.step();
    const std::int32_t defined = net->p->weight.grad().defined() ? 1 : 0;
    CHECK(same_on_every_rank(torch::tensor({defined}), comm));
    for (auto& q : net->parameters()) CHECK(same_on_every_rank(q, comm));
  }
}

HERD_MPI_TEST_CASE("DistributedDataParallel: ddp->forward(x) goes through the wrapper (rank 0's buffers first), as DDP's model(x)", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  herd::torch::DistributedDataParallel ddp(model, comm);
  {
    const torch::NoGradGuard no_grad;
    for (auto& b : model->buffers()) {
      if (b.is_floating_point()) b.fill_(static_cast<float>(comm.rank() + 1));  // the ranks' buffers drift apart
    }
  }
  ddp->forward(torch::randn({6, 4})).sum().backward();  // the first forward after construction broadcasts
  ddp->forward(torch::randn({6, 4})).sum().backward();  // after a synchronized pass: broadcasts again
  auto bn = model[1]->as<torch::nn::BatchNorm1d>();
  {
    const torch::NoGradGuard no_grad;
    for (auto& b : model->buffers()) {
      if (b.is_floating_point()) b.fill_(static_cast<float>(comm.rank() + 1));
    }
  }
  torch::NoGradGuard no_grad;
  ddp.module()->eval();
  ddp->forward(torch::randn({6, 4}));  // eval: no update of its own, so the buffers are rank 0's exactly
  CHECK(bn->running_mean.equal(torch::ones_like(bn->running_mean)));
  CHECK(bn->running_var.equal(torch::ones_like(bn->running_var)));
  CHECK(ddp->parameters().size() == model->parameters().size());
}

HERD_MPI_TEST_CASE("DistributedDataParallel: static_graph with uneven inputs, a rank that joins before any synchronized pass", 2) {
  // Rank 0 has no batch at all; the others train three steps with static_graph. The joined rank
  // must shadow the first pass's exchange of used flags once, as the others make it once.
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto model = make_model(6);
  herd::optimizer_options options;
  options.uneven_inputs = true;
  options.static_graph = true;
  herd::torch::DistributedDataParallel net(model, comm, options);
  std::string message = "(no error)";
  int last = -1;
  try {
    if (comm.rank() != 0) {
      for (int step = 0; step < 3; ++step) {
        model->zero_grad();
        net.forward(torch::ones({2, 6}) * (step + 1)).sum().backward();
      }
    }
    last = net.join();
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message == "(no error)");
  CHECK(last == comm.size() - 1);
  CHECK(same_on_every_rank(model->parameters()[0], comm));
}

namespace {
// y = x + 0 * w, whose backward gives w no gradient at all (an undefined tensor), as some
// functions do for inputs they do not differentiate: w's accumulator still runs its hooks.
struct no_gradient_for_w : torch::autograd::Function<no_gradient_for_w> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x, torch::Tensor w) {
    return x + 0 * w.sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    return {g[0], torch::Tensor()};
  }
};
struct with_w : torch::nn::Module {
  with_w() {
    a = register_module("a", torch::nn::Linear(4, 3));
    w = register_parameter("w", torch::ones({3}));
  }
  torch::Tensor forward(torch::Tensor x) { return no_gradient_for_w::apply(a->forward(x), w); }
  torch::nn::Linear a{nullptr};
  torch::Tensor w;
};
}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel: a hook that fires with no gradient counts as an unused parameter, as DDP's", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  for (const bool find_unused : {false, true}) {
    CAPTURE(find_unused);
    auto net = std::make_shared<with_w>();
    herd::optimizer_options options;
    options.find_unused_parameters = find_unused;
    herd::torch::DistributedDataParallel ddp(net, comm, options);
    std::string message = "(no error)";
    try {
      ddp.forward(torch::ones({2, 4}) * (comm.rank() + 1)).sum().backward();
    } catch (const std::exception& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message == "(no error)");
    // Without find_unused_parameters it is reduced as zeros (defined); with it, no rank used it,
    // so it keeps what it had: no gradient.
    if (find_unused) CHECK_FALSE(net->w.grad().defined());
    else CHECK((net->w.grad().defined() && net->w.grad().abs().sum().item<float>() == 0));
    CHECK(same_on_every_rank(net->a->weight.grad(), comm));
  }
}

// Called by tests/support/mpi_main.cpp before its MPI_Finalize, as herd::mpi::finalize() would be:
// herd's threads leave MPI first (a test case here aborts a communicator at 3 ranks, whose draining
// thread could still be inside MPI; the MPI test programs define it in support/engine.cpp).
extern "C" void herd_test_before_finalize() { herd::detail::stop_threads_before_finalize(); }
