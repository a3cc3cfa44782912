#ifndef HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
#define HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
// How gradients are combined over the ranks, as a value: the factor each gradient is scaled by
// before the sum (`before`) and after it (`after`), the operation on the wire, and the dtype each
// gradient travels as (compression). Packing into the wire type applies `before`, unpacking
// applies `after`, so every path (fusion buffers, buckets) scales alike.
//
// For op avg with gradient_predivide_factor f: 1/f before, f/divisor after, summed on the wire
// (Horovod's predivision: large gradients stay in range in the sum). When every gradient is 16-bit
// on the wire, f is the divisor itself, as DDP divides before its sum: no average within range
// overflows. The divisor is the world size, or with uneven_inputs and divide_by_active_ranks the
// ranks still training.

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
  double before = 1.0;
  double after = 1.0;
  reduce_op wire_op = reduce_op::avg;
  herd::compression compression = herd::compression::none;

  // `shapes`: (elements, dtype) of every gradient; `world`: the communicator's size.
  static reduction_policy make(reduce_op op, double predivide_factor, herd::compression compression,
                               std::span<const std::pair<std::size_t, dtype>> shapes, int divisor, int world) {
    const bool average = op == reduce_op::avg;
    const bool narrow = !shapes.empty() && std::all_of(shapes.begin(), shapes.end(), [&](const auto& shape) {
      return size_of(wire_dtype(compression, shape.second)) == 2;
    });
    const double f = narrow ? static_cast<double>(divisor) : predivide_factor;
    const bool scaled = average && (f != 1.0 || divisor != world);
    return {scaled ? 1.0 / f : 1.0, scaled ? f / divisor : 1.0, scaled ? reduce_op::sum : op, compression};
  }

  dtype wire(dtype type) const noexcept { return wire_dtype(compression, type); }
  // Gradients of `type` cross the wire as they are: no cast, no scaling (so they may be reduced
  // where they live).
  bool as_is(dtype type) const noexcept { return wire(type) == type && before == 1.0 && after == 1.0; }

  // Into the wire type, scaled by `before`: `items` of dtype `from` (a gradient, or an
  // accumulated sum) into slots of dtype `wire_type`.
  template <class Mover>
  void pack(Mover& mover, std::span<const move_item> items, dtype wire_type, dtype from) const {
    mover.move(items, wire_type, from, before);
  }
  // Back from the wire type into the gradients (dtype `type`), scaled by `after`.
  template <class Mover>
  void unpack(Mover& mover, std::span<const move_item> items, dtype type, dtype wire_type) const {
    mover.move(items, type, wire_type, after);
  }
};

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_REDUCTION_POLICY_HPP
