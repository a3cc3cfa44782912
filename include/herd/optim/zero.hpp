#ifndef HERD_OPTIM_ZERO_HPP
#define HERD_OPTIM_ZERO_HPP
// herd::zero_optimizer: ZeRO stage 1 (DeepSpeed's, PyTorch's ZeroRedundancyOptimizer): the
// optimizer's state is split across the ranks instead of repeated on each.
//
//   herd::zero_optimizer opt(params, grads, comm, [](auto shard_params, auto shard_grads) {
//     return herd::adamw(std::move(shard_params), std::move(shard_grads), {.lr = 1e-3});
//   });
//   ...backward...
//   opt.step();
//
// The parameters (host tensors of one floating-point dtype), taken in order, form one flat range
// of N elements, cut into W shards of ceil(N/W) elements (the last ones shorter, or empty when N
// < W): balanced by bytes to within one shard's rounding. `make` builds the wrapped optimizer
// once, over views of this rank's shard of the parameters and of a buffer that receives its
// gradients: it steps only that shard and keeps state (momentum, moments) only for it, about 1/W
// of the unsharded optimizer's. Each step reduce-scatters the flattened gradients (avg by
// default, f16/bf16 on the wire with compression), steps the wrapped optimizer, and allgathers the
// updated parameters. One reduce-scatter and one allgather move what one allreduce moves.
//
// A checkpoint of it (checkpoint::add_optimizer_state, through visit_sharded_state) holds the
// whole state in one file, named and shaped as the unsharded optimizer's: "step", "momentum.3"
// for the momentum of parameter 3, and so on. Saved collectively, it is gathered to the rank that
// writes; loaded at any world size, each rank keeps its own shard of it; the unsharded optimizer
// loads it too, and a zero_optimizer loads the unsharded optimizer's file. visit_state is this
// rank's shard as it lies in memory, with the layout it was made for (world size, rank,
// parameter count): state written back through it from another layout makes the next step raise
// herd::error on every rank.
//
// With a loss scaler (zero_options::scaler, the one mixed_precision takes), backward starts from
// loss * scaler.scale() and each step divides the reduced shard by the scale and looks in it for
// inf and NaN. An overflow reaches only the rank whose shard holds the element, so the ranks
// agree on it with one scalar allreduce (the one max_grad_norm's norm travels in, when clipping:
// an inf or NaN anywhere makes the summed squares inf or NaN, as DeepSpeed reads them). On an
// overflow every rank skips the step (no parameter or state changes, no allgather) and every
// scaler backs off alike, so the ranks' scales never part.
//
// fp16 (or bf16) ZeRO, as DeepSpeed's: f16/bf16 parameters, the scaler, and f32 master weights,
// which zero_options::master_weights keeps by default. Each rank keeps the masters of its own
// shard only (4 bytes per element of the shard), steps them with the f32 gradient shard (the
// 16-bit reduced shard, cast and unscaled), rounds them into the 16-bit parameters and allgathers
// those. `make` then builds the wrapped optimizer over f32 views, so its state is f32 as well.
// mixed_precision (optim/mixed_precision.hpp) is the same for the distributed optimizer, which
// holds every parameter's master on every rank; zero_optimizer does not take it, and needs none.
// As there, a master is read again from its parameter where the parameter no longer holds it
// rounded (broadcast_parameters after construction, parameters loaded alone), and the masters
// belong to the state: "master.i" in the checkpoint, parameter i's whole f32 master, split over
// the ranks like the rest, so that a resumed run is bit for bit the uninterrupted one. A file
// without masters (the unsharded optimizer's, or ZeRO's with master_weights off) loads only with
// checkpoint::set_strict(false); the masters are then read from the loaded parameters.

#include <herd/collectives/allgather.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/optim/clip.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/detail/host_ops.hpp>
#include <herd/optim/detail/master_weights.hpp>
#include <herd/optim/detail/unscale.hpp>
#include <herd/optim/mixed_precision.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {
struct zero_options {
  reduce_op op = reduce_op::avg;  // avg or sum over ranks
  compression wire = compression::none;
  // Above 0: the reduced gradients are clipped to this global 2-norm before each step, as
  // torch.nn.utils.clip_grad_norm_ on the whole; the shards' squared norms are summed across the
  // ranks (one scalar allreduce, as DeepSpeed does), so every rank clips by the same norm.
  double max_grad_norm = 0;
  // Dynamic loss scaling: the gradients arrive multiplied by scaler->scale(); each step unscales
  // them, skips on an inf or NaN on any rank and updates the scaler (the same on every rank).
  // Not owned: it must outlive the optimizer.
  loss_scaler* scaler = nullptr;
  // f16/bf16 parameters: keep f32 master weights of this rank's shard only (1/W of a full f32
  // copy, as DeepSpeed partitions its fp32 one). The reduced gradient shard is cast to f32 (and
  // unscaled), the wrapped optimizer steps the f32 masters (`make` gets f32 views, so its state is
  // f32 too), and the masters, rounded into the parameters, are allgathered in 16 bits. On by
  // default, because a DeepSpeed or apex user expects it: DeepSpeed's fp16 and bf16 ZeRO always
  // keep such masters, as apex's O2 does, and without them every update smaller than half a
  // 16-bit step of its weight (below 2^-12 of a weight of 1 in f16) is rounded away. false steps
  // the 16-bit parameters themselves, as torch's ZeroRedundancyOptimizer does over f16
  // parameters. f32 and f64 parameters are their own masters: there it changes nothing.
  bool master_weights = true;
};

// Where this rank's shard lies in the flat parameter range.
struct zero_shard {
  std::size_t total = 0;      // N, elements of all parameters
  std::size_t per_rank = 0;   // ceil(N / W)
  std::size_t begin = 0;      // first element of this rank's shard
  std::size_t end = 0;        // one past its last (begin == end: an empty shard)

  static zero_shard of(std::size_t total, int rank, int size) {
    zero_shard s;
    s.total = total;
    s.per_rank = (total + static_cast<std::size_t>(size) - 1) / static_cast<std::size_t>(size);
    s.begin = std::min(total, s.per_rank * static_cast<std::size_t>(rank));
    s.end = std::min(total, s.begin + s.per_rank);
    return s;
  }
  std::size_t count() const noexcept { return end - begin; }
};

HERD_CONFIG_NAMESPACE_BEGIN

template <class Inner, communicator C> class zero_optimizer {
 public:
  template <class Make>
  zero_optimizer(std::vector<buffer_view> params, std::vector<buffer_view> grads, C& comm, Make make,
                 zero_options options = {})
      : params_(std::move(params)), grads_(std::move(grads)), comm_(&comm), options_(options) {
    detail::require_parameter_pairs(params_, grads_, "zero_optimizer");
    if (options_.op != reduce_op::avg && options_.op != reduce_op::sum) {
      detail::raise({"zero_optimizer"}, "op " + std::string(name(options_.op)) + " cannot combine gradients",
                    "Use reduce_op::avg or reduce_op::sum");
    }
    std::size_t total = 0;
    type_ = params_.empty() ? dtype::f32 : params_[0].type;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].type != type_) {
        detail::raise({"zero_optimizer"},
                      "parameter " + std::to_string(i) + " is " + std::string(name(params_[i].type)) + " but parameter 0 is " +
                          std::string(name(type_)),
                      "Shard parameters of one dtype per zero_optimizer (make one for each dtype)");
      }
      total += params_[i].count;
    }
    shard_ = zero_shard::of(total, comm.rank(), comm.size());
    layout_[0] = comm.size();
    layout_[1] = comm.rank();
    layout_[2] = static_cast<std::int64_t>(total);
    wire_ = wire_dtype(options_.wire, type_);
    masters_ = options_.master_weights && detail::has_master_weights(type_);
    step_type_ = masters_ ? dtype::f32 : type_;
    // One rank: its shard is everything, and the gradients are already the average. Unscaling,
    // clipping and masters work on copies, as at any other rank count: the caller's gradients
    // stay as given, and the f16/bf16 parameters are never stepped themselves.
    alone_ = comm.size() == 1 && wire_ == type_ && options_.scaler == nullptr && options_.max_grad_norm <= 0 && !masters_;
    if (alone_) {
      inner_.emplace(make(params_, grads_));
      for (std::size_t i = 0, at = 0; i < params_.size(); at += params_[i].count, ++i) pieces_.push_back({i, 0, params_[i].count, at});
      learn_state_layout(make);
      return;
    }
    const std::size_t padded = shard_.per_rank * static_cast<std::size_t>(comm.size());
    flat_ = host_tensor(wire_, padded);
    gathered_ = host_tensor(type_, padded);
    shard_grad_ = host_tensor(wire_, shard_.per_rank);
    grad_ = wire_ == step_type_ ? host_tensor() : host_tensor(step_type_, shard_.per_rank);
    if (masters_) {
      master_ = host_tensor(dtype::f32, shard_.count());
      for_each_piece(shard_.begin, shard_.end, [&](const buffer_view& p, std::size_t offset, std::size_t flat_at, std::size_t n) {
        detail::read_masters(master_at(flat_at), static_cast<const std::byte*>(p.data) + offset * size_of(type_), type_, n);
      });
    }
    // The wrapped optimizer sees the parts of the parameters inside this shard (of their masters,
    // with masters), and the matching parts of the received gradients (cast to f32, with masters).
    std::vector<buffer_view> shard_params, shard_grads;
    std::byte* received = static_cast<std::byte*>((wire_ == step_type_ ? shard_grad_ : grad_).data());
    const std::size_t es = size_of(type_), ss = size_of(step_type_);
    for_each_piece(shard_.begin, shard_.end, [&](const buffer_view& p, std::size_t offset, std::size_t flat_at, std::size_t n) {
      pieces_.push_back({static_cast<std::size_t>(&p - params_.data()), offset, n, flat_at});
      void* stepped = masters_ ? static_cast<void*>(master_at(flat_at)) : static_cast<std::byte*>(p.data) + offset * es;
      shard_params.push_back({stepped, n, step_type_, device::cpu()});
      shard_grads.push_back({received + (flat_at - shard_.begin) * ss, n, step_type_, device::cpu()});
    });
    inner_.emplace(make(std::move(shard_params), std::move(shard_grads)));
    learn_state_layout(make);
  }

  void step() {
    C& comm = *comm_;
    if (alone_) {
      if (const std::string fault = layout_fault(); !fault.empty()) detail::raise({"zero_optimizer", 0, 1}, fault, layout_advice);
      return inner_->step();
    }
    const int p = comm.size();
    const std::size_t es = size_of(type_), ws = size_of(wire_);
    // The gradients, flattened (cast for the wire), the padding zero. An average summed in f16 or
    // bf16 (compression, or 16-bit gradients) is divided as the gradients are copied, before the
    // sum (as DDP and the distributed optimizer do), so that no average within range overflows.
    const bool predivide = options_.op == reduce_op::avg && (wire_ != type_ || size_of(wire_) == 2);
    const double before = predivide ? 1.0 / p : 1.0;
    auto* flat = static_cast<std::byte*>(flat_.data());
    std::size_t at = 0;
    for (const auto& g : grads_) {
      detail::host_cast(flat + at * ws, wire_, g.data, type_, g.count, before);  // a plain copy without compression
      at += g.count;
    }
    std::memset(flat + at * ws, 0, (flat_.count() - at) * ws);
    const reduce_op wire_op = predivide ? reduce_op::sum : options_.op;
    const buffer_view all{flat, flat_.count(), wire_, device::cpu()};
    buffer_view mine = shard_grad_.view();
    // A wrong layout on any rank travels in the reduce-scatter's agreement: every rank raises it.
    auto call = detail::prepare_reduce_scatter(all, mine, comm, wire_op);
    if (const std::string fault = layout_fault(); !fault.empty()) {
      if (p == 1) detail::raise({"zero_optimizer", 0, 1}, fault, layout_advice);
      call.check.fail(17, fault, layout_advice);
    }
    detail::run_collective(comm, call.label(), [&](bool sync) { detail::run_reduce_scatter(comm, call, sync); });
    // The unscaling rides on the cast back where there is one (else it is in place, and a copy
    // onto itself at scale 1 does nothing). With clipping, the norm finds an overflow.
    const double unscale = options_.scaler != nullptr ? 1.0 / options_.scaler->scale() : 1.0;
    const buffer_view received{(wire_ == step_type_ ? shard_grad_ : grad_).data(), shard_.per_rank, step_type_, device::cpu()};
    const bool overflow_here = detail::unscale(received, const_buffer_view(shard_grad_.data(), shard_.per_rank, wire_),
                                               unscale, options_.scaler != nullptr && options_.max_grad_norm <= 0);
    if (options_.max_grad_norm > 0) {
      // One scalar allreduce serves the norm and, with a scaler, the overflow agreement; the
      // padding adds zeros.
      const double squares = detail::global_squared_norm({received}, comm);
      grad_norm_ = std::sqrt(squares);
      if (options_.scaler != nullptr && skip(!std::isfinite(squares))) return;
      detail::clip_by({received}, options_.max_grad_norm, grad_norm_);
    } else if (options_.scaler != nullptr) {
      // Only the rank holding an overflowed element sees it: the skip is decided by all of them.
      double overflow = overflow_here ? 1.0 : 0.0;
      buffer_view flag{&overflow, 1, dtype::f64, device::cpu()};
      allreduce(flag, comm, reduce_op::max);
      if (skip(overflow != 0)) return;
    }
    if (masters_) refresh_masters();
    inner_->step();
    // This rank's updated parameters to everyone: packed (the masters rounded, with masters),
    // gathered, unpacked.
    auto* all_params = static_cast<std::byte*>(gathered_.data());
    auto* mine_out = all_params + shard_.per_rank * static_cast<std::size_t>(comm.rank()) * es;
    std::memset(mine_out, 0, shard_.per_rank * es);
    if (masters_) {
      detail::write_masters(mine_out, type_, master_at(shard_.begin), shard_.count());
    } else {
      for_each_piece(shard_.begin, shard_.end, [&](const buffer_view& param, std::size_t offset, std::size_t flat_at, std::size_t n) {
        std::memcpy(mine_out + (flat_at - shard_.begin) * es, static_cast<const std::byte*>(param.data) + offset * es, n * es);
      });
    }
    const const_buffer_view shard_out(mine_out, shard_.per_rank, type_);
    buffer_view everything = gathered_.view();
    allgather(shard_out, everything, comm);
    for_each_piece(0, shard_.total, [&](const buffer_view& param, std::size_t offset, std::size_t flat_at, std::size_t n) {
      std::memcpy(static_cast<std::byte*>(param.data) + offset * es, all_params + flat_at * es, n * es);
    });
  }

  Inner& inner() noexcept { return *inner_; }
  const zero_shard& shard() const noexcept { return shard_; }
  // The global gradient norm of the last step, with max_grad_norm (0 before).
  double grad_norm() const noexcept { return grad_norm_; }
  // Whether the last step was skipped for an overflow (with a scaler); the same on every rank.
  bool last_step_skipped() const noexcept { return skipped_; }
  // The f32 master weights of this rank's shard, elements [shard().begin, shard().end) of the flat
  // parameters; empty without masters (f32/f64 parameters, or master_weights off).
  buffer_view master_shard() noexcept {
    return {masters_ ? master_.data() : nullptr, masters_ ? master_.count() : 0, dtype::f32, device::cpu()};
  }

  // This rank's state: the wrapped optimizer's, for its shard, the layout it belongs to, and the
  // scaler's (the same on every rank), so that a checkpoint resumes the scale too.
  template <class F> void visit_state(F&& f) {
    f(std::string("zero.layout"), buffer_view{layout_, 3, dtype::i64, device::cpu()});
    if (masters_) f(std::string("zero.master"), master_.view());
    visit_optimizer_state(*inner_, [&](const auto& name, buffer_view v) { f("shard." + std::string(name), v); });
    if (options_.scaler != nullptr) {
      options_.scaler->visit_state([&](const auto& name, buffer_view v) { f("scaler." + std::string(name), v); });
    }
  }

  // The state as the unsharded optimizer names it, each tensor with this rank's part of it
  // (optim/optimizer_state.hpp): what a checkpoint saves whole. The wrapped optimizer's tensor
  // "K.k" of the k-th piece of the shard becomes part of "K.i", i the parameter the piece lies
  // in; its other tensors (a step count) and the scaler's are the same on every rank, so each
  // rank's copy is the whole. With masters, "master.i" is parameter i's f32 master (its element
  // count), of which this rank holds the part inside its shard, as mixed_precision names it.
  template <class F> void visit_sharded_state(F&& f) {
    std::vector<std::vector<buffer_view>> split(split_kinds_.size(), std::vector<buffer_view>(pieces_.size()));
    visit_optimizer_state(*inner_, [&](const auto& name, buffer_view v) {
      const std::string text(name);
      const std::size_t dot = text.rfind('.');
      if (dot != std::string::npos && dot + 1 < text.size() &&
          text.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
        const std::size_t piece = std::stoul(text.substr(dot + 1));
        for (std::size_t k = 0; k < split_kinds_.size(); ++k) {
          if (split_kinds_[k].name == std::string_view(text).substr(0, dot) && piece < pieces_.size()) {
            split[k][piece] = v;
            return;
          }
        }
      }
      f(text, sharded_view{v, 0, v.count, true});
    });
    if (options_.scaler != nullptr) {
      options_.scaler->visit_state(
          [&](const auto& name, buffer_view v) { f("scaler." + std::string(name), sharded_view{v, 0, v.count, true}); });
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {  // parameter by parameter, as herd's optimizers
      if (masters_) {
        sharded_view s{buffer_view{nullptr, 0, dtype::f32, device::cpu()}, 0, params_[i].count};
        for (const shard_piece& piece : pieces_) {
          if (piece.param != i) continue;
          s.part = buffer_view{master_at(piece.flat), piece.count, dtype::f32, device::cpu()};
          s.offset = piece.offset;
        }
        f("master." + std::to_string(i), s);
      }
      for (std::size_t k = 0; k < split_kinds_.size(); ++k) {
        const split_kind& kind = split_kinds_[k];
        sharded_view s{buffer_view{nullptr, 0, kind.type, device::cpu()}, 0, kind.per_element * params_[i].count};
        for (std::size_t piece = 0; piece < pieces_.size(); ++piece) {
          if (pieces_[piece].param != i) continue;
          s.part = split[k][piece];
          s.offset = kind.per_element * pieces_[piece].offset;
          if (s.part.count != kind.per_element * pieces_[piece].count || s.part.type != kind.type) {
            detail::raise({"zero_optimizer", comm_->rank(), comm_->size()},
                          "the wrapped optimizer's state " + kind.name + "." + std::to_string(piece) + " holds " +
                              std::to_string(s.part.count) + " elements of " + std::string(name(s.part.type)) +
                              " for a piece of " + std::to_string(pieces_[piece].count) + " parameter elements, where " +
                              "one element of the same optimizer had " + std::to_string(kind.per_element) + " of " +
                              std::string(name(kind.type)),
                          "Give the wrapped optimizer state tensors named NAME.k with a fixed number of elements per "
                          "element of its k-th parameter");
          }
        }
        f(kind.name + "." + std::to_string(i), s);
      }
    }
  }

 private:
  // Calls f(param, offset in it, flat index, count) for each part of a parameter in [lo, hi).
  template <class F> void for_each_piece(std::size_t lo, std::size_t hi, F&& f) const {
    std::size_t at = 0;
    for (const auto& p : params_) {
      const std::size_t a = std::max(at, lo), b = std::min(at + p.count, hi);
      if (a < b) f(p, a - at, a, b - a);
      at += p.count;
    }
  }

  // Which state tensors of the wrapped optimizer follow its parameters: those an optimizer `make`
  // builds over one element call "K.0", with the number of elements they hold for it.
  template <class Make> void learn_state_layout(Make& make) {
    host_tensor param(step_type_, 1), grad(step_type_, 1);
    std::memset(param.data(), 0, size_of(step_type_));
    std::memset(grad.data(), 0, size_of(step_type_));
    auto probe = make(std::vector<buffer_view>{param.view()}, std::vector<buffer_view>{grad.view()});
    visit_optimizer_state(probe, [&](const auto& name, buffer_view v) {
      const std::string text(name);
      if (text.size() > 2 && text.ends_with(".0")) split_kinds_.push_back({text.substr(0, text.size() - 2), v.count, v.type});
    });
  }

  // The master of flat parameter element `flat` (inside this rank's shard).
  float* master_at(std::size_t flat) noexcept { return static_cast<float*>(master_.data()) + (flat - shard_.begin); }

  // Reads again each master whose parameter element no longer holds it rounded
  // (detail::refresh_masters), piece by piece of this rank's shard.
  void refresh_masters() {
    const std::size_t es = size_of(type_);
    for (const shard_piece& piece : pieces_) {
      const buffer_view& p = params_[piece.param];
      detail::refresh_masters(master_at(piece.flat), static_cast<const std::byte*>(p.data) + piece.offset * es, type_, piece.count);
    }
  }

  // Tells the scaler how the step went; true: it is skipped. `overflow` is agreed by every rank.
  bool skip(bool overflow) {
    skipped_ = overflow;
    options_.scaler->update(overflow);
    return overflow;
  }

  // A loaded checkpoint overwrote the layout: it must be the one this optimizer was made for.
  std::string layout_fault() const {
    const C& comm = *comm_;
    if (layout_[0] == comm.size() && layout_[1] == comm.rank() && layout_[2] == static_cast<std::int64_t>(shard_.total)) {
      return {};
    }
    return "zero_optimizer's state was loaded from a shard of rank " + std::to_string(layout_[1]) + " of " +
           std::to_string(layout_[0]) + " ranks over " + std::to_string(layout_[2]) + " parameters, but it runs as rank " +
           std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + " over " + std::to_string(shard_.total);
  }
  static constexpr const char* layout_advice =
      "Restore a zero_optimizer through checkpoint::add_optimizer_state, whose file holds the whole state and "
      "loads at any world size, rather than writing one rank's shard into another";

  // A part of a parameter inside this rank's shard, as the wrapped optimizer sees it.
  struct shard_piece {
    std::size_t param;   // its index in params_
    std::size_t offset;  // its first element in that parameter
    std::size_t count;
    std::size_t flat = 0;  // its first element in the flat range
  };
  // A state tensor of the wrapped optimizer that follows its parameters.
  struct split_kind {
    std::string name;          // "exp_avg": the tensors "exp_avg.k"
    std::size_t per_element;   // state elements per parameter element (0 or 1 for herd's optimizers)
    dtype type;
  };

  std::vector<buffer_view> params_, grads_;
  C* comm_;
  zero_options options_;
  dtype type_ = dtype::f32;
  dtype wire_ = dtype::f32;
  dtype step_type_ = dtype::f32;  // what the wrapped optimizer steps: f32 with masters, else type_
  bool masters_ = false;          // f32 masters of this rank's shard (zero_options::master_weights)
  zero_shard shard_;
  std::int64_t layout_[3] = {0, 0, 0};  // world size, rank, parameter count
  double grad_norm_ = 0;
  bool skipped_ = false;
  host_tensor flat_;        // the flattened gradients, as they travel
  host_tensor shard_grad_;  // this rank's reduced shard, as it arrives
  host_tensor grad_;        // ...cast back, with compression, or to f32 for the masters
  host_tensor master_;      // the f32 masters of this rank's shard, in flat order, with masters
  host_tensor gathered_;    // the flattened parameters, gathered
  bool alone_ = false;      // one rank without compression: the wrapped optimizer on the tensors themselves
  std::optional<Inner> inner_;  // made by `make` over this rank's shard
  std::vector<shard_piece> pieces_;   // in the order the wrapped optimizer takes them
  std::vector<split_kind> split_kinds_;
};

template <class Make, communicator C>
zero_optimizer(std::vector<buffer_view>, std::vector<buffer_view>, C&, Make, zero_options = {})
    -> zero_optimizer<std::invoke_result_t<Make, std::vector<buffer_view>, std::vector<buffer_view>>, C>;

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_OPTIM_ZERO_HPP
