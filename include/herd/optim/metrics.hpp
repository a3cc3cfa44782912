#ifndef HERD_OPTIM_METRICS_HPP
#define HERD_OPTIM_METRICS_HPP
// Logging across ranks: a loss or accuracy measured on each rank's shard, combined into the
// value over all ranks.
//
//   herd::metric loss;
//   loss.add(batch_loss, batch_size);         // per batch, on every rank
//   double mean = loss.global_mean(comm);     // the same on every rank; print it on rank 0
//   double avg = herd::average(x, comm);      // the plain mean of one number over the ranks

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>

#include <array>

namespace herd {
HERD_CONFIG_NAMESPACE_BEGIN

// A weighted mean: each rank adds (value, weight) pairs; global_mean divides the sum of
// value * weight over every rank by the sum of the weights (0 when no rank added anything).
class metric {
 public:
  void add(double value, double weight = 1.0) noexcept {
    sum_ += value * weight;
    weight_ += weight;
  }
  void reset() noexcept { sum_ = weight_ = 0; }
  double local_mean() const noexcept { return weight_ > 0 ? sum_ / weight_ : 0.0; }
  double local_weight() const noexcept { return weight_; }
  double local_sum() const noexcept { return sum_; }

  template <communicator C> double global_mean(C& comm) const {
    std::array<double, 2> totals = {sum_, weight_};
    allreduce(totals, detail::control_of(comm));  // host numbers: over the control channel
    return totals[1] > 0 ? totals[0] / totals[1] : 0.0;
  }

 private:
  double sum_ = 0;
  double weight_ = 0;
};

// The mean of `value` over all ranks (collective: every rank calls it).
template <communicator C> double average(double value, C& comm) {
  std::array<double, 1> v = {value};
  allreduce(v, detail::control_of(comm), reduce_op::avg);
  return v[0];
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_OPTIM_METRICS_HPP
