// herd's side of the libtorch parity checks, run under mpiexec: parity_torch CHECK DIR reads
// DIR/CHECK.safetensors (reference.py) and compares what herd's libtorch layers compute on each
// rank's part of the batch with what PyTorch computed on the whole. Exits 0 when every rank is
// within bounds, 1 otherwise, 77 (skipped) when reference.py found no torch.
//
// torch/sync_batch_norm.hpp comes before torch/distributed_data_parallel.hpp on purpose: the two
// compile in either order.

#include <torch/torch.h>

#include <herd/torch/sync_batch_norm.hpp>
#include <herd/torch/distributed_data_parallel.hpp>
#include <herd/herd.hpp>
#include <herd/torch/gradients.hpp>
#include <herd/torch/tensor_traits.hpp>

#include "parity.hpp"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace parity;
namespace fs = std::filesystem;

::torch::Tensor tensor(const reference& ref, const std::string& name) {
  auto values = ref.get<double>(name);
  return ::torch::from_blob(values.data(), ref.shape(name), ::torch::kDouble).clone();
}

void check(comparison& cmp, const std::string& what, const ::torch::Tensor& herd, const ::torch::Tensor& torch) {
  if (herd.sizes() != torch.sizes()) throw std::runtime_error(what + ": shapes differ");
  const ::torch::Tensor a = herd.detach().to(::torch::kDouble).contiguous(), b = torch.detach().to(::torch::kDouble).contiguous();
  cmp.check(what, a.data_ptr<double>(), b.data_ptr<double>(), static_cast<std::size_t>(a.numel()));
}

// herd::torch::SyncBatchNorm on this rank's part of each batch against BatchNorm2d on the whole
// (f64): outputs and input gradients of this rank's part, weight and bias gradients summed over
// the ranks, running statistics; then eval, which must not communicate.
int sync_batch_norm(const reference& ref, herd::mpi_communicator& comm) {
  comparison cmp(1e-9);
  const auto world = comm.size(), rank = comm.rank();
  const auto splits = ref.get<std::int64_t>("split." + std::to_string(world));
  const auto part = [&](const ::torch::Tensor& t, std::size_t it) {
    std::int64_t begin = 0;
    for (int r = 0; r < rank; ++r) begin += splits[it * static_cast<std::size_t>(world) + static_cast<std::size_t>(r)];
    return t.narrow(0, begin, splits[it * static_cast<std::size_t>(world) + static_cast<std::size_t>(rank)]);
  };
  const auto cases = ref.get<std::int64_t>("cases")[0];
  for (std::int64_t c = 0; c < cases; ++c) {
    const std::string p = std::to_string(c) + ".";
    const auto o = ref.get<double>(p + "options");
    const bool affine = o[0] != 0, track = o[1] != 0;
    auto options = ::torch::nn::BatchNormOptions(3).affine(affine).track_running_stats(track);
    options.momentum(o[2] < 0 ? c10::optional<double>() : c10::optional<double>(o[2]));
    herd::torch::SyncBatchNorm bn(options, comm);
    bn->to(::torch::kDouble);
    if (affine) {
      const ::torch::NoGradGuard no_grad;
      bn->weight.copy_(tensor(ref, p + "weight"));
      bn->bias.copy_(tensor(ref, p + "bias"));
    }
    bn->train();
    for (std::size_t it = 0; it < 3; ++it) {
      const std::string q = p + std::to_string(it) + ".";
      const ::torch::Tensor x = part(tensor(ref, q + "x"), it).clone().requires_grad_();
      const ::torch::Tensor y = bn(x);
      (y * part(tensor(ref, q + "out_weight"), it)).sum().backward();
      check(cmp, q + "y", y, part(tensor(ref, q + "y"), it));
      check(cmp, q + "dx", x.grad(), part(tensor(ref, q + "dx"), it));
      if (affine) {
        ::torch::Tensor dweight = bn->weight.grad().clone(), dbias = bn->bias.grad().clone();
        herd::allreduce(dweight, comm);  // each rank's contribution, as DDP would sum them
        herd::allreduce(dbias, comm);
        check(cmp, q + "dweight", dweight, tensor(ref, q + "dweight"));
        check(cmp, q + "dbias", dbias, tensor(ref, q + "dbias"));
        bn->weight.mutable_grad() = ::torch::Tensor();
        bn->bias.mutable_grad() = ::torch::Tensor();
      }
      if (track) {
        check(cmp, q + "running_mean", bn->running_mean, tensor(ref, q + "running_mean"));
        check(cmp, q + "running_var", bn->running_var, tensor(ref, q + "running_var"));
        const auto tracked = ref.get<std::int64_t>(q + "num_batches_tracked")[0];
        if (bn->num_batches_tracked.item<std::int64_t>() != tracked) throw std::runtime_error(q + "num_batches_tracked differs");
      }
    }
    // Eval on rank 0 alone: a SyncBatchNorm that communicated here would wait for the others.
    bn->eval();
    if (rank == 0) {
      const ::torch::NoGradGuard no_grad;
      const ::torch::Tensor x = part(tensor(ref, p + "eval.x"), 0);
      check(cmp, p + "eval.y", bn(x), part(tensor(ref, p + "eval.y." + std::to_string(world)), 0));
    }
    herd::barrier(comm);
  }
  std::printf("rank %d of %d: ", rank, world);
  return cmp.report("parity_sync_batch_norm");
}

// The model of reference.py's DDP scenarios, its parameters registered in the same order.
struct NetImpl : ::torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", ::torch::nn::Linear(::torch::nn::LinearOptions(6, 8).bias(false)))),
        bn(register_module("bn", ::torch::nn::BatchNorm1d(8))),
        fc2(register_module("fc2", ::torch::nn::Linear(8, 4))),
        extra(register_module("extra", ::torch::nn::Linear(8, 4))),
        unused(register_module("unused", ::torch::nn::Linear(4, 4))) {}

  ::torch::Tensor forward(const ::torch::Tensor& x, bool use_extra) {
    const ::torch::Tensor h = ::torch::relu(bn(fc1(x)));
    const ::torch::Tensor y = fc2(h);
    return use_extra ? y + extra(h) : y;
  }

  ::torch::nn::Linear fc1;
  ::torch::nn::BatchNorm1d bn;
  ::torch::nn::Linear fc2, extra, unused;
};

// The model of reference.py's DDP_LAYOUT_SCENARIOS: a channels_last convolution weight and a
// parameter stored transposed.
struct LayoutNetImpl : ::torch::nn::Module {
  LayoutNetImpl()
      : conv(register_module("conv", ::torch::nn::Conv2d(::torch::nn::Conv2dOptions(3, 4, 3).padding(1).bias(false)))),
        bn(register_module("bn", ::torch::nn::BatchNorm2d(4))),
        fc(register_module("fc", ::torch::nn::Linear(4 * 5 * 5, 6))),
        proj(register_parameter("proj", ::torch::zeros({6, 2}))) {
    const ::torch::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(::torch::MemoryFormat::ChannelsLast));
    proj.set_data(proj.t().contiguous().t());  // strides (1, 6)
  }

  ::torch::Tensor forward(const ::torch::Tensor& x) {
    const ::torch::Tensor h = ::torch::relu(bn(conv(x)));
    return ::torch::matmul(fc(h.flatten(1)), proj);
  }

  ::torch::nn::Conv2d conv;
  ::torch::nn::BatchNorm2d bn;
  ::torch::nn::Linear fc;
  ::torch::Tensor proj;
};

// The model of reference.py's DDP_SPARSE_SCENARIOS: an Embedding with sparse gradients.
struct SparseNetImpl : ::torch::nn::Module {
  SparseNetImpl()
      : emb(register_module("emb", ::torch::nn::Embedding(::torch::nn::EmbeddingOptions(12, 3).sparse(true)))),
        fc(register_module("fc", ::torch::nn::Linear(3, 2))) {}

  ::torch::Tensor forward(const ::torch::Tensor& ids) { return fc(emb(ids).mean(1)); }

  ::torch::nn::Embedding emb;
  ::torch::nn::Linear fc;
};

::torch::Tensor any_tensor(const reference& ref, const std::string& name) {
  if (name.ends_with("num_batches_tracked")) return ::torch::tensor(ref.get<std::int64_t>(name)[0]);
  return tensor(ref, name);
}

// The model of scenario `p0` with reference.py's initial values.
std::shared_ptr<NetImpl> scenario_model(const reference& ref, const std::string& p0) {
  auto model = std::make_shared<NetImpl>();
  const ::torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(any_tensor(ref, p0 + "init." + item.key()));
  for (auto& item : model->named_buffers()) item.value().copy_(any_tensor(ref, p0 + "init." + item.key()));
  return model;
}

// A model of reference.py's with its initial values of scenario `p0` (copied element by
// element: layouts stay).
template <class Net> std::shared_ptr<Net> model_from(const reference& ref, const std::string& p0) {
  auto model = std::make_shared<Net>();
  const ::torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(any_tensor(ref, p0 + "init." + item.key()));
  for (auto& item : model->named_buffers()) item.value().copy_(any_tensor(ref, p0 + "init." + item.key()));
  return model;
}

// Which gradients are defined, and their values, against reference.py's record `p`.
void compare_gradients(comparison& cmp, std::size_t& problems, const reference& ref, const std::string& p,
                       const ::torch::OrderedDict<std::string, ::torch::Tensor>& named) {
  const auto defined = ref.get<std::int64_t>(p + "grad_defined");
  for (std::size_t i = 0; i < named.size(); ++i) {
    const auto& g = named[i].value().grad();
    if (g.defined() != (defined[i] != 0)) {
      if (problems++ < 4) {
        std::printf("  %s: the gradient of %s is %s here, %s in torch\n", p.c_str(), named[i].key().c_str(),
                    g.defined() ? "defined" : "undefined", defined[i] ? "defined" : "undefined");
      }
    } else if (g.defined()) {
      check(cmp, p + "grad." + named[i].key(), g, tensor(ref, p + "grad." + named[i].key()));
    }
  }
}

// Parameters and buffers against reference.py's record `p`.
template <class Net> void compare_state(comparison& cmp, const reference& ref, const std::string& p, Net& model) {
  for (auto& item : model.named_parameters()) check(cmp, p + "state." + item.key(), item.value(), tensor(ref, p + "state." + item.key()));
  for (auto& item : model.named_buffers()) {
    check(cmp, p + "state." + item.key(), item.value().to(::torch::kDouble),
          any_tensor(ref, p + "state." + item.key()).to(::torch::kDouble));
  }
}

// herd::torch::DistributedDataParallel against torch.nn.parallel.DistributedDataParallel (gloo)
// at the same world size, on this rank's batches: which gradients are defined, their values after
// each backward, and the parameters and buffers after each step of libtorch's SGD.
int ddp(const fs::path& dir, herd::mpi_communicator& comm) {
  comparison cmp(1e-9);
  const reference scenarios(dir / "ddp.safetensors");
  const reference ref(dir / ("ddp." + std::to_string(comm.size()) + "." + std::to_string(comm.rank()) + ".safetensors"));
  const auto table = scenarios.get<std::int64_t>("scenarios");
  const auto shape = scenarios.get<std::int64_t>("shape");
  ::torch::set_default_dtype(::caffe2::TypeMeta::Make<double>());  // the model in f64, as reference.py's
  std::size_t problems = 0;
  for (std::size_t s = 0; s < table.size() / 5; ++s) {
    const std::int64_t* o = &table[5 * s];
    const std::string p0 = std::to_string(s) + ".";
    auto model = scenario_model(ref, p0);
    herd::optimizer_options options{.bucket_bytes = o[1] != 0 ? static_cast<std::size_t>(o[1]) : herd::optimizer_options{}.bucket_bytes,
                                    .find_unused_parameters = o[0] != 0,
                                    .gradient_as_bucket_view = o[2] != 0};
    if (o[1] != 0) options.first_bucket_bytes = static_cast<std::size_t>(o[1]);
    herd::torch::DistributedDataParallel ddp(model, comm, options);
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto named = model->named_parameters();
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(o[3] != 0);  // set_to_none as reference.py's (libtorch's default changed in 2.0)
      for (std::int64_t k = 0; k < o[4]; ++k) {
        const std::string q = p + std::to_string(k) + ".";
        const auto pass = [&] {
          ::torch::mse_loss(ddp.forward(tensor(ref, q + "x"), comm.rank() == 1), tensor(ref, q + "target")).backward();
        };
        if (k + 1 < o[4]) {
          const auto guard = ddp.no_sync();
          pass();
        } else {
          pass();
        }
      }
      compare_gradients(cmp, problems, ref, p, named);
      sgd.step();
      compare_state(cmp, ref, p, *model);
    }
  }
  // reference.py's DDP_SYNC_SCENARIOS: whether a backward reduces is decided by its forward. A
  // first pass of each kind, then an ordinary one, the gradients compared after each.
  const auto sync_table = scenarios.get<std::int64_t>("sync_scenarios");
  for (std::size_t s = 0; s < sync_table.size() / 2; ++s) {
    const std::int64_t as_view = sync_table[2 * s], kind = sync_table[2 * s + 1];
    const std::string p0 = "s" + std::to_string(s) + ".";
    auto model = scenario_model(ref, p0);
    herd::torch::DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true, .gradient_as_bucket_view = as_view != 0});
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto named = model->named_parameters();
    const bool use_extra = comm.rank() == 1;
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(true);
      for (int k = 0; k < 2; ++k) {
        const std::string q = p + std::to_string(k) + ".";
        const ::torch::Tensor x = tensor(ref, q + "x"), target = tensor(ref, q + "target");
        if (k == 1) {
          ::torch::mse_loss(ddp.forward(x, use_extra), target).backward();
        } else if (kind == 1) {  // forward under no_sync(), backward after it: no reduction
          ::torch::Tensor y;
          {
            const auto guard = ddp.no_sync();
            y = ddp.forward(x, use_extra);
          }
          ::torch::mse_loss(y, target).backward();
        } else if (kind == 2) {  // forward before no_sync(), backward under it: reduces
          const ::torch::Tensor y = ddp.forward(x, use_extra);
          const auto guard = ddp.no_sync();
          ::torch::mse_loss(y, target).backward();
        } else if (kind == 3) {  // a second backward of the same forward adds local gradients
          const ::torch::Tensor loss = ::torch::mse_loss(ddp.forward(x, use_extra), target);
          loss.backward({}, /*retain_graph=*/true);
          loss.backward();
        } else {  // the module itself, bypassing the wrapper: no reduction
          ::torch::mse_loss(model->forward(x, use_extra), target).backward();
        }
        compare_gradients(cmp, problems, ref, q, named);
      }
      sgd.step();
      compare_state(cmp, ref, p, *model);
    }
  }
  // reference.py's DDP_LAYOUT_SCENARIOS: parameters in other memory layouts. The gradients'
  // values and strides (DDP's follow each parameter's layout), then the state after each step.
  const auto layout_table = scenarios.get<std::int64_t>("layout_scenarios");
  for (std::size_t s = 0; s < layout_table.size() / 2; ++s) {
    const std::int64_t as_view = layout_table[2 * s], bucket = layout_table[2 * s + 1];
    const std::string p0 = "l" + std::to_string(s) + ".";
    auto model = model_from<LayoutNetImpl>(ref, p0);
    herd::optimizer_options options{.gradient_as_bucket_view = as_view != 0};
    if (bucket != 0) options.bucket_bytes = options.first_bucket_bytes = static_cast<std::size_t>(bucket);
    herd::torch::DistributedDataParallel ddp(model, comm, options);
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto named = model->named_parameters();
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(false);
      const ::torch::Tensor x = tensor(ref, p + "x").contiguous(::torch::MemoryFormat::ChannelsLast);
      ::torch::mse_loss(ddp.forward(x), tensor(ref, p + "target")).backward();
      for (const auto& item : named) {
        const ::torch::Tensor& g = item.value().grad();
        const auto want = ref.get<std::int64_t>(p + "grad_strides." + item.key());
        if (!g.defined()) {
          if (problems++ < 4) std::printf("  %s: the gradient of %s is undefined here\n", p.c_str(), item.key().c_str());
          continue;
        }
        if (std::vector<std::int64_t>(g.strides().begin(), g.strides().end()) != want) {
          if (problems++ < 4) {
            std::ostringstream text;
            text << g.strides();
            std::printf("  %s: the gradient of %s has strides %s here, not torch's\n", p.c_str(), item.key().c_str(),
                        text.str().c_str());
          }
        }
        check(cmp, p + "grad." + item.key(), g, tensor(ref, p + "grad." + item.key()));
      }
      // How many storages the gradients use: one, their bucket's, with gradient_as_bucket_view.
      std::set<const void*> storages;
      for (const auto& item : named) storages.insert(item.value().grad().storage().unsafeGetStorageImpl());
      const auto want = ref.get<std::int64_t>(p + "grad_storages")[0];
      if (bucket == 0 && static_cast<std::int64_t>(storages.size()) != want && problems++ < 4) {
        std::printf("  %s: the gradients use %zu storages here, %lld in torch\n", p.c_str(), storages.size(),
                    static_cast<long long>(want));
      }
      sgd.step();
      compare_state(cmp, ref, p, *model);
    }
  }
  // reference.py's DDP_SPARSE_SCENARIOS: an Embedding's sparse gradients, kept out of the
  // buckets and reduced as DDP's over gloo. Their values (dense), whether each is sparse, and the
  // state after each step.
  const auto sparse_table = scenarios.get<std::int64_t>("sparse_scenarios");
  for (std::size_t s = 0; s < sparse_table.size() / 3; ++s) {
    const std::int64_t* o = &sparse_table[3 * s];
    const std::string p0 = "e" + std::to_string(s) + ".";
    auto model = model_from<SparseNetImpl>(ref, p0);
    herd::torch::DistributedDataParallel ddp(model, comm, {.find_unused_parameters = o[0] != 0, .gradient_as_bucket_view = o[1] != 0});
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto named = model->named_parameters();
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(true);
      for (std::int64_t k = 0; k < o[2]; ++k) {
        const std::string q = p + std::to_string(k) + ".";
        const auto ids_values = ref.get<std::int64_t>(q + "ids");
        const ::torch::Tensor ids = ::torch::tensor(ids_values, ::torch::kLong).reshape(ref.shape(q + "ids"));
        const auto pass = [&] { ::torch::mse_loss(ddp.forward(ids), tensor(ref, q + "target")).backward(); };
        if (k + 1 < o[2]) {
          const auto guard = ddp.no_sync();
          pass();
        } else {
          pass();
        }
      }
      for (const auto& item : named) {
        const ::torch::Tensor& g = item.value().grad();
        if (!g.defined()) {
          if (problems++ < 4) std::printf("  %s: the gradient of %s is undefined here\n", p.c_str(), item.key().c_str());
          continue;
        }
        if ((g.is_sparse() ? 1 : 0) != ref.get<std::int64_t>(p + "grad_sparse." + item.key())[0] && problems++ < 4) {
          std::printf("  %s: the gradient of %s is %s here, not in torch\n", p.c_str(), item.key().c_str(),
                      g.is_sparse() ? "sparse" : "dense");
        }
        check(cmp, p + "grad." + item.key(), g.is_sparse() ? g.to_dense() : g, tensor(ref, p + "grad." + item.key()));
      }
      sgd.step();
      compare_state(cmp, ref, p, *model);
    }
  }
  std::printf("rank %d of %d: ", comm.rank(), comm.size());
  const int values = cmp.report("parity_ddp");
  std::printf("rank %d of %d: parity_ddp: %zu gradients defined or laid out differently\n", comm.rank(), comm.size(), problems);
  return values == 0 && problems == 0 ? 0 : 1;
}

// reference.py's DDP_MORE_SCENARIOS: uneven inputs (DDP under Join([ddp]): the last rank has one
// iteration, then join()), static_graph, and a layer used only in a no_sync() pass, against
// torch's DDP on every rank after each of its iterations and after the join (every rank then
// holds the last joiner's model).
int ddp_join_static(const fs::path& dir, herd::mpi_communicator& comm, const torch_version& version) {
  comparison cmp(1e-9);
  const reference scenarios(dir / "ddp.safetensors");
  const reference ref(dir / ("ddp." + std::to_string(comm.size()) + "." + std::to_string(comm.rank()) + ".safetensors"));
  const auto table = scenarios.get<std::int64_t>("more_scenarios");
  const auto shape = scenarios.get<std::int64_t>("shape");
  ::torch::set_default_dtype(::caffe2::TypeMeta::Make<double>());
  std::size_t problems = 0;
  for (std::size_t s = 0; s < table.size() / 5; ++s) {
    const std::int64_t* o = &table[5 * s];
    const std::string p0 = "j" + std::to_string(s) + ".";
    if (o[4] == 1 && !version.at_least(2, 4)) {
      // Rank 0 alone uses `extra` in a no_sync() pass and no rank in the pass after it. PyTorch 2.4
      // and later (as herd) count what no_sync() passes used and average that gradient; before,
      // DDP forgot it (pytorch/pytorch#69031): rank 0 kept its own sum, the others none.
      if (comm.rank() == 0) std::printf("  %s: skipped: PyTorch %s forgets what no_sync() passes used (fixed in 2.4)\n", p0.c_str(), version.text.c_str());
      continue;
    }
    auto model = scenario_model(ref, p0);
    herd::optimizer_options options{.bucket_bytes = o[3] != 0 ? static_cast<std::size_t>(o[3]) : herd::optimizer_options{}.bucket_bytes,
                                    .find_unused_parameters = o[2] != 0,
                                    .static_graph = o[1] != 0,
                                    .uneven_inputs = o[0] != 0};
    if (o[3] != 0) options.first_bucket_bytes = static_cast<std::size_t>(o[3]);
    herd::torch::DistributedDataParallel ddp(model, comm, options);
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    const auto named = model->named_parameters();
    const std::int64_t iterations = o[0] != 0 && comm.rank() == comm.size() - 1 ? 1 : shape[0];
    for (std::int64_t it = 0; it < iterations; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(true);  // set_to_none, as reference.py's
      if (o[4] != 0) {
        const auto guard = ddp.no_sync();
        ::torch::mse_loss(ddp.forward(tensor(ref, p + "early.x"), comm.rank() == 0), tensor(ref, p + "early.target")).backward();
      }
      ::torch::mse_loss(ddp.forward(tensor(ref, p + "x"), comm.rank() == 1 && o[4] != 1), tensor(ref, p + "target")).backward();
      compare_gradients(cmp, problems, ref, p, named);
      sgd.step();
      compare_state(cmp, ref, p, *model);
    }
    if (o[0] != 0) ddp.join();
    compare_gradients(cmp, problems, ref, p0 + "final.", named);
    compare_state(cmp, ref, p0 + "final.", *model);
  }
  std::printf("rank %d of %d: ", comm.rank(), comm.size());
  const int values = cmp.report("parity_ddp_join_static");
  std::printf("rank %d of %d: parity_ddp_join_static: %zu gradients defined differently\n", comm.rank(), comm.size(), problems);
  return values == 0 && problems == 0 ? 0 : 1;
}

// herd::distributed_optimizer over herd::torch_gradients (Horovod's way: step() after every
// backward pass, the gradients left to accumulate in .grad between zero_grad() calls) against the
// same DDP runs (the first k - 1 of k passes under no_sync() there): the reduced gradients and the
// parameters and buffers after every step. Where DDP leaves a gradient undefined (a parameter no
// rank used), torch_gradients' must be undefined too. Rank 0's buffers are broadcast before each
// iteration's first forward, where DDP broadcasts them.
int torch_optimizer(const fs::path& dir, herd::mpi_communicator& comm) {
  comparison cmp(1e-9);
  const reference scenarios(dir / "ddp.safetensors");
  const reference ref(dir / ("ddp." + std::to_string(comm.size()) + "." + std::to_string(comm.rank()) + ".safetensors"));
  const auto table = scenarios.get<std::int64_t>("scenarios");
  const auto shape = scenarios.get<std::int64_t>("shape");
  ::torch::set_default_dtype(::caffe2::TypeMeta::Make<double>());
  std::size_t problems = 0;
  for (std::size_t s = 0; s < table.size() / 5; ++s) {
    const std::int64_t* o = &table[5 * s];
    const std::string p0 = std::to_string(s) + ".";
    auto model = scenario_model(ref, p0);
    ::torch::optim::SGD sgd(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    herd::distributed_optimizer opt(sgd, herd::torch_gradients(sgd), comm,
                                    {.backward_passes_per_step = static_cast<int>(o[4])});
    const auto named = model->named_parameters();
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      model->zero_grad(o[3] != 0);  // set_to_none as reference.py's (libtorch's default changed in 2.0)
      {
        const ::torch::NoGradGuard no_grad;
        for (auto& b : model->buffers()) herd::broadcast(b, comm, 0);
      }
      bool stepped = false;
      for (std::int64_t k = 0; k < o[4]; ++k) {
        const std::string q = p + std::to_string(k) + ".";
        ::torch::mse_loss(model->forward(tensor(ref, q + "x"), comm.rank() == 1), tensor(ref, q + "target")).backward();
        stepped = opt.step();
        if (stepped != (k + 1 == o[4]) && problems++ < 4) {
          std::printf("  %s: step() after pass %lld of %lld %s\n", p.c_str(), static_cast<long long>(k + 1),
                      static_cast<long long>(o[4]), stepped ? "stepped" : "did not step");
        }
      }
      compare_gradients(cmp, problems, ref, p, named);
      compare_state(cmp, ref, p, *model);
    }
  }
  std::printf("rank %d of %d: ", comm.rank(), comm.size());
  const int values = cmp.report("parity_torch_optimizer");
  std::printf("rank %d of %d: parity_torch_optimizer: %zu other problems\n", comm.rank(), comm.size(), problems);
  return values == 0 && problems == 0 ? 0 : 1;
}

// herd::distributed_optimizer over herd::torch_gradients against PyTorch's SGD (momentum, weight
// decay) and AdamW stepping the ranks' averaged gradients (reference.py): a parameter that no rank
// used in a step has no gradient there either, so that neither momentum nor weight decay moves it
// (`unused`, and `extra` after the first iteration, where rank 1 alone uses it).
int unused_gradients(const reference& ref, herd::mpi_communicator& comm) {
  comparison cmp(1e-9);
  const auto shape = ref.get<std::int64_t>("shape");
  const auto cases = ref.get<double>("cases");
  ::torch::set_default_dtype(::caffe2::TypeMeta::Make<double>());
  std::size_t problems = 0;
  for (std::size_t c = 0; c < cases.size() / 4; ++c) {
    const double* o = &cases[4 * c];
    const std::string p0 = std::to_string(comm.size()) + "." + std::to_string(c) + ".";
    auto model = scenario_model(ref, p0);
    std::unique_ptr<::torch::optim::Optimizer> inner;
    if (o[0] == 0) {
      inner = std::make_unique<::torch::optim::SGD>(model->parameters(),
                                                    ::torch::optim::SGDOptions(o[1]).momentum(o[2]).weight_decay(o[3]));
    } else {
      inner = std::make_unique<::torch::optim::AdamW>(
          model->parameters(), ::torch::optim::AdamWOptions(o[1]).betas({o[2], 0.999}).weight_decay(o[3]));
    }
    herd::distributed_optimizer opt(*inner, herd::torch_gradients(*inner), comm);
    const auto named = model->named_parameters();
    for (std::int64_t it = 0; it < shape[0]; ++it) {
      const std::string p = p0 + std::to_string(it) + ".";
      const std::string q = p + std::to_string(comm.rank()) + ".";
      model->zero_grad(true);
      ::torch::mse_loss(model->forward(tensor(ref, q + "x"), comm.rank() == 1 && it == 0), tensor(ref, q + "target")).backward();
      opt.step();
      const auto defined = ref.get<std::int64_t>(p + "grad_defined");
      for (std::size_t i = 0; i < named.size(); ++i) {
        if (named[i].value().grad().defined() != (defined[i] != 0) && problems++ < 4) {
          std::printf("  %s: the gradient of %s is %s here, %s in torch\n", p.c_str(), named[i].key().c_str(),
                      defined[i] ? "undefined" : "defined", defined[i] ? "defined" : "undefined");
        }
        check(cmp, p + "state." + named[i].key(), named[i].value(), tensor(ref, p + "state." + named[i].key()));
      }
    }
  }
  std::printf("rank %d of %d: ", comm.rank(), comm.size());
  const int values = cmp.report("parity_unused_gradients");
  std::printf("rank %d of %d: parity_unused_gradients: %zu gradients defined differently\n", comm.rank(), comm.size(), problems);
  return values == 0 && problems == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment mpi(argc, argv);
  herd::mpi_communicator comm;
  const std::string check = argc == 3 ? argv[1] : "";
  if (check != "sync_batch_norm" && check != "ddp" && check != "ddp_join_static" && check != "torch_optimizer" &&
      check != "unused_gradients") {
    std::fprintf(stderr, "usage: parity_torch sync_batch_norm|ddp|ddp_join_static|torch_optimizer|unused_gradients DIR\n");
    return 2;
  }
  const fs::path dir = argv[2];
  if (fs::exists(dir / "torch_missing")) {
    std::printf("skipped: reference.py found no torch\n");
    return 77;
  }
  int failed = 0;
  try {
    if (comm.rank() == 0) std::printf("parity_%s against PyTorch %s\n", argv[1], torch_version::of(dir).text.c_str());
    failed = check == "ddp"               ? ddp(dir, comm)
             : check == "ddp_join_static" ? ddp_join_static(dir, comm, torch_version::of(dir))
             : check == "torch_optimizer" ? torch_optimizer(dir, comm)
             : check == "unused_gradients" ? unused_gradients(reference(dir / "unused_gradients.safetensors"), comm)
                                          : sync_batch_norm(reference(dir / "sync_batch_norm.safetensors"), comm);
  } catch (const std::exception& e) {
    std::printf("rank %d: parity_%s: %s\n", comm.rank(), argv[1], e.what());
    failed = 1;
  }
  // Every rank's verdict: a failure on one fails them all.
  try {
    std::vector<int> any = {failed};
    herd::allreduce(any, comm, herd::reduce_op::max);
    return any[0];
  } catch (const std::exception& e) {
    std::printf("rank %d: %s\n", comm.rank(), e.what());
    return 1;
  }
}
