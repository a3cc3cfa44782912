// herd's side of the host parity checks: parity_host CHECK DIR reads DIR/CHECK.safetensors (or, for
// a check on several ranks, each rank's own file), written by reference.py (inputs from a fixed
// seed and PyTorch's results), computes the same with herd and compares. It prints the largest
// difference and exits 0 when it is within the check's bound, 1 otherwise, 77 (skipped) when
// reference.py found no torch.

#include <herd/herd.hpp>

#include "parity.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace parity;
namespace fs = std::filesystem;

torch_version reference_torch;  // the PyTorch of the reference files, read first

// Where the reference's torch.sqrt does not round to the nearest (PyPI's x86 wheels take it from
// MKL's vector math: within 1 ulp; reference.py measures it), AdamW's parameters can only agree
// within a bound over 50 steps (herd's std::sqrt rounds correctly): 1e-5 relative, relative to
// 1e-3 at least (the parameters that start at 0 cross it). Its moments, which take no square
// root, must still be bit-identical.
constexpr double sqrt_rounding_bound = 1e-5;
constexpr double sqrt_rounding_scale = 1e-3;

// Runs each case of an optimizer check: both dtypes, every step compared with torch.optim's: the
// parameters and the optimizer state the reference recorded (AdamW's exp_avg and exp_avg_sq), bit
// for bit; the parameters of an optimizer that takes a square root (`takes_sqrt`) within
// sqrt_rounding_bound where the reference's sqrt does not round correctly.
template <class Make> int optimizer_check(const char* check, const reference& ref, Make make, bool takes_sqrt = false) {
  const auto exact_sqrt = ref.get<std::int64_t>("sqrt_correctly_rounded");
  comparison state_cmp(0);
  std::size_t state_values = 0;
  int failed = 0;
  const auto cases = ref.get<std::int64_t>("cases")[0];
  const auto run = [&]<class T>(T, const char* dn, std::size_t d) {
    const bool bounded = takes_sqrt && exact_sqrt[d] == 0;
    comparison cmp(bounded ? sqrt_rounding_bound : 0, bounded ? sqrt_rounding_scale : 1e-30);
    for (std::int64_t c = 0; c < cases; ++c) {
      const auto options = ref.get<double>(std::to_string(c) + ".options");
      const std::string prefix = std::to_string(c) + "." + dn + ".";
      std::vector<std::vector<T>> params, grads, torch, all_grads;
      for (std::size_t k = 0; k < 2; ++k) {
        params.push_back(ref.get<T>(prefix + "init." + std::to_string(k)));
        all_grads.push_back(ref.get<T>(prefix + "grads." + std::to_string(k)));
        torch.push_back(ref.get<T>(prefix + "torch." + std::to_string(k)));
        grads.emplace_back(params.back().size());
      }
      auto opt = make(herd::views(params[0], params[1]), herd::views(grads[0], grads[1]), options);
      const std::size_t steps = all_grads[0].size() / params[0].size();
      for (std::size_t s = 0; s < steps; ++s) {
        for (std::size_t k = 0; k < 2; ++k) std::memcpy(grads[k].data(), all_grads[k].data() + s * grads[k].size(), grads[k].size() * sizeof(T));
        opt.step();
        const std::string step = " step " + std::to_string(s + 1);
        for (std::size_t k = 0; k < 2; ++k) {
          cmp.check(prefix + "param." + std::to_string(k) + step, params[k].data(), torch[k].data() + s * params[k].size(), params[k].size());
        }
        opt.visit_state([&](const std::string& name, const herd::buffer_view& v) {
          if (!ref.contains(prefix + name)) return;  // state the reference did not record (the step count)
          const auto recorded = ref.get<T>(prefix + name);
          state_cmp.check(prefix + name + step, static_cast<const T*>(v.data), recorded.data() + s * v.count, v.count);
          state_values += v.count;
        });
      }
    }
    failed |= cmp.report((std::string(check) + " (parameters, " + dn + ")").c_str());
  };
  run(float{}, "f32", 0);
  run(double{}, "f64", 1);
  if (state_values != 0) failed |= state_cmp.report((std::string(check) + " (optimizer state)").c_str());
  return failed;
}

int sgd(const reference& ref) {
  return optimizer_check("parity_sgd", ref, [](auto params, auto grads, const std::vector<double>& o) {
    return herd::sgd(std::move(params), std::move(grads),
                     {.lr = o[0], .momentum = o[1], .dampening = o[2], .nesterov = o[3] != 0, .weight_decay = o[4]});
  });
}

// herd::adamw with the first-moment update of the reference's PyTorch: lerp_ from 2.1, mul_ and
// add_ before (bit for bit either way).
int adamw(const reference& ref) {
  return optimizer_check(
      "parity_adamw", ref,
      [](auto params, auto grads, const std::vector<double>& o) {
        return herd::adamw(std::move(params), std::move(grads),
                           {.lr = o[0], .beta1 = o[1], .beta2 = o[2], .eps = o[3], .weight_decay = o[4],
                            .first_moment = adamw_first_moment_of(reference_torch)});
      },
      true);
}

// f16 parameters, f32 masters stepped by SGD, under the loss scaler: the scale before each step,
// which steps are skipped, and the parameters, against GradScaler's rule (apex's cap in case 0).
int loss_scaler(const reference& ref) {
  comparison cmp(0);
  for (int c = 0; c < 2; ++c) {
    const std::string prefix = std::to_string(c) + ".";
    const auto o = ref.get<double>(prefix + "options");
    const auto all_grads = ref.get<herd::half>(prefix + "grads");
    const auto scales = ref.get<double>(prefix + "scales");
    const auto torch = ref.get<herd::half>(prefix + "torch");
    auto params = ref.get<herd::half>(prefix + "init");
    std::vector<herd::half> grads(params.size());
    herd::loss_scaler scaler({.initial_scale = o[0], .growth_interval = static_cast<std::int64_t>(o[1]), .max_scale = o[2]});
    herd::mixed_precision amp(herd::views(params), herd::views(grads), scaler, [](auto p, auto g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9});
    });
    for (std::size_t s = 0; s + 1 < scales.size(); ++s) {
      const double before = scaler.scale();
      cmp.check(prefix + "scale before step " + std::to_string(s + 1), &before, &scales[s], 1);
      std::memcpy(grads.data(), all_grads.data() + s * grads.size(), grads.size() * sizeof(herd::half));
      amp.step();
      cmp.check(prefix + "param step " + std::to_string(s + 1), params.data(), torch.data() + s * params.size(), params.size());
    }
    const double last = scaler.scale();
    cmp.check(prefix + "final scale", &last, &scales.back(), 1);
  }
  return cmp.report("parity_loss_scaler");
}

// herd::clip_grad_norm against torch.nn.utils.clip_grad_norm_, which sums in f32 (herd in double):
// within 1e-6 relative. On f32 gradients, and on f16 ones after mixed_precision::unscale().
int clip_grad_norm(const reference& ref) {
  comparison cmp(1e-6);
  for (int c = 0; c < 2; ++c) {
    const std::string prefix = std::to_string(c) + ".";
    std::vector<std::vector<float>> grads;
    for (int k = 0; k < 3; ++k) grads.push_back(ref.get<float>(prefix + "grad." + std::to_string(k)));
    const double total = herd::clip_grad_norm(herd::views(grads[0], grads[1], grads[2]), ref.get<double>(prefix + "max_norm")[0]);
    cmp.check(prefix + "total", &total, ref.get<double>(prefix + "total").data(), 1);
    for (std::size_t k = 0; k < 3; ++k) cmp.check(prefix + "grad." + std::to_string(k), grads[k], ref.get<float>(prefix + "torch." + std::to_string(k)));
  }
  std::vector<std::vector<herd::half>> params, grads;
  for (int k = 0; k < 3; ++k) {
    grads.push_back(ref.get<herd::half>("amp.grad." + std::to_string(k)));
    params.emplace_back(grads.back().size());
  }
  herd::loss_scaler scaler({.initial_scale = 1024});
  herd::mixed_precision amp(herd::views(params[0], params[1], params[2]), herd::views(grads[0], grads[1], grads[2]), scaler,
                            [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g)); });
  if (amp.unscale()) throw std::runtime_error("unscale() found an overflow in finite gradients");
  const double total = herd::clip_grad_norm(amp.master_grads(), 2.0);
  cmp.check("amp.total", &total, ref.get<double>("amp.total").data(), 1);
  for (std::size_t k = 0; k < 3; ++k) {
    const auto& g = amp.master_grads()[k];
    cmp.check("amp.grad." + std::to_string(k), static_cast<const float*>(g.data),
              ref.get<float>("amp.torch." + std::to_string(k)).data(), g.count);
  }
  return cmp.report("parity_clip_grad_norm");
}

// The same clipping with each gradient split in contiguous parts across the ranks (as ZeRO's
// shards): herd::clip_grad_norm with the communicator gives every rank the whole norm.
int clip_grad_norm_sharded(const reference& ref) {
  herd::mpi::environment mpi;
  herd::mpi_communicator comm;
  comparison cmp(1e-6);
  for (int c = 0; c < 2; ++c) {
    const std::string prefix = std::to_string(c) + ".";
    std::vector<std::vector<float>> parts, torch;
    for (int k = 0; k < 3; ++k) {
      const auto whole = ref.get<float>(prefix + "grad." + std::to_string(k));
      const auto clipped = ref.get<float>(prefix + "torch." + std::to_string(k));
      const std::size_t n = whole.size(), size = static_cast<std::size_t>(comm.size()), rank = static_cast<std::size_t>(comm.rank());
      const std::size_t begin = n * rank / size, end = n * (rank + 1) / size;
      parts.emplace_back(whole.begin() + static_cast<std::ptrdiff_t>(begin), whole.begin() + static_cast<std::ptrdiff_t>(end));
      torch.emplace_back(clipped.begin() + static_cast<std::ptrdiff_t>(begin), clipped.begin() + static_cast<std::ptrdiff_t>(end));
    }
    const double total = herd::clip_grad_norm(herd::views(parts[0], parts[1], parts[2]), ref.get<double>(prefix + "max_norm")[0], comm);
    cmp.check(prefix + "total", &total, ref.get<double>(prefix + "total").data(), 1);
    for (std::size_t k = 0; k < 3; ++k) cmp.check(prefix + "part." + std::to_string(k), parts[k], torch[k]);
  }
  std::printf("rank %d of %d: ", comm.rank(), comm.size());
  return cmp.report("parity_clip_grad_norm_sharded");
}

// Calls run(make) with the case's optimizer factory for zero_optimizer: SGD (o[0] == 0) or AdamW,
// with the hyperparameters of reference.py's options row o.
template <class Run> void with_zero_inner(const std::vector<double>& o, Run&& run) {
  if (o[0] == 0) {
    run([&](auto p, auto g) {
      return herd::sgd(std::move(p), std::move(g),
                       {.lr = o[1], .momentum = o[2], .dampening = o[3], .nesterov = o[4] != 0, .weight_decay = o[5]});
    });
  } else {
    run([&](auto p, auto g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = o[1], .beta1 = o[2], .beta2 = o[3], .eps = o[4], .weight_decay = o[5],
                                                      .first_moment = adamw_first_moment_of(reference_torch)});
    });
  }
}

// One ZeRO case of the reference file (names under `prefix`) over parameters of type T: every
// step's parameters against PyTorch's (cmp); with master_cmp (f16 parameters with f32 masters),
// also this rank's shard of zero_optimizer's masters against the flat f32 masters PyTorch stepped.
// Sets no_masters when the optimizer keeps none.
template <class T>
void zero_case(const reference& ref, herd::mpi_communicator& comm, const std::string& prefix, comparison& cmp,
               comparison* master_cmp, bool& no_masters) {
  with_zero_inner(ref.get<double>(prefix + "options"), [&](auto make) {
    std::vector<std::vector<T>> params, grads, all_grads, torch;
    std::vector<std::vector<float>> masters;
    for (std::size_t k = 0; ref.contains(prefix + "init." + std::to_string(k)); ++k) {
      params.push_back(ref.get<T>(prefix + "init." + std::to_string(k)));
      all_grads.push_back(ref.get<T>(prefix + "grads." + std::to_string(k)));
      torch.push_back(ref.get<T>(prefix + "torch." + std::to_string(k)));
      if (master_cmp != nullptr) masters.push_back(ref.get<float>(prefix + "master." + std::to_string(k)));
      grads.emplace_back(params.back().size());
    }
    std::vector<herd::buffer_view> param_views, grad_views;
    for (std::size_t k = 0; k < params.size(); ++k) {
      param_views.push_back(herd::view_of(params[k]));
      grad_views.push_back(herd::view_of(grads[k]));
    }
    herd::zero_optimizer opt(param_views, grad_views, comm, make);
    const std::size_t steps = all_grads[0].size() / params[0].size();
    for (std::size_t s = 0; s < steps; ++s) {
      for (std::size_t k = 0; k < params.size(); ++k) {
        std::memcpy(grads[k].data(), all_grads[k].data() + s * grads[k].size(), grads[k].size() * sizeof(T));
      }
      opt.step();
      const std::string step = " step " + std::to_string(s + 1);
      std::vector<float> torch_masters;  // the flat masters at this step, of which this rank holds a shard
      for (std::size_t k = 0; k < params.size(); ++k) {
        cmp.check(prefix + "param." + std::to_string(k) + step, params[k].data(), torch[k].data() + s * params[k].size(),
                  params[k].size());
        if (master_cmp == nullptr) continue;
        const float* at = masters[k].data() + s * params[k].size();
        torch_masters.insert(torch_masters.end(), at, at + params[k].size());
      }
      if (master_cmp == nullptr) continue;
      const herd::buffer_view mine = opt.master_shard();
      if (mine.count != opt.shard().count()) {
        if (!no_masters) std::printf("  rank %d of %d: zero_optimizer keeps no masters of its shard\n", comm.rank(), comm.size());
        no_masters = true;
        continue;
      }
      master_cmp->check(prefix + "master (flat, from " + std::to_string(opt.shard().begin) + ")" + step,
                        static_cast<const float*>(mine.data), torch_masters.data() + opt.shard().begin, mine.count);
    }
  });
}

// herd::zero_optimizer over real MPI ranks against torch.distributed.optim.ZeroRedundancyOptimizer
// (gloo) at the same world size, each rank on its own gradients (reference.py's zero.WORLD.RANK
// file). PyTorch's ranks average them with a gloo sum and a division, herd's reduce-scatter with a
// sum and the same division, and reference.py made every sum exact, so the averages agree bit for
// bit whatever order each side adds in. What is left is the same elementwise SGD or AdamW
// arithmetic on every element, whichever rank owns it (herd cuts the flat parameters into equal
// shards, PyTorch gives each rank whole parameters; neither changes a value): every step's
// parameters must be bit-identical to PyTorch's, on every rank (AdamW's within
// sqrt_rounding_bound where the reference's torch.sqrt does not round correctly).
int zero(const fs::path& dir) {
  herd::mpi::environment mpi;
  herd::mpi_communicator comm;
  const reference ref(dir / ("zero." + std::to_string(comm.size()) + "." + std::to_string(comm.rank()) + ".safetensors"));
  int failed = 0;
  bool no_masters = false;
  const auto cases = ref.get<std::int64_t>("cases")[0];
  for (std::int64_t c = 0; c < cases; ++c) {
    const std::string prefix = std::to_string(c) + ".";
    const auto o = ref.get<double>(prefix + "options");
    // AdamW takes a square root: see sqrt_rounding_bound.
    const bool bounded = o[0] != 0 && ref.get<std::int64_t>("sqrt_correctly_rounded")[0] == 0;
    comparison cmp(bounded ? sqrt_rounding_bound : 0, bounded ? sqrt_rounding_scale : 1e-30);
    zero_case<float>(ref, comm, prefix, cmp, nullptr, no_masters);
    char name[96];  // one printf per line: the ranks' lines do not interleave
    std::snprintf(name, sizeof name, "rank %d of %d: parity_zero case %lld (%s, lr %g)", comm.rank(), comm.size(),
                  static_cast<long long>(c), o[0] == 0 ? "SGD" : "AdamW", o[1]);
    failed |= cmp.report(name);
  }
  // fp16 ZeRO: f16 parameters with zero_optimizer's f32 masters of each rank's shard (on by
  // default) against f32 masters stepped by ZeroRedundancyOptimizer over torch.optim's optimizer
  // and rounded to f16 (reference.py's ZERO_HALF_CASES): every step's f16 parameters on every rank
  // and this rank's shard of the masters, bit for bit. Where the reference's torch.sqrt does not
  // round correctly, AdamW's masters agree within sqrt_rounding_bound, and its f16 parameters,
  // rounded from them, within one f16 step (2^-10 relative).
  const auto half_cases = ref.get<std::int64_t>("half_cases")[0];
  for (std::int64_t c = 0; c < half_cases; ++c) {
    const std::string prefix = "h" + std::to_string(c) + ".";
    const auto o = ref.get<double>(prefix + "options");
    const bool bounded = o[0] != 0 && ref.get<std::int64_t>("sqrt_correctly_rounded")[0] == 0;
    comparison cmp(bounded ? 1.0 / 1024 : 0, bounded ? sqrt_rounding_scale : 1e-30);
    comparison master_cmp(bounded ? sqrt_rounding_bound : 0, bounded ? sqrt_rounding_scale : 1e-30);
    no_masters = false;
    zero_case<herd::half>(ref, comm, prefix, cmp, &master_cmp, no_masters);
    char name[128];
    std::snprintf(name, sizeof name, "rank %d of %d: parity_zero f16 with masters, case %lld (%s, lr %g): f16 parameters",
                  comm.rank(), comm.size(), static_cast<long long>(c), o[0] == 0 ? "SGD" : "AdamW", o[1]);
    failed |= cmp.report(name);
    std::snprintf(name, sizeof name, "rank %d of %d: parity_zero f16 with masters, case %lld: this rank's f32 masters",
                  comm.rank(), comm.size(), static_cast<long long>(c));
    failed |= master_cmp.report(name) | (no_masters ? 1 : 0);
  }
  return failed;
}

// A file written the way safetensors writes, holding every safetensors dtype and a BatchNorm2d's
// state_dict: with strict off, herd's dtypes load bit for bit and the rest are reported as
// unexpected; registered, a dtype herd lacks is refused by name (not as a damaged file).
int safetensors(const std::filesystem::path& dir) {
  comparison cmp(0);
  const fs::path path = dir / "safetensors.safetensors";
  const reference expect(dir / "safetensors_expect.safetensors");
  std::size_t problems = 0;
  const auto problem = [&](const std::string& what) {
    std::printf("  %s\n", what.c_str());
    ++problems;
  };
  std::vector<herd::half> f16(6);
  std::vector<herd::bfloat16> bf16(6);
  std::vector<float> f32(6), bn_weight(4), bn_bias(4), bn_mean(4), bn_var(4), absent(3, 7.0f);
  std::vector<double> f64(6);
  std::vector<std::int8_t> i8(6);
  std::vector<std::uint8_t> u8(6);
  std::vector<std::int32_t> i32(6);
  std::vector<std::int64_t> i64(6);
  herd::checkpoint state;
  state.add("t.F16", f16).add("t.BF16", bf16).add("t.F32", f32).add("t.F64", f64).add("t.I8", i8).add("t.U8", u8);
  state.add("t.I32", i32).add("t.I64", i64).add("bn.weight", bn_weight).add("bn.bias", bn_bias);
  state.add("bn.running_mean", bn_mean).add("bn.running_var", bn_var).add("absent", absent);
  state.set_strict(false);
  if (!state.load(path)) problem("the file is missing");
  const auto compare = [&](const std::string& name, const auto& loaded) {
    std::vector<double> as_double;
    for (const auto& x : loaded) as_double.push_back(herd::detail::to_double(x));
    cmp.check(name, as_double, expect.get<double>(name));
  };
  compare("t.F16", f16), compare("t.BF16", bf16), compare("t.F32", f32), compare("t.F64", f64), compare("t.I8", i8);
  compare("t.U8", u8), compare("t.I32", i32), compare("t.I64", i64), compare("bn.weight", bn_weight);
  compare("bn.bias", bn_bias), compare("bn.running_mean", bn_mean), compare("bn.running_var", bn_var);
  if (absent != std::vector<float>(3, 7.0f)) problem("the missing entry was written");
  const std::vector<std::string> lacking = {"BOOL", "I16", "C64", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2"};
  std::vector<std::string> unexpected = {"bn.num_batches_tracked"};
  for (const auto& d : lacking) unexpected.push_back("t." + d);
  auto reported = state.unexpected_keys();
  std::sort(reported.begin(), reported.end());
  std::sort(unexpected.begin(), unexpected.end());
  if (reported != unexpected) problem("unexpected_keys() is not the file's tensors of other dtypes and num_batches_tracked");
  if (state.missing_keys() != std::vector<std::string>{"absent"}) problem("missing_keys() is not {absent}");
  for (const auto& d : lacking) {
    std::vector<float> into(6);
    herd::checkpoint one;
    one.add("t." + d, into).set_strict(false);
    std::string message = "(none)";
    try {
      one.load(path);
    } catch (const herd::error& e) {
      message = e.what();
    }
    const std::string wanted = "unsupported dtype " + d + " in tensor \"t." + d + "\"";
    if (message.find(wanted) == std::string::npos || message.find("damaged") != std::string::npos) {
      problem("registering t." + d + " raised " + message + "; wanted " + wanted);
    }
  }
  const int values = cmp.report("parity_safetensors");
  std::printf("parity_safetensors: %zu problems with keys and errors\n", problems);
  return values == 0 && problems == 0 ? 0 : 1;
}

// herd::distributed_sampler against torch.utils.data.DistributedSampler: the same indices on every
// rank without shuffling (padding with the first indices, or dropping the tail); with shuffling,
// the same number per rank (herd's order comes from its own generator, not torch's randperm).
int sampler(const reference& ref) {
  const std::vector<std::int64_t> cases = ref.get<std::int64_t>("cases");
  std::size_t compared = 0, wrong = 0;
  for (std::size_t c = 0; c < cases.size() / 3; ++c) {
    const auto n = static_cast<std::size_t>(cases[3 * c]);
    const int w = static_cast<int>(cases[3 * c + 1]);
    const bool drop_last = cases[3 * c + 2] != 0;
    for (int r = 0; r < w; ++r) {
      for (int shuffle = 0; shuffle < 2; ++shuffle) {
        const std::string name = std::to_string(c) + "." + std::to_string(r) + "." + std::to_string(shuffle);
        const std::vector<std::int64_t> torch = ref.get<std::int64_t>(name);
        const std::vector<std::size_t> mine =
            herd::distributed_sampler(n, w, r, {.shuffle = shuffle != 0, .seed = 5, .drop_last = drop_last}).indices();
        const bool same = shuffle != 0 ? mine.size() == torch.size()
                                       : std::equal(mine.begin(), mine.end(), torch.begin(), torch.end(),
                                                    [](std::size_t a, std::int64_t b) { return static_cast<std::int64_t>(a) == b; });
        ++compared;
        if (!same && wrong++ == 0) {
          std::printf("  first difference: %zu samples, %d ranks, drop_last %d, rank %d, shuffle %d: herd %zu indices, torch %zu\n", n, w,
                      drop_last ? 1 : 0, r, shuffle, mine.size(), torch.size());
        }
      }
    }
  }
  std::printf("parity_sampler: %zu rank orders compared, %zu differ\n", compared, wrong);
  return wrong == 0 ? 0 : 1;
}

const std::map<std::string, std::function<int(const reference&)>> checks = {
    {"sampler", sampler},
    {"sgd", sgd}, {"adamw", adamw}, {"loss_scaler", loss_scaler}, {"clip_grad_norm", clip_grad_norm},
    {"clip_grad_norm_sharded", clip_grad_norm_sharded}};
// Checks that read more than one file, or a file chosen by rank: given the folder.
const std::map<std::string, std::function<int(const fs::path&)>> folder_checks = {{"safetensors", safetensors}, {"zero", zero}};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || !(checks.contains(argv[1]) || folder_checks.contains(argv[1]))) {
    std::fprintf(stderr, "usage: parity_host CHECK DIR (CHECK one of:");
    for (const auto& [name, _] : checks) std::fprintf(stderr, " %s", name.c_str());
    for (const auto& [name, _] : folder_checks) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, ")\n");
    return 2;
  }
  const fs::path dir = argv[2];
  if (fs::exists(dir / "torch_missing")) {
    std::printf("skipped: %s", "reference.py found no torch\n");
    return 77;
  }
  try {
    reference_torch = torch_version::of(dir);
    std::printf("parity_%s against PyTorch %s\n", argv[1], reference_torch.text.c_str());
    const std::string check = argv[1];
    if (folder_checks.contains(check)) return folder_checks.at(check)(dir);
    const std::string file = check.starts_with("clip_grad_norm") ? "clip_grad_norm" : check;  // one reference, two checks
    return checks.at(check)(reference(dir / (file + ".safetensors")));
  } catch (const std::exception& e) {
    std::printf("parity_%s: %s\n", argv[1], e.what());
    return 1;
  }
}
