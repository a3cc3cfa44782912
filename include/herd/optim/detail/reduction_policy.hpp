#ifndef HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
#define HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
// How gradients are combined over the ranks, as a value: the factor each gradient is scaled by
// before the sum (`before`) and after it (`after`), the operation on the wire, and the dtype each
// gradient travels as (compression). Packing into the wire type applies `before`, unpacking
// applies `after`, so every path (fusion buffers, buckets) scales alike.
//
// For op avg with gradient_predivide_factor f: 1/f before, f/divisor after, summed on the wire
// (Horovod's predivision: large gradients stay in range in the sum). Gradients that are 16-bit on
// the wire (f16/bf16 gradients, or compression) always use f = the divisor, as DDP divides before
// its sum: no average within range overflows, whatever the other gradients' dtypes (the factor is
// per wire dtype; a fusion buffer or bucket holds one dtype). The divisor is the world size, or
// with uneven_inputs and divide_by_active_ranks the ranks still training.

#include <herd/core/dtype.hpp>
#include <herd/core/reduce_op.hpp>
#include <herd/optim/compression.hpp>
#include <herd/optim/detail/gradient_movers.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace herd::detail {

struct reduction_policy {
  // The scaling of gradients of one width on the wire.
  struct scaling {
    double before = 1.0;
    double after = 1.0;
    reduce_op wire_op = reduce_op::avg;
  };
  scaling wide;    // wider than 16 bits on the wire
  scaling narrow;  // 16 bits on the wire
  herd::compression compression = herd::compression::none;

  // `divisor`: the ranks an average divides by; `world`: the communicator's size.
  static reduction_policy make(reduce_op op, double predivide_factor, herd::compression compression, int divisor,
                               int world) {
    auto with_factor = [&](double f) {
      const bool scaled = op == reduce_op::avg && (f != 1.0 || divisor != world);
      return scaling{scaled ? 1.0 / f : 1.0, scaled ? f / divisor : 1.0, scaled ? reduce_op::sum : op};
    };
    return {with_factor(predivide_factor), with_factor(static_cast<double>(divisor)), compression};
  }

  dtype wire(dtype type) const noexcept { return wire_dtype(compression, type); }
  // The scaling of gradients of dtype `type` (not the wire's).
  const scaling& of(dtype type) const noexcept { return size_of(wire(type)) == 2 ? narrow : wide; }
  reduce_op wire_op(dtype type) const noexcept { return of(type).wire_op; }
  // Gradients of `type` cross the wire as they are: no cast, no scaling (so they may be reduced
  // where they live).
  bool as_is(dtype type) const noexcept { return wire(type) == type && of(type).before == 1.0 && of(type).after == 1.0; }

  // Into the wire type, scaled by `before`: `items` of dtype `from` (a gradient, or an
  // accumulated sum) into slots of dtype `wire_type`.
  template <class Mover>
  void pack(Mover& mover, std::span<const move_item> items, dtype wire_type, dtype from) const {
    mover.move(items, wire_type, from, on_wire(wire_type).before);
  }
  // Back from the wire type into the gradients (dtype `type`), scaled by `after`.
  template <class Mover>
  void unpack(Mover& mover, std::span<const move_item> items, dtype type, dtype wire_type) const {
    mover.move(items, type, wire_type, on_wire(wire_type).after);
  }

 private:
  const scaling& on_wire(dtype wire_type) const noexcept { return size_of(wire_type) == 2 ? narrow : wide; }
};

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
