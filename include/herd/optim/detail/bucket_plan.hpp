#ifndef HERD_OPTIM_DETAIL_BUCKET_PLAN_HPP
#define HERD_OPTIM_DETAIL_BUCKET_PLAN_HPP
// Which gradients share a bucket, as DDP assigns them: gradients are taken in a given order
// (reverse registration order at first, since backward produces the last layers' gradients first;
// later the order they were observed to become ready), each into the open bucket of its dtype,
// which closes once it holds at least its cap: first_bucket_bytes for the first bucket of each
// dtype (small, so that communication starts early in the backward pass), bucket_bytes for the
// rest. A gradient larger than the cap fills a bucket alone. Buckets are numbered in the order
// of their first gradient, and launched in that order on every rank.
//
// On a GPU each member starts at a multiple of 16 bytes of the bucket (the gap before it is
// padding, reduced along with the rest and never read back): the kernels that pack and unpack move
// 16-byte vectors only where both sides are aligned alike, so one odd-sized gradient would
// otherwise send every later member of its bucket down the element-by-element path. Host buckets
// are not padded: their elements are the gradients' back to back, so a rank that reduces a bucket
// straight from its gradients (shared memory, no packing) and one that packed it agree on its size.

#include <herd/core/config.hpp>
#include <herd/core/device.hpp>
#include <herd/core/dtype.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {

// The alignment of a bucket's members, in bytes: the widest vector access on a GPU, none on the host.
inline std::size_t member_alignment(device where) { return where.is_cuda() ? 16 : 1; }

// Where a member may start after `count` elements of `type`: a multiple of `align_bytes`.
inline std::size_t padded_offset(std::size_t count, dtype type, std::size_t align_bytes) {
  const std::size_t step = std::max<std::size_t>(1, align_bytes / size_of(type));
  return (count + step - 1) / step * step;
}

struct bucket_plan {
  struct bucket {
    dtype type = dtype::f32;
    std::vector<std::size_t> members;  // gradient indices, in the order they are packed
    std::vector<std::size_t> offsets;  // element offset of each member in the bucket
    std::size_t count = 0;             // elements in all, padding included
  };

  std::vector<bucket> buckets;
  std::vector<std::size_t> bucket_of;  // gradient index -> its bucket
  std::vector<std::size_t> slot_of;    // gradient index -> its position in bucket.members

  // `shapes[i]` = (elements, dtype) of gradient i; `order`: a permutation of the gradient indices;
  // members start at multiples of `align_bytes` (member_alignment of where the gradients live).
  static bucket_plan make(std::span<const std::pair<std::size_t, dtype>> shapes, std::span<const std::size_t> order,
                          std::size_t first_bucket_bytes, std::size_t bucket_bytes, std::size_t align_bytes);

  // The default order: the last gradient first.
  static std::vector<std::size_t> reverse_order(std::size_t n) {
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
    return order;
  }

  // The rebuild's order: the gradients in the order they became ready (`ready`), then those never
  // seen ready, last first.
  static std::vector<std::size_t> ready_order_first(std::span<const std::size_t> ready, std::size_t n);
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE bucket_plan bucket_plan::make(std::span<const std::pair<std::size_t, dtype>> shapes,
                                            std::span<const std::size_t> order, std::size_t first_bucket_bytes,
                                            std::size_t bucket_bytes, std::size_t align_bytes) {
  bucket_plan plan;
  plan.bucket_of.assign(shapes.size(), 0);
  plan.slot_of.assign(shapes.size(), 0);
  struct open_bucket {
    dtype type;
    std::size_t index;  // in plan.buckets
    bool first;         // the first bucket of its dtype
  };
  std::vector<open_bucket> open;
  std::vector<dtype> seen;  // dtypes that have had a bucket
  for (std::size_t i : order) {
    const auto [count, type] = shapes[i];
    auto it = open.begin();
    while (it != open.end() && it->type != type) ++it;
    if (it == open.end()) {
      bool first = true;
      for (dtype t : seen) first = first && t != type;
      if (first) seen.push_back(type);
      plan.buckets.push_back({type, {}, {}, 0});
      open.push_back({type, plan.buckets.size() - 1, first});
      it = open.end() - 1;
    }
    bucket& b = plan.buckets[it->index];
    plan.bucket_of[i] = it->index;
    plan.slot_of[i] = b.members.size();
    b.members.push_back(i);
    b.offsets.push_back(padded_offset(b.count, type, align_bytes));
    b.count = b.offsets.back() + count;
    if (b.count * size_of(type) >= (it->first ? first_bucket_bytes : bucket_bytes)) open.erase(it);
  }
  return plan;
}

HERD_SEPARATE std::vector<std::size_t> bucket_plan::ready_order_first(std::span<const std::size_t> ready,
                                                                      std::size_t n) {
  std::vector<std::size_t> order(ready.begin(), ready.end());
  std::vector<char> placed(n, 0);
  for (std::size_t i : ready) placed[i] = 1;
  for (std::size_t i = n; i-- > 0;) {
    if (!placed[i]) order.push_back(i);
  }
  return order;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_OPTIM_DETAIL_BUCKET_PLAN_HPP
