#ifndef HERD_CHECKPOINT_CHECKPOINT_HPP
#define HERD_CHECKPOINT_CHECKPOINT_HPP
// herd::checkpoint: tensors and plain values by name, that one rank saves and every rank restores.
//   herd::checkpoint state;
//   state.add("weights", weights, {256, 784}).add("momentum", momentum).add_value("epoch", epoch);
//   state.save("run/state.safetensors", comm);             // rank 0 writes; every rank returns together
//   if (!state.load("run/state.safetensors", comm)) {...}  // rank 0 reads; every rank ends with its values
//
// The file is a safetensors file (checkpoint/detail/safetensors.hpp, with herd's metadata of
// checkpoint/detail/file.hpp): Python's safetensors package and PyTorch open it, and a
// safetensors file from PyTorch loads here by name. save() writes a temporary file next to the
// target, syncs it and renames it over the target, so a writer killed at any moment leaves the
// previous checkpoint whole. load() reads the file into memory and checks it whole (structure,
// checksum, the set of entries, each entry's dtype and element count) before it writes into any
// registered tensor; a file without herd's metadata gets every check but the checksum. Only host
// memory is saved; POSIX only (fsync, rename).

#include <herd/checkpoint/detail/entry.hpp>
#include <herd/checkpoint/detail/file.hpp>
#include <herd/checkpoint/detail/layout.hpp>
#include <herd/checkpoint/detail/match.hpp>
#include <herd/checkpoint/detail/on_root.hpp>
#include <herd/checkpoint/detail/safetensors.hpp>
#include <herd/checkpoint/detail/sharded.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/host_tensor.hpp>
#include <herd/tensor/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {

// A named set of tensors and plain values saved by one rank and restored on every rank. It keeps
// references (buffer_views are kept by value): every registered tensor and value must outlive
// the checkpoint. Tensors are read through their traits at each save and load, so a std::vector
// may be reallocated in between. Its collective save and load call herd's collectives, so, like
// them, it lives in the configuration namespace (core/config.hpp): no two translation units share
// a definition that one compiled with g++ and the other with nvcc.
HERD_CONFIG_NAMESPACE_BEGIN

class checkpoint {
 public:
  // Any adapted tensor in host memory, saved with `shape` (row-major) so that PyTorch gets it back
  // in its real shape, or with shape [its element count] when none is given. A file's entry loads
  // into it when dtypes and element counts agree, whatever the entry's shape. A column-major
  // tensor (an Eigen matrix, an Armadillo Mat) is written in the row-major order of its own shape
  // and read back the same way (checkpoint/detail/layout.hpp): saved with {rows, cols}, element
  // (i, j) is t[i][j] in PyTorch; another shape reshapes that order, as torch.reshape would.
  template <class T> checkpoint& add(std::string name, T& tensor, const std::vector<std::size_t>& shape = {}) {
    detail::require_writable_tensor<T>();
    return insert("checkpoint::add", {std::move(name), false, [&tensor] { return view_of(tensor); },
                                      {shape.begin(), shape.end()}, 0, 0, false,
                                      [&tensor] { return detail::column_major_shape_of(tensor); }});
  }

  // A view kept by value: memory described rather than owned by a tensor object.
  checkpoint& add(std::string name, buffer_view view, const std::vector<std::size_t>& shape = {});

  // Every state tensor of an optimizer (optim/optimizer_state.hpp), named prefix + its own name.
  // State split over the ranks (zero_optimizer's) is saved whole: save(path, comm) gathers it to
  // the root, and each rank loads its own part of the file, whatever the world size that saved it.
  template <class Optimizer> checkpoint& add_optimizer_state(const std::string& prefix, Optimizer& opt) {
    if constexpr (sharded_optimizer_state<Optimizer>) {
      opt.visit_sharded_state([&](const auto& name, const sharded_view& s) {
        if (s.replicated) return void(add(prefix + std::string(name), s.part));
        insert("checkpoint::add_optimizer_state",
               {prefix + std::string(name), false, [v = s.part] { return v; }, {}, s.offset, s.count, true});
      });
    } else {
      visit_optimizer_state(opt, [&](const auto& name, buffer_view v) { add(prefix + std::string(name), v); });
    }
    return *this;
  }

  // A plain value: an epoch, a step counter, an RNG state. Saved as its bytes (a U8 tensor).
  template <class T>
    requires std::is_trivially_copyable_v<T>
  checkpoint& add_value(std::string name, T& value) {
    static_assert(!std::is_const_v<T>, "herd: checkpoint::add_value needs a non-const value, since load() writes it");
    return insert("checkpoint::add_value",
                  {std::move(name), true, [&value] { return buffer_view{&value, sizeof(T), dtype::u8}; }, {}});
  }

  // Writes the file from this process alone (no communicator involved); state split over several
  // ranks needs save(path, comm).
  void save(const std::filesystem::path& path) const;

  // Strict (the default): a load needs the file's entries and the registered ones to be the same
  // set. Not strict, as PyTorch's load_state_dict(strict=False): the entries the file lacks keep
  // their values and the file's tensors nobody registered are skipped; the last load lists both in
  // missing_keys() and unexpected_keys(). An entry in both must still agree in dtype and size.
  checkpoint& set_strict(bool strict) noexcept {
    strict_ = strict;
    return *this;
  }
  const std::vector<std::string>& missing_keys() const noexcept { return missing_; }
  const std::vector<std::string>& unexpected_keys() const noexcept { return unexpected_; }

  // Fills every registered entry from the file; false, touching nothing, if the file does not exist.
  bool load(const std::filesystem::path& path);

  // Root writes the file; every rank returns once it is in place, or raises herd::error if root
  // could not write it. Tensors split over the ranks are gathered to root first.
  template <communicator C> void save(const std::filesystem::path& path, C& comm, int root = 0) const;

  // Root reads and checks the file, then sends each entry to every rank, so the other ranks need
  // no access to the file. false on every rank if it does not exist; herd::error on every rank if
  // it is damaged or its entries differ from those registered on any rank.
  template <communicator C> bool load(const std::filesystem::path& path, C& comm, int root = 0);

 private:
  using entry = detail::ckpt::entry;

  checkpoint& insert(std::string_view operation, entry e);

  // Each entry's memory as it is now, checked.
  std::vector<buffer_view> checked_views() const;

  // The entries as a file describes them, offsets left to write().
  std::vector<detail::safetensors::tensor_info> tensors(const std::vector<buffer_view>& views) const;

  // Pairs of (a tensor of `file`, the entry it fills), or a failure naming the differences;
  // records the keys either side lacks (strict off).
  std::vector<std::pair<std::size_t, std::size_t>> match(const std::filesystem::path& path,
                                                         const std::vector<detail::safetensors::tensor_info>& file,
                                                         const std::vector<buffer_view>& views, const std::string& subject);

  // herd's metadata, then the entries by decreasing element size, so that the data of each is
  // aligned to its element size, as the data section is to 8 bytes.
  // `views`: each entry's memory, checked (a split entry's: the whole, gathered).
  void write(const std::filesystem::path& path, std::vector<buffer_view> views) const;

  std::vector<entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
  bool strict_ = true;
  std::vector<std::string> missing_, unexpected_;  // of the last load, strict off
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
HERD_SEPARATE checkpoint& checkpoint::add(std::string name, buffer_view view, const std::vector<std::size_t>& shape) {
  return insert("checkpoint::add", {std::move(name), false, [view] { return view; }, {shape.begin(), shape.end()}});
}

HERD_SEPARATE void checkpoint::save(const std::filesystem::path& path) const {
  try {
    const std::vector<buffer_view> views = checked_views();
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].split && views[i].count != entries_[i].whole) {
        throw detail::ckpt::failure{"the tensor " + detail::safetensors::json_string(entries_[i].name) +
                                        " is split over the ranks, and this rank holds " +
                                        std::to_string(views[i].count) + " of its " +
                                        std::to_string(entries_[i].whole) + " elements",
                                    "Save with save(path, comm), which gathers it whole"};
      }
    }
    write(path, views);
  } catch (const detail::ckpt::failure& f) {
    detail::raise({"checkpoint::save"}, f.what, f.todo);
  }
}

HERD_SEPARATE bool checkpoint::load(const std::filesystem::path& path) {
  try {
    const auto file = detail::ckpt::read_file(path);
    if (!file) return false;
    const std::vector<buffer_view> views = checked_views();
    for (const auto& [t, v] : match(path, file->tensors, views, "the registered entries")) {
      const entry& e = entries_[v];
      detail::ckpt::copy_in(e, views[v], file->data(t) + (e.split ? e.offset * size_of(views[v].type) : 0));
    }
    return true;
  } catch (const detail::ckpt::failure& f) {
    detail::raise({"checkpoint::load"}, f.what, f.todo);
  }
}

HERD_SEPARATE checkpoint& checkpoint::insert(std::string_view operation, entry e) {
  const std::string name = detail::safetensors::json_string(e.name);
  if (e.name.empty() || !detail::safetensors::is_utf8(e.name) || e.name == "__metadata__") {
    detail::raise({operation}, "the name " + name + " is empty, not UTF-8, or reserved",
                  "Give every entry a UTF-8 name other than \"\" and \"__metadata__\" (names are JSON strings)");
  }
  if (index_.contains(e.name)) {
    detail::raise({operation}, "an entry named " + name + " is already registered", "Give every entry a unique name");
  }
  if (const auto f = detail::ckpt::fault(e, e.view())) detail::raise({operation}, f->what, f->todo);
  index_.emplace(e.name, entries_.size());
  entries_.push_back(std::move(e));
  return *this;
}

HERD_SEPARATE std::vector<buffer_view> checkpoint::checked_views() const {
  std::vector<buffer_view> views;
  for (const entry& e : entries_) {
    try {
      views.push_back(e.view());
    } catch (const std::exception& ex) {
      throw detail::ckpt::failure{
          "the adapter of the tensor " + detail::safetensors::json_string(e.name) + " rejected it: " + ex.what(),
          "Register tensors herd can read as contiguous host memory"};
    }
    if (const auto f = fault(e, views.back())) throw *f;
  }
  return views;
}

HERD_SEPARATE std::vector<detail::safetensors::tensor_info> checkpoint::tensors(
    const std::vector<buffer_view>& views) const {
  std::vector<detail::safetensors::tensor_info> out;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const entry& e = entries_[i];
    out.push_back({e.name, std::string(detail::safetensors::dtype_name(views[i].type)), e.shape, 0, 0});
    if (e.shape.empty()) out.back().shape = {e.split ? e.whole : views[i].count};
  }
  return out;
}

HERD_SEPARATE std::vector<std::pair<std::size_t, std::size_t>> checkpoint::match(
    const std::filesystem::path& path, const std::vector<detail::safetensors::tensor_info>& file,
    const std::vector<buffer_view>& views, const std::string& subject) {
  return detail::ckpt::match(path, file, tensors(views), entries_, index_, strict_, missing_, unexpected_, subject);
}

HERD_SEPARATE void checkpoint::write(const std::filesystem::path& path, std::vector<buffer_view> views) const {
  std::vector<host_tensor> row_major;  // copies of the column-major entries, in file order
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].column_major) continue;
    const std::vector<std::size_t> shape = entries_[i].column_major();
    if (!detail::ckpt::reorders(shape)) continue;
    host_tensor& copy = row_major.emplace_back(views[i].type, views[i].count);
    detail::ckpt::reorder(copy.data(), views[i].data, shape, size_of(views[i].type), true);
    views[i] = copy.view();
  }
  const std::vector<detail::safetensors::tensor_info> all = tensors(views);
  std::vector<detail::safetensors::tensor_info> in_order;
  std::vector<buffer_view> data;
  std::string values;
  for (std::size_t element = 8; element > 0; element /= 2) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (size_of(views[i].type) != element) continue;
      const std::uint64_t at = in_order.empty() ? 0 : in_order.back().end;
      in_order.push_back(all[i]);
      in_order.back().begin = at;
      in_order.back().end = at + views[i].bytes();
      data.push_back(views[i]);
      if (entries_[i].value) values += (values.empty() ? "" : ",") + detail::safetensors::json_string(all[i].name);
    }
  }
  detail::ckpt::write_file(path,
                           detail::safetensors::format_header({{"herd.checksum", "fnv1a64:0000000000000000"},
                                                               {"herd.checkpoint", detail::ckpt::format_version},
                                                               {"herd.values", "[" + values + "]"}},
                                                              in_order),
                           data);
}

#endif

// The collective save and load are defined out of the class, so not inline: with
// HERD_SEPARATE_COMPILATION a file compiles neither for mpi_communicator (extern templates,
// collectives/separate_compilation.hpp), nor the file format code they call.

template <communicator C> void checkpoint::save(const std::filesystem::path& path, C& comm, int root) const {
  if constexpr (requires { comm.control(); }) return save(path, comm.control(), root);  // host memory only
  const detail::error_site site{"checkpoint::save", comm.rank(), comm.size()};
  if (root < 0 || root >= site.size) {
    detail::raise(site, "root " + std::to_string(root) + " is out of range",
                  "Pass a root in [0, " + std::to_string(site.size) + ")");
  }
  // Every rank's entries are checked, and the ranks agree on the split ones, before any rank
  // enters a gather that another might skip.
  std::vector<buffer_view> views;
  std::optional<detail::ckpt::failure> fault;
  try {
    views = checked_views();
  } catch (const detail::ckpt::failure& f) {
    fault = f;
  }
  std::uint64_t signature = 14695981039346656037ull;
  for (const entry& e : entries_) {
    if (!e.split) continue;
    signature = detail::ckpt::fnv1a64(e.name.data(), e.name.size(), signature);
    signature = detail::ckpt::fnv1a64(&e.whole, sizeof e.whole, signature);
  }
  const auto mine = static_cast<std::int64_t>(signature >> 1);
  std::int64_t agreed[3] = {fault ? comm.rank() : comm.size(), mine, -mine};
  buffer_view agreed_view{agreed, 3, dtype::i64};
  herd::allreduce(agreed_view, comm, reduce_op::min);
  if (fault) detail::raise(site, fault->what, fault->todo);
  if (agreed[0] != comm.size()) {
    detail::raise(site, "rank " + std::to_string(agreed[0]) + " could not read its registered entries (its own error "
                  "says more)", "Fix that rank's entries; every rank stops so that none waits forever");
  }
  if (agreed[1] != -agreed[2]) {
    detail::raise(site, "the ranks registered different state split over the ranks",
                  "Register the same optimizers, over the same parameters, on every rank");
  }
  std::vector<host_tensor> gathered;
  try {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const entry& e = entries_[i];
      if (!e.split) continue;
      gathered.push_back(detail::ckpt::gather_whole(e.name, views[i], e.offset, e.whole, comm, root));
      views[i] = gathered.back().view();
    }
  } catch (const detail::ckpt::failure& f) {  // alike on every rank
    detail::raise(site, f.what, f.todo);
  }
  detail::ckpt::on_root(site, comm, root, path, "writes the checkpoint", [&] {
    write(path, views);
    return std::string("o");
  });
  herd::barrier(comm);
}

template <communicator C> bool checkpoint::load(const std::filesystem::path& path, C& comm, int root) {
  if constexpr (requires { comm.control(); }) return load(path, comm.control(), root);
  const detail::error_site site{"checkpoint::load", comm.rank(), comm.size()};
  std::optional<detail::ckpt::file_contents> contents;  // root's
  const std::string status = detail::ckpt::on_root(site, comm, root, path, "reads the checkpoint", [&] {
    contents = detail::ckpt::read_file(path);
    return contents ? "o" + std::string(contents->header()) : std::string("m");
  });
  if (status[0] == 'm') return false;

  // Each rank checks its own entries against the file as root read it; one that differs stops
  // every rank, before any tensor is written.
  std::vector<buffer_view> views;
  std::vector<std::pair<std::size_t, std::size_t>> order;
  std::optional<detail::ckpt::failure> mismatch;
  try {
    views = checked_views();
    order = match(path, contents ? contents->tensors : detail::safetensors::parse_header(status.substr(1)).tensors,
                  views,
                  contents ? "the registered entries"
                           : "the entries registered on rank " + std::to_string(comm.rank()) + " (the file as rank " +
                                 std::to_string(root) + " read it)");
  } catch (const detail::ckpt::failure& f) {
    mismatch = detail::ckpt::failure{f.what, f.todo.empty() ? "Register the same entries on every rank" : f.todo};
  } catch (const detail::safetensors::malformed& m) {  // only a bug could garble what root checked
    mismatch = detail::ckpt::failure{"the header rank " + std::to_string(root) + " sent is garbled: " + m.what, ""};
  }
  std::int32_t first_faulty = mismatch ? comm.rank() : comm.size();
  buffer_view faulty_view{&first_faulty, 1, dtype::i32};
  herd::allreduce(faulty_view, comm, reduce_op::min);
  if (mismatch) detail::raise(site, mismatch->what, mismatch->todo);
  if (first_faulty != comm.size()) {
    detail::raise(site,
                  "rank " + std::to_string(first_faulty) + "'s registered entries do not match " + path.string() +
                      " (its own error says more)",
                  "Register the same entries on every rank; every rank stops so that none waits forever");
  }
  if (!strict_) {
    // Not strict, ranks could pick different tensors of the file and then wait on different
    // broadcasts: every rank compares its pick's signature (min of s and of -s: all equal when
    // min == -max). The file's tensors only: which entry of a rank takes one is that rank's own
    // business (the same entries may be registered in another order on each rank).
    std::uint64_t signature = 14695981039346656037ull;
    for (const auto& pick : order) signature = detail::ckpt::fnv1a64(&pick.first, sizeof pick.first, signature);
    const auto mine = static_cast<std::int64_t>(signature >> 1);
    std::int64_t range[2] = {mine, -mine};
    buffer_view range_view{range, 2, dtype::i64};
    herd::allreduce(range_view, comm, reduce_op::min);
    if (range[0] != -range[1]) {
      detail::raise(site, "the ranks' registered entries match different tensors of " + path.string() + " (strict off)",
                    "Register the same entries on every rank");
    }
  }
  // Root copies each tensor out of the file and sends it; of a split one, each rank receives its
  // own part.
  for (const auto& [t, v] : order) {
    const entry& e = entries_[v];
    if (e.split) {
      detail::ckpt::scatter_whole(contents ? contents->data(t) : nullptr, views[v], e.offset, e.whole, comm, root);
      continue;
    }
    if (contents) detail::ckpt::copy_in(e, views[v], contents->data(t));
    herd::broadcast(views[v], comm, root);
  }
  return true;
}

HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#endif  // HERD_CHECKPOINT_CHECKPOINT_HPP
