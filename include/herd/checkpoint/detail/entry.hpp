#ifndef HERD_CHECKPOINT_DETAIL_ENTRY_HPP
#define HERD_CHECKPOINT_DETAIL_ENTRY_HPP
// What herd::checkpoint keeps of each registered tensor or value, the checks its memory gets
// before every save and load, and how a file's bytes go back into it.

#include <herd/checkpoint/detail/file.hpp>
#include <herd/checkpoint/detail/layout.hpp>
#include <herd/checkpoint/detail/safetensors.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace herd::detail::ckpt {

// A registered tensor or value, read through view() at each save and load.
struct entry {
  std::string name;
  bool value;
  std::function<buffer_view()> view;
  std::vector<std::uint64_t> shape;  // empty: [its element count]
  // Split over the ranks: view() is elements [offset, offset + its count) of a tensor of
  // `whole` elements, which the file holds.
  std::size_t offset = 0;
  std::size_t whole = 0;
  bool split = false;
  // Its shape when its memory is column-major, now (a matrix may be resized between saves).
  std::function<std::vector<std::size_t>()> column_major = {};
};

// What is wrong with an entry's memory as it is now, if anything.
HERD_SEPARATE std::optional<failure> fault(const entry& e, const buffer_view& v);

// Fills an entry's memory `view` from the file's bytes at `from`, in its own order.
HERD_SEPARATE void copy_in(const entry& e, const buffer_view& view, const std::byte* from);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::optional<failure> fault(const entry& e, const buffer_view& v) {
  const std::string what = "the tensor " + st::json_string(e.name);
  std::string dims;
  for (std::uint64_t d : e.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  if (!v.device.is_cpu()) {
    return {{what + " lives on " + v.device.str() + "; a checkpoint saves host memory only",
             "Copy it into a host tensor and register that"}};
  }
  if (!is_valid(v.type) || v.count > std::numeric_limits<std::size_t>::max() / size_of(v.type) ||
      (v.data == nullptr && v.count != 0)) {
    return {{what + " has an invalid dtype (value " + std::to_string(static_cast<int>(v.type)) + "), a null data "
                 "pointer or an impossible size (" + std::to_string(v.count) + " elements)",
             "Fix its tensor_traits: a herd::dtype, and the data of its elements"}};
  }
  if (const std::vector<std::size_t> shape = e.column_major ? e.column_major() : std::vector<std::size_t>{};
      !shape.empty()) {
    std::size_t count = 1;
    std::string cm;
    for (std::size_t d : shape) {
      count *= d;
      cm += (cm.empty() ? "" : ", ") + std::to_string(d);
    }
    if (count != v.count) {
      return {{what + " has " + std::to_string(v.count) + " elements, but its adapter gives it the column-major "
                   "shape [" + cm + "]",
               "Fix its tensor_traits' column_major_shape"}};
    }
  }
  if (e.split && (v.count > e.whole || e.offset > e.whole - v.count)) {
    return {{what + " is elements [" + std::to_string(e.offset) + ", " + std::to_string(e.offset + v.count) +
                 ") of a split tensor of " + std::to_string(e.whole) + " elements, past its end",
             "Fix the optimizer's visit_sharded_state"}};
  }
  if (!e.shape.empty() && st::elements(e.shape) != v.count) {
    return {{what + " has " + std::to_string(v.count) + " elements, which do not fill its shape [" + dims + "]",
             "Give it a shape whose product is its element count"}};
  }
  return std::nullopt;
}

HERD_SEPARATE void copy_in(const entry& e, const buffer_view& view, const std::byte* from) {
  if (view.count == 0) return;
  if (e.column_major) {
    if (const std::vector<std::size_t> shape = e.column_major(); reorders(shape)) {
      return reorder(view.data, from, shape, size_of(view.type), false);
    }
  }
  std::memcpy(view.data, from, view.bytes());
}

#endif

}  // namespace herd::detail::ckpt

#endif  // HERD_CHECKPOINT_DETAIL_ENTRY_HPP
