#ifndef HERD_DATA_DISTRIBUTED_SAMPLER_HPP
#define HERD_DATA_DISTRIBUTED_SAMPLER_HPP
// herd::distributed_sampler: which samples of a dataset each rank reads in an epoch, with the
// partition rules of PyTorch's DistributedSampler, so that a model ported from PyTorch sees the
// same split (the shuffled order itself comes from herd::random_engine, not torch's randperm).
//
//   herd::distributed_sampler sampler(dataset.size(), comm);
//   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);   // without it every epoch repeats the same order
//     for (std::span<const std::size_t> batch : sampler.batches(64)) train_step(dataset, batch);
//   }
//
// N = dataset size, W = world size. Each rank takes num_samples indices per epoch:
//   num_samples = ceil((N - W) / W) if drop_last and N % W != 0, else ceil(N / W)
//   (both equal floor(N / W) under drop_last, 0 when N < W); total = num_samples * W.
// The epoch's order is permutation(N, seed + epoch) when shuffling, else 0..N-1. Without
// drop_last it is padded to `total` by repeating it from its start; with drop_last it is cut to
// `total`. Rank r takes order[r], order[r + W], order[r + 2W], ...
//
// When the number of ranks changes inside an epoch (a rank left: herd::run_elastic), reshard()
// splits the rest of the epoch's order over the new ranks by the same rules, as Horovod's
// ElasticSampler: the first C positions, those the old ranks consumed (start() on each), are set
// aside, and positions C, C+1, ... of the order play the role of 0, 1, ... above, over N - C.
//
// Padding gives every rank the same number of samples (and batches), which training needs: a
// rank that runs out of batches early leaves the others waiting in an allreduce. For evaluation
// the duplicates skew summed metrics; for_evaluation() turns padding off instead.

#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/core/random.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace herd {

struct sampler_options {
  bool shuffle = true;
  std::uint64_t seed = 0;  // must be the same on every rank; the epoch's order uses seed + epoch
  bool drop_last = false;  // drop the tail that does not fill every rank, instead of padding
  bool pad = true;         // false: no padding, rank sizes may differ by one (ignored with drop_last)
};

// A permutation of 0..n-1, the same on every platform for a given seed: Fisher-Yates from the
// last element down, for i = n-1 .. 1 swap p[i] with p[j], j = engine.uniform_below(i + 1), where
// engine = random_engine(seed) and p starts as 0..n-1.
HERD_SEPARATE std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed);

// Consecutive batches of an index list: a forward range of std::span<const std::size_t>, each
// batch_size long except a short last one (dropped with drop_last_batch). It owns the indices,
// so its spans live as long as the range does (a range-for over a temporary keeps it alive).
class batch_range {
 public:
  class iterator {
   public:
    using value_type = std::span<const std::size_t>;
    using reference = value_type;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // by the legacy rules: * yields a value

    iterator() = default;

    value_type operator*() const { return {data_ + position_, std::min(batch_size_, limit_ - position_)}; }
    iterator& operator++() {
      position_ = std::min(position_ + batch_size_, limit_);
      return *this;
    }
    iterator operator++(int) {
      iterator before = *this;
      ++*this;
      return before;
    }
    friend bool operator==(const iterator&, const iterator&) = default;

   private:
    friend class batch_range;
    iterator(const std::size_t* data, std::size_t position, std::size_t limit, std::size_t batch_size)
        : data_(data), position_(position), limit_(limit), batch_size_(batch_size) {}

    const std::size_t* data_ = nullptr;
    std::size_t position_ = 0;
    std::size_t limit_ = 0;  // one past the last index that belongs to some batch
    std::size_t batch_size_ = 1;
  };

  batch_range(std::vector<std::size_t> indices, std::size_t batch_size, bool drop_last_batch = false);

  iterator begin() const { return {indices_.data(), 0, limit_, batch_size_}; }
  iterator end() const { return {indices_.data(), limit_, limit_, batch_size_}; }

  // The number of batches.
  std::size_t size() const noexcept { return limit_ / batch_size_ + (limit_ % batch_size_ != 0 ? 1 : 0); }
  bool empty() const noexcept { return limit_ == 0; }
  std::span<const std::size_t> operator[](std::size_t i) const {
    const std::size_t first = i * batch_size_;
    return {indices_.data() + first, std::min(batch_size_, limit_ - first)};
  }

  std::size_t batch_size() const noexcept { return batch_size_; }
  // Every index of the range, including a dropped short tail.
  const std::vector<std::size_t>& indices() const noexcept { return indices_; }

 private:
  std::vector<std::size_t> indices_;
  std::size_t batch_size_;
  std::size_t limit_ = 0;
};

class distributed_sampler {
 public:
  // Every rank must pass the same dataset_size and options; nothing checks this across ranks.
  distributed_sampler(std::size_t dataset_size, int world_size, int rank, sampler_options options = {});

  template <communicator C>
  distributed_sampler(std::size_t dataset_size, const C& comm, sampler_options options = {})
      : distributed_sampler(dataset_size, static_cast<int>(comm.size()), static_cast<int>(comm.rank()), options) {}

  // For evaluation: no shuffle, no padding, nothing dropped. Rank r gets r, r+W, r+2W, ... < N,
  // so metrics summed across ranks count every sample exactly once; rank sizes differ by at most
  // one, so loop over this rank's own batches without a collective per batch.
  static distributed_sampler for_evaluation(std::size_t dataset_size, int world_size, int rank) {
    return distributed_sampler(dataset_size, world_size, rank, evaluation_options());
  }
  template <communicator C>
  static distributed_sampler for_evaluation(std::size_t dataset_size, const C& comm) {
    return distributed_sampler(dataset_size, comm, evaluation_options());
  }

  // Selects the epoch's order. start: how many of this rank's samples of that epoch were already
  // consumed, to resume a run inside an epoch; indices() and batches() then begin there.
  void set_epoch(std::uint64_t epoch, std::size_t start = 0);

  // Counts `samples` more of this rank's samples as consumed (start() + samples, at most size()).
  void advance(std::size_t samples) noexcept { start_ = std::min(size(), start_ + samples); }

  // Goes on with the rest of the epoch as rank `rank` of `world_size` (a rank left): the samples
  // the ranks consumed so far, start() on each of the old ranks, are set aside, and the rest of
  // the epoch's order is split over the new ranks. Every new rank calls it from the same state.
  void reshard(int world_size, int rank);
  // Positions of the epoch's order set aside by reshard(): 0 until a reshard inside the epoch.
  std::size_t consumed() const noexcept { return consumed_; }

  std::uint64_t epoch() const noexcept { return epoch_; }
  std::size_t start() const noexcept { return start_; }

  // This rank's samples per epoch (PyTorch's num_samples), counting from the epoch's beginning,
  // not from start(). Without padding, this rank's own share.
  std::size_t size() const noexcept {
    const std::size_t n = remaining();
    if (!equal_shares()) {
      const auto w = static_cast<std::size_t>(world_size_);
      const auto r = static_cast<std::size_t>(rank_);
      return n / w + (r < n % w ? 1 : 0);
    }
    return num_samples();
  }
  // Samples per epoch over all ranks: num_samples * world_size, or dataset_size without padding
  // (after a reshard(), of the rest of the epoch).
  std::size_t total_size() const noexcept {
    return equal_shares() ? num_samples() * static_cast<std::size_t>(world_size_) : remaining();
  }
  std::size_t dataset_size() const noexcept { return dataset_size_; }
  int world_size() const noexcept { return world_size_; }
  int rank() const noexcept { return rank_; }
  const sampler_options& options() const noexcept { return options_; }

  // This rank's indices for the current epoch, from start() on.
  std::vector<std::size_t> indices() const;

  // This rank's indices from start() in batches of batch_size; the last one is short unless
  // drop_last_batch drops it.
  batch_range batches(std::size_t batch_size, bool drop_last_batch = false) const {
    check_batch_size("distributed_sampler::batches", batch_size);
    return batch_range(indices(), batch_size, drop_last_batch);
  }

  // How many batches batches(batch_size, drop_last_batch) yields, without building them.
  std::size_t batch_count(std::size_t batch_size, bool drop_last_batch = false) const {
    check_batch_size("distributed_sampler::batch_count", batch_size);
    const std::size_t remaining = size() - start_;
    return remaining / batch_size + (!drop_last_batch && remaining % batch_size != 0 ? 1 : 0);
  }

 private:
  static sampler_options evaluation_options() noexcept {
    sampler_options options;
    options.shuffle = false;
    options.drop_last = false;
    options.pad = false;
    return options;
  }

  std::size_t remaining() const noexcept { return dataset_size_ - consumed_; }
  // PyTorch's num_samples over what remains: ceil(n / W) written so that it cannot overflow;
  // under drop_last PyTorch's ceil((n - W) / W) for n % W != 0 is floor(n / W) too, 0 when n < W.
  std::size_t num_samples() const noexcept {
    const std::size_t n = remaining();
    const auto w = static_cast<std::size_t>(world_size_);
    return options_.drop_last ? n / w : n / w + (n % w != 0 ? 1 : 0);
  }

  // Every rank gets num_samples: padded, or cut by drop_last (which never pads, so pad only
  // matters without it).
  bool equal_shares() const noexcept { return options_.drop_last || options_.pad; }

  void check_batch_size(const char* operation, std::size_t batch_size) const {
    if (batch_size == 0) {
      detail::raise({operation, rank_, world_size_}, "the batch size is 0",
                    "Pass a batch size of at least 1");
    }
  }

  std::size_t dataset_size_;
  int world_size_;
  int rank_;
  sampler_options options_;
  std::uint64_t epoch_ = 0;
  std::size_t start_ = 0;
  std::size_t consumed_ = 0;  // positions of the epoch's order set aside by reshard()
};

// batch_range's constructor, distributed_sampler's members that check, shuffle and shard, and the
// permutation: inline, or with HERD_SEPARATE_COMPILATION only in the program's implementation file
// (core/config.hpp).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE batch_range::batch_range(std::vector<std::size_t> indices, std::size_t batch_size, bool drop_last_batch)
    : indices_(std::move(indices)), batch_size_(batch_size) {
  if (batch_size == 0) {
    detail::raise({"batch_range"}, "the batch size is 0", "Pass a batch size of at least 1");
  }
  limit_ = drop_last_batch ? indices_.size() / batch_size * batch_size : indices_.size();
}

HERD_SEPARATE distributed_sampler::distributed_sampler(std::size_t dataset_size, int world_size, int rank,
                                                     sampler_options options)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank), options_(options) {
  if (world_size < 1) {
    detail::raise({"distributed_sampler", rank}, "the world size is " + std::to_string(world_size),
                  "Pass the number of ranks (comm.size()), at least 1");
  }
  if (rank < 0 || rank >= world_size) {
    detail::raise({"distributed_sampler", rank, world_size},
                  "rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")",
                  "Pass this process's rank (comm.rank())");
  }
}

HERD_SEPARATE void distributed_sampler::set_epoch(std::uint64_t epoch, std::size_t start) {
  const std::size_t set_aside = consumed_;
  consumed_ = 0;  // a new epoch is whole, whatever a reshard set aside of the last one
  if (start > size()) {
    const std::size_t whole = size();
    consumed_ = set_aside;
    detail::raise({"distributed_sampler::set_epoch", rank_, world_size_},
                  "start " + std::to_string(start) + " is beyond the " + std::to_string(whole) +
                      " samples this rank has per epoch",
                  "Pass the number of this rank's samples of the epoch already consumed, at most size()");
  }
  epoch_ = epoch;
  start_ = start;
}

HERD_SEPARATE void distributed_sampler::reshard(int world_size, int rank) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    detail::raise({"distributed_sampler::reshard", rank, world_size},
                  "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " ranks is no rank",
                  "Pass the new communicator's size() and rank()");
  }
  consumed_ = std::min(dataset_size_, consumed_ + start_ * static_cast<std::size_t>(world_size_));
  world_size_ = world_size;
  rank_ = rank;
  start_ = 0;
}

HERD_SEPARATE std::vector<std::size_t> distributed_sampler::indices() const {
  const std::size_t count = size();
  std::vector<std::size_t> result;
  result.reserve(count - start_);
  const auto w = static_cast<std::size_t>(world_size_);
  const auto r = static_cast<std::size_t>(rank_);
  // Position p of the padded order is order[p % N]: padding repeats the order from its start,
  // and positions below N (all of them without padding) are the order itself. After a reshard(),
  // the order begins at position consumed_ and is N - consumed_ long.
  const std::size_t n = remaining();
  if (options_.shuffle) {
    const std::vector<std::size_t> order = permutation(dataset_size_, options_.seed + epoch_);
    for (std::size_t k = start_; k < count; ++k) result.push_back(order[consumed_ + (r + k * w) % n]);
  } else {
    for (std::size_t k = start_; k < count; ++k) result.push_back(consumed_ + (r + k * w) % n);
  }
  return result;
}

HERD_SEPARATE std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), std::size_t{0});
  random_engine engine(seed);
  for (std::size_t i = n; i-- > 1;) {
    const auto j = static_cast<std::size_t>(engine.uniform_below(static_cast<std::uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd

#endif  // HERD_DATA_DISTRIBUTED_SAMPLER_HPP
