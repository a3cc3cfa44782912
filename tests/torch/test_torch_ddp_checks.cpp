// What herd::torch::DistributedDataParallel refuses, as PyTorch's DDP does, with an error on every
// rank that names the parameter and says what to do; and what it leaves alone (buffers with
// broadcast_buffers off).

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/torch/tensor_traits.hpp>

#include "../support/checks.hpp"
#include "../support/mpi_test.hpp"

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

// A module whose parameter `w` has the shape its constructor is given, and a Linear after it.
struct shaped : torch::nn::Module {
  explicit shaped(torch::IntArrayRef sizes) {
    w = register_parameter("w", torch::zeros(sizes));
    l = register_module("l", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return l->forward(torch::matmul(x, w.reshape({5, 4}))); }
  torch::Tensor w;
  torch::nn::Linear l{nullptr};
};

// What constructing DistributedDataParallel over `module` raised on this rank ("(no error)" if nothing).
template <class Module>
std::string construction_error(Module module, herd::mpi_communicator& comm, herd::optimizer_options options = {}) {
  try {
    herd::torch::DistributedDataParallel ddp(module, comm, options);
  } catch (const herd::error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Passes its input on, and raises in backward: an error inside a backward pass (out of memory, say).
struct raises_in_backward : torch::autograd::Function<raises_in_backward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    throw std::runtime_error("out of memory (a test's)");
  }
};

// Two layers with a function between them that raises in backward where `raising` is set: the
// second layer's gradients are ready (its hooks ran) before the error, the first layer's never.
struct breaks_in_backward : torch::nn::Module {
  explicit breaks_in_backward(bool raises) : raising(raises) {
    first = register_module("first", torch::nn::Linear(4, 4));
    second = register_module("second", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = first->forward(x);
    return second->forward(raising ? raises_in_backward::apply(h) : h);
  }
  bool raising;
  torch::nn::Linear first{nullptr}, second{nullptr};
};

}  // namespace

HERD_MPI_TEST_CASE("DistributedDataParallel: a parameter of another shape on one rank (the same element count) raises on every rank", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  auto module = std::make_shared<shaped>(comm.rank() == 1 ? torch::IntArrayRef{5, 4} : torch::IntArrayRef{4, 5});
  const std::string message = construction_error(module, comm);
  INFO(message);
  CHECK(has(message, "DistributedDataParallel"));
  CHECK(has(message, "parameter w "));
  CHECK(has(message, "sizes [5, 4] on rank 1 but [4, 5] on rank 0"));
}

HERD_MPI_TEST_CASE("DistributedDataParallel: a module without a parameter that requires a gradient raises on every rank", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  for (const bool as_view : {false, true}) {
    CAPTURE(as_view);
    herd::optimizer_options options;
    options.gradient_as_bucket_view = as_view;
    torch::nn::Sequential frozen(torch::nn::Linear(4, 3));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
    std::string message = construction_error(frozen, comm, options);
    INFO(message);
    CHECK(has(message, "no parameter that requires a gradient, so DistributedDataParallel is not needed"));
    // On rank 1 only: that rank says why, the others that it found a problem.
    torch::nn::Sequential some(torch::nn::Linear(4, 3));
    if (comm.rank() == 1) {
      for (auto& p : some->parameters()) p.set_requires_grad(false);
    }
    message = construction_error(some, comm, options);
    INFO(message);
    if (comm.rank() == 1) CHECK(has(message, "no parameter that requires a gradient"));
    else CHECK(has(message, "rank 1 found a problem"));
  }
}

HERD_MPI_TEST_CASE("DistributedDataParallel: broadcast_buffers = false leaves each rank's buffers at construction, as PyTorch 2's DDP", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  for (const bool broadcast : {true, false}) {
    CAPTURE(broadcast);
    torch::manual_seed(static_cast<std::uint64_t>(comm.rank()));  // parameters differ by rank too
    torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
    auto bn = model[1]->as<torch::nn::BatchNorm1d>();
    {
      const torch::NoGradGuard no_grad;
      bn->running_mean.fill_(static_cast<float>(comm.rank() + 1));
    }
    herd::optimizer_options options;
    options.broadcast_buffers = broadcast;
    herd::torch::DistributedDataParallel ddp(model, comm, options);
    const float expected = broadcast ? 1.0f : static_cast<float>(comm.rank() + 1);
    CHECK(bn->running_mean.equal(torch::full({3}, expected)));
    torch::Tensor w = model[0]->as<torch::nn::Linear>()->weight.detach().reshape({-1}).contiguous();
    torch::Tensor all = torch::empty({comm.size(), w.numel()});
    herd::allgather(w, all, comm);
    CHECK(all[comm.size() - 1].equal(all[0]));  // the parameters are rank 0's either way
  }
}

// A parameter looked up as an embedding with sparse gradients, but not an Embedding module's.
struct looked_up : torch::nn::Module {
  looked_up() { table = register_parameter("table", torch::ones({10, 3})); }
  torch::Tensor forward(const torch::Tensor& ids) { return torch::embedding(table, ids, -1, false, /*sparse=*/true); }
  torch::Tensor table;
};

HERD_MPI_TEST_CASE("DistributedDataParallel: a sparse gradient of a parameter that is not a sparse Embedding's raises on every rank, named, instead of turning dense", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  for (const bool to_none : {false, true}) {
    CAPTURE(to_none);
    auto model = std::make_shared<looked_up>();
    herd::torch::DistributedDataParallel ddp(model, comm);
    std::string message = "(no error)";
    try {
      for (int step = 0; step < 2; ++step) {
        model->zero_grad(to_none);
        ddp.forward(torch::tensor({{1, 2}, {3, 4}}, torch::kLong)).sum().backward();
      }
    } catch (const std::exception& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(has(message, "parameter table has a sparse gradient, and is not the weight of an Embedding or EmbeddingBag with sparse=true"));
    CHECK(has(message, "give it dense gradients (sparse=false)"));
  }
  // Sparse Embeddings with uneven_inputs: refused at construction, on every rank.
  torch::nn::Sequential model(torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 3).sparse(true)), torch::nn::Linear(3, 2));
  const std::string refused = construction_error(model, comm, {.uneven_inputs = true});
  INFO(refused);
  CHECK(has(refused, "parameter 0.weight has sparse gradients (an Embedding or EmbeddingBag with sparse=true), which herd's DDP does not reduce with uneven_inputs"));
  // The sparse option differing between ranks: refused at construction, on every rank.
  torch::nn::Sequential mixed(torch::nn::Embedding(torch::nn::EmbeddingOptions(10, 3).sparse(comm.rank() == 0)),
                              torch::nn::Linear(3, 2));
  const std::string differs = construction_error(mixed, comm);
  INFO(differs);
  CHECK(has(differs, "parameter 0.weight (trainable parameter 0) has dense gradients on rank 1 but sparse gradients (an "
                     "Embedding or EmbeddingBag with sparse=true) on rank 0"));
  // herd's tensor adapter names the layout of a tensor it does not take, not its whole options.
  torch::Tensor sparse = torch::zeros({3, 3}).to_sparse();
  std::string message = "(no error)";
  try {
    (void)herd::view_of(sparse);
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(has(message, "(layout Sparse)"));
  CHECK_FALSE(has(message, "TensorOptions"));
}

HERD_MPI_TEST_CASE("DistributedDataParallel: a model whose only parameter is a sparse Embedding's reduces its gradient to the average", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::nn::Embedding table(torch::nn::EmbeddingOptions(8, 2).sparse(true));
  herd::torch::DistributedDataParallel ddp(table, comm);
  for (int step = 0; step < 2; ++step) {
    table->zero_grad(step == 1);
    // Each rank looks up its own row and row 5: the average has 1 / size in rows 0 .. size - 1 and 1 in row 5.
    ddp.forward(torch::tensor({comm.rank(), 5}, torch::kLong)).sum().backward();
    const torch::Tensor g = table->weight.grad();
    REQUIRE(g.defined());
    CHECK(g.is_sparse());
    torch::Tensor want = torch::zeros({8, 2});
    want.slice(0, 0, comm.size()).fill_(1.0 / comm.size());
    want[5].fill_(1.0);
    CHECK(torch::allclose(g.to_dense(), want));
  }
}

// A sparse Embedding, and a Linear that the forward uses only when asked.
struct embed_then_maybe_linear : torch::nn::Module {
  embed_then_maybe_linear() {
    table = register_module("table", torch::nn::Embedding(torch::nn::EmbeddingOptions(8, 4).sparse(true)));
    head = register_module("head", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& ids, bool use_head) {
    const torch::Tensor h = table(ids).sum(0);
    return use_head ? head(h) : h;
  }
  torch::nn::Embedding table{nullptr};
  torch::nn::Linear head{nullptr};
};

HERD_MPI_TEST_CASE("DistributedDataParallel: with find_unused_parameters, a rank whose pass readies only sparse gradients reduces with the others", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(3);
  auto model = std::make_shared<embed_then_maybe_linear>();
  // One gradient per bucket: the buckets of the ranks that used the head pair up with this rank's.
  herd::torch::DistributedDataParallel ddp(model, comm, {.bucket_bytes = 16, .first_bucket_bytes = 16, .find_unused_parameters = true});
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(true);
    ddp.forward(torch::tensor({comm.rank(), 6}, torch::kLong), comm.rank() != 1).sum().backward();
    // Every rank holds the same gradients: the head's (some rank used it) and the table's.
    for (const torch::Tensor& g : {model->head->weight.grad(), model->table->weight.grad()}) {
      REQUIRE(g.defined());
      torch::Tensor flat = (g.is_sparse() ? g.to_dense() : g).reshape({-1}).contiguous();
      torch::Tensor all = torch::empty({comm.size(), flat.numel()});
      herd::allgather(flat, all, comm);
      for (int r = 0; r < comm.size(); ++r) CHECK(all[r].equal(all[0]));
    }
  }
}

HERD_MPI_TEST_CASE("DistributedDataParallel: a parameter laid out in memory otherwise on another rank raises on every rank, named, with what to do", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  // A transposed tensor on rank 1 only: the same sizes, its elements in another order.
  auto module = std::make_shared<shaped>(torch::IntArrayRef{4, 5});
  if (comm.rank() == 1) module->w.set_data(torch::zeros({5, 4}).t());
  std::string message = construction_error(module, comm);
  INFO(message);
  CHECK(has(message, "DistributedDataParallel"));
  CHECK(has(message, "parameter w (trainable parameter 0) lies in memory with strides [1, 4] on rank 1 but [5, 1] on rank 0"));
  CHECK(has(message, "p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast))"));
  // A channels_last convolution weight on rank 0 only, then on every rank (taken, as DDP takes it).
  auto conv_on = [&](bool channels_last) {
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 2));
    if (channels_last) conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
    return conv;
  };
  message = construction_error(conv_on(comm.rank() == 0), comm);
  INFO(message);
  CHECK(has(message, "parameter weight (trainable parameter 0) lies in memory with strides [8, 4, 2, 1] on rank 1 but [8, 1, 4, 2] on rank 0"));
  CHECK(construction_error(conv_on(true), comm) == "(no error)");
  // One input channel: channels_last changes only the stride of a dimension of length 1, which
  // places no element (PyTorch's DDP compares it too, and raises).
  torch::nn::Conv2d one(torch::nn::Conv2dOptions(1, 3, 2));
  if (comm.rank() == 0) one->weight.set_data(one->weight.contiguous(torch::MemoryFormat::ChannelsLast));
  CHECK(construction_error(one, comm) == "(no error)");
}

HERD_MPI_TEST_CASE("DistributedDataParallel: a parameter that is not dense and a gradient set in another layout reduce to the average", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(11);
  // w every other column of a wider tensor (strides [10, 2]: not dense, so its gradient's place
  // is row-major); l's weight gets a transposed gradient from the program before backward.
  auto make = [] {
    auto m = std::make_shared<shaped>(torch::IntArrayRef{4, 5});
    const torch::NoGradGuard no_grad;
    m->w.set_data((torch::arange(40, torch::kFloat32).reshape({4, 10}) / 40).slice(1, 0, 10, 2));
    m->l->weight.copy_(torch::arange(12, torch::kFloat32).reshape({3, 4}) / 12);
    return m;
  };
  auto model = make();
  REQUIRE_FALSE(model->w.is_non_overlapping_and_dense());
  herd::torch::DistributedDataParallel ddp(model, comm);
  model->l->weight.mutable_grad() = torch::zeros({4, 3}).t();
  // The loss is linear in x, so the average of the ranks' gradients is the gradient at the
  // average x: (size + 1) / 2 for x = rank + 1.
  ddp.forward(torch::full({2, 5}, static_cast<float>(comm.rank() + 1))).sum().backward();
  auto alone = make();
  alone->forward(torch::full({2, 5}, static_cast<float>(comm.size() + 1) / 2)).sum().backward();
  CHECK(torch::allclose(model->w.grad(), alone->w.grad()));
  CHECK(torch::allclose(model->l->weight.grad(), alone->l->weight.grad()));
  CHECK(torch::allclose(model->l->bias.grad(), alone->l->bias.grad()));
  CHECK(model->w.grad().is_contiguous());
  CHECK(model->l->weight.grad().is_contiguous());  // copied into its parameter's layout, as DDP's bucket view
}

HERD_MPI_TEST_CASE("DistributedDataParallel: a backward with no forward through the wrapper since the last reduction warns once; no_sync() passes say nothing", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(7);
  torch::nn::Linear model(4, 3);
  herd::torch::DistributedDataParallel ddp(model, comm);
  const torch::Tensor x = torch::ones({2, 4});
  const std::string meant = herd_test::stderr_of([&] {
    {
      const auto guard = ddp.no_sync();
      ddp.forward(x).sum().backward();
    }
    ddp.forward(x).sum().backward();
  });
  INFO(meant);
  CHECK_FALSE(has(meant, "herd warning"));
  const std::string bypassed = herd_test::stderr_of([&] {
    model->forward(x).sum().backward();  // the module's own forward: DDP keeps these gradients local
    model->forward(x).sum().backward();
  });
  INFO(bypassed);
  const std::string warning = "herd warning: DistributedDataParallel on rank " + std::to_string(comm.rank()) + " of " +
                              std::to_string(comm.size()) + ": a backward pass with no forward through the wrapper";
  CHECK(has(bypassed, warning));
  CHECK(bypassed.find(warning) == bypassed.rfind(warning));  // once
}

HERD_MPI_TEST_CASE("DistributedDataParallel: after a backward pass that raised midway, the next forward refuses, as DDP's, and the other ranks raise at once", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(3);
  const bool raising = comm.rank() == comm.size() - 1;
  auto model = std::make_shared<breaks_in_backward>(raising);
  herd::torch::DistributedDataParallel ddp(model, comm);
  const torch::Tensor x = torch::ones({2, 4});
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    ddp.forward(x).sum().backward();
  } catch (const std::exception& e) {
    message = e.what();
  }
  if (raising) {
    INFO(message);
    CHECK(has(message, "out of memory (a test's)"));
    for (int again = 0; again < 2; ++again) {  // refused, and refused again
      const std::string refused = herd_test::error_of([&] { (void)ddp.forward(x); });
      INFO(refused);
      CHECK(has(refused, "DistributedDataParallel on rank " + std::to_string(comm.rank())));
      CHECK(has(refused, "the last backward pass ended before its gradients were reduced"));
      CHECK(has(refused, "comm.renew()"));
    }
  } else {
    // Waiting in the pass's reduction for the rank that raised: its refusal aborts the
    // communicator, which ends the wait long before the stall shutdown.
    INFO(message);
    CHECK(has(message, "rank " + std::to_string(comm.size() - 1)));
    CHECK(has(message, "the last backward pass ended before its gradients were reduced"));
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 20);
}

// A gradient of the wrong kind on one rank alone (here a dense one reaching a sparse Embedding's
// weight, the only parameter, so that no other hook ran before it): that rank's next forward
// refuses, and the other ranks, waiting in the pass's reduction, raise at once. The wrapper once
// went on there, and its next pass paired with the pass the others were reducing.
HERD_MPI_TEST_CASE("DistributedDataParallel: a gradient refused on one rank alone makes its next forward refuse, and the others raise at once", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  const bool refusing = comm.rank() == comm.size() - 1;
  torch::nn::Embedding table(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  torch::nn::Sequential model(table);
  herd::torch::DistributedDataParallel ddp(model, comm);
  const torch::Tensor ids = torch::tensor({{1, 2}, {3, 4}}, torch::kLong);
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    torch::Tensor loss = ddp.forward(ids).sum();
    if (refusing) loss = loss + table->weight.sum();  // a dense gradient for the table, on this rank
    loss.backward();
  } catch (const std::exception& e) {
    message = e.what();
  }
  INFO(message);
  if (refusing) {
    CHECK(has(message, "parameter 0.weight, the weight of an Embedding or EmbeddingBag with sparse=true, got a dense gradient"));
    const std::string refused = herd_test::error_of([&] { ddp.forward(ids).sum().backward(); });
    INFO(refused);
    CHECK(has(refused, "the last backward pass raised on this rank"));
    CHECK(has(refused, "comm.renew()"));
  } else {
    CHECK(has(message, "rank " + std::to_string(comm.size() - 1)));
    CHECK(has(message, "the last backward pass raised on this rank"));
  }
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < 20);
}

HERD_MPI_TEST_CASE("DistributedDataParallel with find_unused_parameters: a parameter the loss uses outside the forward raises on every rank, as DDP's", 2) {
  herd::mpi_communicator comm;
  torch::set_num_threads(1);
  torch::manual_seed(5);
  auto model = std::make_shared<breaks_in_backward>(false);  // its forward uses both layers
  struct first_only : torch::nn::Module {
    explicit first_only(std::shared_ptr<breaks_in_backward> m) : inner(register_module("inner", std::move(m))) {}
    torch::Tensor forward(torch::Tensor x) { return inner->first->forward(x); }
    std::shared_ptr<breaks_in_backward> inner;
  };
  auto net = std::make_shared<first_only>(model);
  herd::optimizer_options options;
  options.find_unused_parameters = true;
  herd::torch::DistributedDataParallel ddp(net, comm, options);
  const torch::Tensor x = torch::ones({2, 4});
  // The forward's output does not reach the second layer; the loss does, by another way.
  const std::string message = herd_test::error_of([&] { (ddp.forward(x).sum() + model->second->weight.sum()).backward(); });
  INFO(message);
  CHECK(has(message, "parameter inner.second.weight got a gradient in backward but the output of the last forward"));
  // Used inside the forward only, the next passes reduce.
  for (int pass = 0; pass < 2; ++pass) CHECK(herd_test::error_of([&] { ddp.forward(x).sum().backward(); }) == "(no herd::error)");
}
