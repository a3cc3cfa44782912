#pragma once
// herd::checkpoint: a named set of tensors and plain values that one rank saves to a file and
// every rank restores.
//
//   herd::checkpoint state;
//   state.add("weights", weights).add("momentum", momentum).add_value("epoch", epoch);
//   state.save("run/state.herd", comm);             // rank 0 writes; every rank returns together
//   if (!state.load("run/state.herd", comm)) {...}  // rank 0 reads; every rank ends with its values
//
// save() writes a temporary file next to the target, syncs it and renames it over the target, so
// a writer killed at any moment leaves the previous checkpoint whole. load() checks the whole file
// (structure, checksum, the set of entries, each entry's dtype and size) before it writes into any
// registered tensor. Only host memory is saved; POSIX only (fsync, rename).
//
// File format, version 1. Integers are little-endian; tensor and value bytes are the host's memory
// as it is (so a checkpoint moves between machines of one byte order).
//   magic      8 bytes  "HERDCKPT"
//   version    u32      1
//   entries    u64
//   per entry, in the order they were added:
//     name     u32 length, then that many bytes (no terminator)
//     kind     u8       0: tensor, 1: value
//     dtype    u8       a herd::dtype for a tensor, 0xff for a value
//     count    u64      elements of a tensor, bytes of a value
//     data     count * size_of(dtype) bytes for a tensor, count bytes for a value
//   checksum   u64      FNV-1a 64 of every byte before it

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/optim/optimizer_state.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/traits.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace herd {
namespace detail {

// Test hook: called after entry `entry_index` has been handed to the temporary file, so a test
// can kill the writer half way through a save. Not for production use.
inline void (*checkpoint_after_entry_hook)(std::size_t entry_index) = nullptr;

}  // namespace detail

// What herd::checkpoint is built from: the file format, the reader and writer, messages between ranks.
namespace detail::ckpt {

inline constexpr char magic_bytes[8] = {'H', 'E', 'R', 'D', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t format_version = 1;
inline constexpr std::uint8_t value_dtype = 0xff;
// Magic, version, entry count, checksum: a file shorter than this cannot be a checkpoint.
inline constexpr std::uint64_t min_file_bytes = 8 + 4 + 8 + 8;
// Name length, kind, dtype, count.
inline constexpr std::uint64_t entry_header_bytes = 4 + 1 + 1 + 8;

enum class entry_kind : std::uint8_t { tensor = 0, value = 1 };

// A problem found before it is known which rank reports it. Thrown and caught inside this header
// only; the public functions turn it into herd::error with their own error_site.
struct failure {
  std::string what;
  std::string todo;
};

// One entry as the file (or a rank's registrations) describes it.
struct record {
  std::string name;
  entry_kind kind = entry_kind::tensor;
  std::uint8_t type = 0;  // herd::dtype's value, or value_dtype
  std::uint64_t count = 0;
  std::uint64_t offset = 0;  // of the data, in the file
  std::uint64_t bytes = 0;   // of the data
};

struct fnv1a64 {
  std::uint64_t state = 14695981039346656037ull;
  void update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
      state ^= p[i];
      state *= 1099511628211ull;
    }
  }
};

inline void append_le(std::vector<unsigned char>& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

inline std::uint64_t load_le(const unsigned char* p, int bytes) noexcept {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= std::uint64_t{p[i]} << (8 * i);
  return value;
}

inline std::string system_message(int code) { return std::generic_category().message(code); }

// A name for a message: quoted, control bytes escaped and long names cut, since a damaged file
// can hold any bytes where a name should be.
inline std::string in_quotes(std::string_view name) {
  constexpr std::size_t longest = 128;
  std::string out = "\"";
  for (std::size_t i = 0; i < name.size() && i < longest; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += name[i];
    }
  }
  if (name.size() > longest) out += "...";
  return out + "\"";
}

// "f32 tensor of 10 elements", "value of 8 bytes"
inline std::string describe(const record& r) {
  if (r.kind == entry_kind::value) return "value of " + std::to_string(r.count) + " bytes";
  return std::string(name(static_cast<dtype>(r.type))) + " tensor of " + std::to_string(r.count) + " elements";
}

inline std::string damaged_todo() {
  return "Delete it or restore it from a backup; herd's own saves never leave a partial file, so it was damaged "
         "after it was written (disk, copy, or another program)";
}

[[noreturn]] inline void fail_damaged(const std::filesystem::path& path, const std::string& detail) {
  throw failure{path.string() + " is damaged: " + detail, damaged_todo()};
}

// The entry header that precedes each entry's data, on disk and in the messages between ranks.
inline void append_record_header(std::vector<unsigned char>& out, const record& r) {
  append_le(out, r.name.size(), 4);
  out.insert(out.end(), r.name.begin(), r.name.end());
  out.push_back(static_cast<unsigned char>(r.kind));
  out.push_back(r.type);
  append_le(out, r.count, 8);
}

// Data bytes of a record, or nullopt if its kind, dtype or count is impossible.
inline std::optional<std::uint64_t> record_bytes(const record& r) {
  if (r.kind == entry_kind::value) {
    if (r.type != value_dtype) return std::nullopt;
    return r.count;
  }
  if (r.kind != entry_kind::tensor || !is_valid(static_cast<dtype>(r.type))) return std::nullopt;
  const std::uint64_t element = size_of(static_cast<dtype>(r.type));
  if (r.count > std::numeric_limits<std::uint64_t>::max() / element) return std::nullopt;
  return r.count * element;
}

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_handle = std::unique_ptr<std::FILE, file_closer>;

// Writes `records` with the data of `views` to a temporary file beside `path`, then renames it
// over `path`. Until the rename, `path` keeps its previous content, whatever happens to this process.
inline void write_file(const std::filesystem::path& path, const std::vector<record>& records,
                       const std::vector<buffer_view>& views) {
  std::filesystem::path temporary = path;
  temporary += ".tmp-" + std::to_string(::getpid());
  file_handle file(std::fopen(temporary.c_str(), "wb"));
  if (!file) {
    const int code = errno;
    throw failure{"cannot create the temporary file " + temporary.string() + ": " + system_message(code),
                  "Check that the directory of " + path.string() + " exists and is writable"};
  }
  bool renamed = false;
  // A failed save leaves no temporary file behind.
  struct cleanup {
    file_handle& file;
    const std::filesystem::path& temporary;
    bool& renamed;
    ~cleanup() {
      file.reset();
      if (!renamed) std::remove(temporary.c_str());
    }
  } guard{file, temporary, renamed};

  const auto fail_io = [&](const char* step) {
    const int code = errno;
    throw failure{"could not " + std::string(step) + " " + temporary.string() + " while saving " + path.string() +
                      ": " + system_message(code),
                  "Check free space and permissions; the previous checkpoint at " + path.string() + " is unchanged"};
  };
  fnv1a64 hash;
  const auto write = [&](const void* data, std::size_t n) {
    if (n == 0) return;
    hash.update(data, n);
    if (std::fwrite(data, 1, n, file.get()) != n) fail_io("write");
  };

  std::vector<unsigned char> header(magic_bytes, magic_bytes + sizeof magic_bytes);
  append_le(header, format_version, 4);
  append_le(header, records.size(), 8);
  write(header.data(), header.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    header.clear();
    append_record_header(header, records[i]);
    write(header.data(), header.size());
    write(views[i].data, views[i].bytes());
    if (checkpoint_after_entry_hook) {
      std::fflush(file.get());  // so the temporary file holds what a real crash would leave
      checkpoint_after_entry_hook(i);
    }
  }
  std::vector<unsigned char> checksum;
  append_le(checksum, hash.state, 8);
  if (std::fwrite(checksum.data(), 1, checksum.size(), file.get()) != checksum.size()) fail_io("write");
  if (std::fflush(file.get()) != 0) fail_io("write");
  if (::fsync(::fileno(file.get())) != 0) fail_io("sync");
  if (std::fclose(file.release()) != 0) fail_io("close");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int code = errno;
    throw failure{"could not rename " + temporary.string() + " to " + path.string() + ": " + system_message(code),
                  "Check that " + path.string() + " is not a directory and that its directory is writable"};
  }
  renamed = true;
  // The rename lives in the directory: sync it too, or a power loss may bring back the old file.
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0 || ::fsync(dir) != 0) {
    const int code = errno;
    if (dir >= 0) ::close(dir);
    throw failure{path.string() + " was written, but its directory could not be synced (" + system_message(code) +
                      "), so it may not survive a power loss",
                  "Check the file system; save again to be sure"};
  }
  ::close(dir);
}

// Reads a checkpoint file in two passes over one open handle: scan() checks structure and
// checksum without writing anywhere; fill() then reads the data into the destinations.
class reader {
 public:
  // nullopt if `path` does not exist.
  static std::optional<reader> open(const std::filesystem::path& path) {
    file_handle file(std::fopen(path.c_str(), "rb"));
    if (!file) {
      const int code = errno;
      if (code == ENOENT) return std::nullopt;
      throw failure{"cannot open " + path.string() + ": " + system_message(code), "Check the path and its permissions"};
    }
    struct stat info {};
    if (::fstat(::fileno(file.get()), &info) != 0) {
      const int code = errno;
      throw failure{"cannot read the size of " + path.string() + ": " + system_message(code), "Check the file system"};
    }
    if (!S_ISREG(info.st_mode)) {
      throw failure{path.string() + " is not a regular file", "Pass the path of a checkpoint file"};
    }
    return reader(path, std::move(file), static_cast<std::uint64_t>(info.st_size));
  }

  // Every entry of the file, in file order, once the structure and the checksum check out.
  std::vector<record> scan() {
    if (size_ < min_file_bytes) {
      fail_damaged(path_, "it is " + std::to_string(size_) + " bytes long, shorter than the smallest checkpoint (" +
                              std::to_string(min_file_bytes) + " bytes); it is truncated");
    }
    restart();
    unsigned char fixed[8 + 4 + 8];
    read(fixed, sizeof fixed);
    if (std::memcmp(fixed, magic_bytes, sizeof magic_bytes) != 0) {
      throw failure{path_.string() + " is not a herd checkpoint (it does not start with \"HERDCKPT\")",
                    "Check the path; if it did hold a checkpoint, it is damaged: delete it or restore it from a "
                    "backup"};
    }
    const std::uint64_t version = load_le(fixed + 8, 4);
    if (version != format_version) {
      throw failure{path_.string() + " has checkpoint format version " + std::to_string(version) +
                        "; this herd reads version " + std::to_string(format_version) +
                        " (unless another herd release wrote it, the file is damaged)",
                    "Load it with the herd release that wrote it, or delete it or restore it from a backup"};
    }
    const std::uint64_t entries = load_le(fixed + 12, 8);
    if (entries > remaining() / entry_header_bytes) {
      fail_damaged(path_, "it claims " + std::to_string(entries) + " entries, more than its " +
                              std::to_string(remaining()) + " remaining bytes can hold");
    }
    std::vector<record> records;
    std::map<std::string, std::size_t, std::less<>> seen;
    for (std::uint64_t i = 0; i < entries; ++i) {
      const std::string which = "entry " + std::to_string(i);
      need(4, which);
      unsigned char length[4];
      read(length, 4);
      const std::uint64_t name_bytes = load_le(length, 4);
      need(name_bytes + entry_header_bytes - 4, which);
      record r;
      r.name.resize(static_cast<std::size_t>(name_bytes));
      read(r.name.data(), r.name.size());
      unsigned char rest[1 + 1 + 8];
      read(rest, sizeof rest);
      r.kind = static_cast<entry_kind>(rest[0]);
      r.type = rest[1];
      r.count = load_le(rest + 2, 8);
      const std::string named = which + " (" + in_quotes(r.name) + ")";
      const auto bytes = record_bytes(r);
      if (!bytes) {
        fail_damaged(path_, named + " has an impossible kind, dtype or size (kind " + std::to_string(rest[0]) +
                                ", dtype " + std::to_string(rest[1]) + ", count " + std::to_string(r.count) + ")");
      }
      if (!seen.emplace(r.name, records.size()).second) fail_damaged(path_, named + " repeats an earlier name");
      need(*bytes, named);
      r.offset = position_;
      r.bytes = *bytes;
      skip(*bytes);
      records.push_back(std::move(r));
    }
    if (remaining() != 0) {
      fail_damaged(path_, std::to_string(remaining()) + " unexpected bytes follow its last entry");
    }
    unsigned char stored[8];
    read_unhashed(stored, sizeof stored);
    checksum_ = hash_.state;
    if (load_le(stored, 8) != checksum_) {
      fail_damaged(path_, "its checksum does not match its content (stored " + hex(load_le(stored, 8)) + ", computed " +
                              hex(checksum_) + ")");
    }
    return records;
  }

  // Reads each record's data into destinations[i] (records and destinations as scan() and the
  // caller paired them), checking the checksum again in case the file changed since scan().
  void fill(const std::vector<record>& records, const std::vector<void*>& destinations) {
    restart();
    for (std::size_t i = 0; i < records.size(); ++i) {
      skip(records[i].offset - position_);
      read(destinations[i], static_cast<std::size_t>(records[i].bytes));
    }
    skip(remaining());
    if (hash_.state != checksum_) {
      throw failure{path_.string() + " changed while it was being loaded; the registered tensors now hold a mix "
                                     "of old and new data",
                    "Make sure no other program writes the file while it is loaded, and load again"};
    }
  }

 private:
  reader(std::filesystem::path path, file_handle file, std::uint64_t size)
      : path_(std::move(path)), file_(std::move(file)), size_(size) {}

  // Bytes left before the checksum.
  std::uint64_t remaining() const noexcept { return size_ - 8 - position_; }

  void need(std::uint64_t bytes, const std::string& what) {
    if (bytes > remaining()) {
      fail_damaged(path_, what + " needs " + std::to_string(bytes) + " more bytes but only " +
                              std::to_string(remaining()) +
                              " remain before the checksum; the file is truncated or a length in it is corrupt");
    }
  }

  void restart() {
    if (std::fseek(file_.get(), 0, SEEK_SET) != 0) fail_read();
    position_ = 0;
    hash_ = {};
  }

  void read_unhashed(void* data, std::size_t n) {
    if (n != 0 && std::fread(data, 1, n, file_.get()) != n) fail_read();
    position_ += n;
  }

  void read(void* data, std::size_t n) {
    read_unhashed(data, n);
    hash_.update(data, n);
  }

  void skip(std::uint64_t n) {
    unsigned char chunk[1 << 16];
    while (n > 0) {
      const std::size_t step = n < sizeof chunk ? static_cast<std::size_t>(n) : sizeof chunk;
      read(chunk, step);
      n -= step;
    }
  }

  [[noreturn]] void fail_read() {
    const int code = errno;
    if (std::ferror(file_.get())) {
      throw failure{"could not read " + path_.string() + ": " + system_message(code), "Check the file system"};
    }
    fail_damaged(path_, "it ended at byte " + std::to_string(position_) + " while being read (it was " +
                            std::to_string(size_) + " bytes when opened)");
  }

  static std::string hex(std::uint64_t value) {
    char text[19];
    std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
    return text;
  }

  std::filesystem::path path_;
  file_handle file_;
  std::uint64_t size_ = 0;
  std::uint64_t position_ = 0;
  fnv1a64 hash_;
  std::uint64_t checksum_ = 0;
};

// For each record of the file, the index of the registered entry it fills. Raises naming every
// difference (up to eight) when the two sets of entries are not the same.
inline std::vector<std::size_t> match(const std::filesystem::path& path, const std::vector<record>& file,
                                      const std::vector<record>& registered, const std::string& subject) {
  std::map<std::string_view, std::size_t, std::less<>> index;
  for (std::size_t i = 0; i < registered.size(); ++i) index.emplace(registered[i].name, i);
  std::vector<std::string> differences;
  std::vector<std::size_t> order(file.size());
  std::vector<bool> found(registered.size(), false);
  for (std::size_t i = 0; i < file.size(); ++i) {
    const auto it = index.find(file[i].name);
    if (it == index.end()) {
      differences.push_back(in_quotes(file[i].name) + " is in the file but not registered");
      continue;
    }
    const record& mine = registered[it->second];
    found[it->second] = true;
    order[i] = it->second;
    if (mine.kind != file[i].kind || mine.type != file[i].type || mine.count != file[i].count) {
      differences.push_back(in_quotes(file[i].name) + " differs: " + describe(file[i]) + " in the file, " +
                            describe(mine) + " here");
    }
  }
  for (std::size_t i = 0; i < registered.size(); ++i) {
    if (!found[i]) differences.push_back(in_quotes(registered[i].name) + " is registered but not in the file");
  }
  if (differences.empty()) return order;
  std::string what = path.string() + " does not match " + subject + ": ";
  for (std::size_t i = 0; i < differences.size() && i < 8; ++i) what += (i ? "; " : "") + differences[i];
  if (differences.size() > 8) what += "; and " + std::to_string(differences.size() - 8) + " more";
  throw failure{what, "Register the same entries, with the same dtypes and sizes, as the program that saved it, or "
                      "load a checkpoint saved with these entries"};
}

// Messages between ranks: a status byte, then what the status needs (strings, a table of records).
enum class status_code : std::uint8_t { ok = 0, missing = 1, failed = 2 };

class message_reader {
 public:
  explicit message_reader(const std::vector<unsigned char>& bytes) : bytes_(bytes) {}
  std::uint64_t integer(int n) {
    take(static_cast<std::size_t>(n));
    return load_le(bytes_.data() + at_ - static_cast<std::size_t>(n), n);
  }
  std::string text() {
    const auto n = static_cast<std::size_t>(integer(8));
    take(n);
    return std::string(reinterpret_cast<const char*>(bytes_.data()) + (at_ - n), n);
  }

 private:
  void take(std::size_t n) {
    // Only a bug or memory corruption could garble a message herd built itself.
    if (n > bytes_.size() - at_) throw failure{"a checkpoint message between ranks is garbled", ""};
    at_ += n;
  }
  const std::vector<unsigned char>& bytes_;
  std::size_t at_ = 0;
};

inline void append_text(std::vector<unsigned char>& out, const std::string& text) {
  append_le(out, text.size(), 8);
  out.insert(out.end(), text.begin(), text.end());
}

inline std::vector<unsigned char> failure_message(const std::string& what, const std::string& todo) {
  std::vector<unsigned char> out{static_cast<unsigned char>(status_code::failed)};
  append_text(out, what);
  append_text(out, todo);
  return out;
}

// `message` from root on every rank (its length first, so the others can size their buffers).
template <communicator C>
std::vector<unsigned char> broadcast_message(std::vector<unsigned char> message, C& comm, int root) {
  std::int64_t length = static_cast<std::int64_t>(message.size());
  buffer_view length_view{&length, 1, dtype::i64};
  herd::broadcast(length_view, comm, root);
  message.resize(static_cast<std::size_t>(length));
  buffer_view message_view{message.data(), message.size(), dtype::u8};
  herd::broadcast(message_view, comm, root);
  return message;
}

inline void check_root(const error_site& site, int root) {
  if (root < 0 || root >= site.size) {
    raise(site, "root " + std::to_string(root) + " is out of range",
          "Pass a root in [0, " + std::to_string(site.size) + ")");
  }
}

}  // namespace detail::ckpt

// A named set of tensors and plain values saved by one rank and restored on every rank. It keeps
// references (buffer_views are kept by value): every registered tensor and value must outlive
// the checkpoint. Tensors are read
// through their traits at each save and load, so a std::vector may be reallocated in between.
//
// Its collective save and load call herd's collectives, so, like them, it lives in the
// configuration namespace (core/config.hpp): no two translation units share a definition that
// one compiled with g++ and the other with nvcc.
HERD_CONFIG_NAMESPACE_BEGIN

class checkpoint {
 public:
  // Any adapted tensor in host memory.
  template <class T> checkpoint& add(std::string name, T& tensor) {
    detail::require_writable_tensor<T>();
    require_host(name, view_of(tensor));
    return insert("checkpoint::add", std::move(name), detail::ckpt::entry_kind::tensor,
                  [&tensor] { return view_of(tensor); });
  }

  // A view kept by value: memory described rather than owned by a tensor object.
  checkpoint& add(std::string name, buffer_view view) {
    require_host(name, view);
    return insert("checkpoint::add", std::move(name), detail::ckpt::entry_kind::tensor, [view] { return view; });
  }

  // Every state tensor of an optimizer (optim/optimizer_state.hpp), named prefix + its own name.
  template <class Optimizer> checkpoint& add_optimizer_state(const std::string& prefix, Optimizer& opt) {
    visit_optimizer_state(opt, [&](const auto& name, buffer_view v) { add(prefix + std::string(name), v); });
    return *this;
  }

  // A plain value: an epoch, a step counter, an RNG state. Saved as its bytes.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  checkpoint& add_value(std::string name, T& value) {
    static_assert(!std::is_const_v<T>, "herd: checkpoint::add_value needs a non-const value, since load() writes it");
    return insert("checkpoint::add_value", std::move(name), detail::ckpt::entry_kind::value,
                  [&value] { return buffer_view{&value, sizeof(T), dtype::u8}; });
  }

  // Writes the file from this process alone (no communicator involved).
  void save(const std::filesystem::path& path) const {
    try {
      write(path);
    } catch (const detail::ckpt::failure& f) {
      detail::raise({"checkpoint::save"}, f.what, f.todo);
    }
  }

  // Fills every registered entry from the file; false, touching nothing, if the file does not exist.
  bool load(const std::filesystem::path& path) {
    try {
      auto reader = detail::ckpt::reader::open(path);
      if (!reader) return false;
      const std::vector<buffer_view> views = checked_views();
      const auto file = reader->scan();
      const auto order = detail::ckpt::match(path, file, records(views), "the registered entries");
      reader->fill(file, destinations(order, views));
      return true;
    } catch (const detail::ckpt::failure& f) {
      detail::raise({"checkpoint::load"}, f.what, f.todo);
    }
  }

  // Root writes the file; every rank returns once it is in place, or raises herd::error if root
  // could not write it.
  template <communicator C> void save(const std::filesystem::path& path, C& comm, int root = 0) const {
    if constexpr (requires { comm.control(); }) return save(path, comm.control(), root);  // host memory only
    const detail::error_site site{"checkpoint::save", comm.rank(), comm.size()};
    detail::ckpt::check_root(site, root);
    std::vector<unsigned char> status;
    if (comm.rank() == root) {
      try {
        write(path);
        status.push_back(static_cast<unsigned char>(detail::ckpt::status_code::ok));
      } catch (const detail::ckpt::failure& f) {
        status = detail::ckpt::failure_message(f.what, f.todo);
      } catch (const std::exception& e) {
        status = detail::ckpt::failure_message(path.string() + ": " + e.what(), "");
      }
    }
    status = detail::ckpt::broadcast_message(std::move(status), comm, root);
    detail::ckpt::message_reader reply(status);
    if (static_cast<detail::ckpt::status_code>(reply.integer(1)) != detail::ckpt::status_code::ok) {
      raise_reported(site, reply, root, "writes the checkpoint");
    }
    herd::barrier(comm);
  }

  // Root reads and checks the file, then sends each entry to every rank, so the other ranks need
  // no access to the file. false on every rank if it does not exist; herd::error on every rank if
  // it is damaged or its entries differ from those registered on any rank.
  template <communicator C> bool load(const std::filesystem::path& path, C& comm, int root = 0) {
    if constexpr (requires { comm.control(); }) return load(path, comm.control(), root);
    const detail::error_site site{"checkpoint::load", comm.rank(), comm.size()};
    detail::ckpt::check_root(site, root);
    const bool is_root = comm.rank() == root;
    std::optional<detail::ckpt::reader> reader;  // root keeps the file open until it has read it
    std::vector<detail::ckpt::record> scanned;   // root: the file's entries, with their offsets
    std::vector<buffer_view> views;
    std::vector<unsigned char> status;
    if (is_root) {
      try {
        reader = detail::ckpt::reader::open(path);
        if (!reader) {
          status.push_back(static_cast<unsigned char>(detail::ckpt::status_code::missing));
        } else {
          views = checked_views();
          scanned = reader->scan();
          detail::ckpt::match(path, scanned, records(views), "the registered entries");
          status.push_back(static_cast<unsigned char>(detail::ckpt::status_code::ok));
          detail::ckpt::append_le(status, scanned.size(), 8);
          for (const auto& r : scanned) detail::ckpt::append_record_header(status, r);
        }
      } catch (const detail::ckpt::failure& f) {
        status = detail::ckpt::failure_message(f.what, f.todo);
      } catch (const std::exception& e) {
        status = detail::ckpt::failure_message(path.string() + ": " + e.what(), "");
      }
    }
    status = detail::ckpt::broadcast_message(std::move(status), comm, root);

    std::vector<detail::ckpt::record> file;
    std::vector<std::size_t> order;
    std::string local_what;
    std::string local_todo;
    try {
      detail::ckpt::message_reader reply(status);
      const auto kind = static_cast<detail::ckpt::status_code>(reply.integer(1));
      if (kind == detail::ckpt::status_code::missing) return false;
      if (kind != detail::ckpt::status_code::ok) raise_reported(site, reply, root, "reads the checkpoint");
      file.resize(static_cast<std::size_t>(reply.integer(8)));
      for (auto& r : file) {
        r.name.resize(static_cast<std::size_t>(reply.integer(4)));
        for (char& c : r.name) c = static_cast<char>(reply.integer(1));
        r.kind = static_cast<detail::ckpt::entry_kind>(reply.integer(1));
        r.type = static_cast<std::uint8_t>(reply.integer(1));
        r.count = reply.integer(8);
      }
      // Root compared its own entries already; each other rank checks its own against root's file.
      if (!is_root) views = checked_views();
      order = detail::ckpt::match(path, file, records(views),
                                  is_root ? "the registered entries"
                                          : "the entries registered on rank " + std::to_string(comm.rank()) +
                                                " (the file as rank " + std::to_string(root) + " read it)");
    } catch (const detail::ckpt::failure& f) {
      local_what = f.what;
      local_todo = f.todo.empty() ? "Register the same entries on every rank" : f.todo;
    }
    // A rank whose entries differ stops every rank, before any tensor is written.
    std::int32_t first_faulty = local_what.empty() ? comm.size() : comm.rank();
    buffer_view faulty_view{&first_faulty, 1, dtype::i32};
    herd::allreduce(faulty_view, comm, reduce_op::min);
    if (!local_what.empty()) detail::raise(site, local_what, local_todo);
    if (first_faulty != comm.size()) {
      detail::raise(site,
                    "rank " + std::to_string(first_faulty) + "'s registered entries do not match " + path.string() +
                        " (its own error says more)",
                    "Register the same entries on every rank; every rank stops so that none waits forever");
    }

    status.clear();
    if (is_root) {
      try {
        reader->fill(scanned, destinations(order, views));
        status.push_back(static_cast<unsigned char>(detail::ckpt::status_code::ok));
      } catch (const detail::ckpt::failure& f) {
        status = detail::ckpt::failure_message(f.what, f.todo);
      }
    }
    status = detail::ckpt::broadcast_message(std::move(status), comm, root);
    detail::ckpt::message_reader filled(status);
    if (static_cast<detail::ckpt::status_code>(filled.integer(1)) != detail::ckpt::status_code::ok) {
      raise_reported(site, filled, root, "reads the checkpoint");
    }
    for (std::size_t i = 0; i < file.size(); ++i) {
      buffer_view v = views[order[i]];
      herd::broadcast(v, comm, root);
    }
    return true;
  }

 private:
  static void require_host(const std::string& name, const buffer_view& v) {
    if (!v.device.is_cpu()) {
      detail::raise({"checkpoint::add"},
                    "the tensor " + detail::ckpt::in_quotes(name) + " lives on " + v.device.str() +
                        "; a checkpoint saves host memory only",
                    "Copy it into a host tensor and register that");
    }
    if (!is_valid(v.type)) {
      detail::raise({"checkpoint::add"},
                    "the tensor " + detail::ckpt::in_quotes(name) + " has an invalid dtype (value " +
                        std::to_string(static_cast<int>(v.type)) + ")",
                    "Return one of herd::dtype's values from tensor_traits::dtype");
    }
  }

  struct entry {
    std::string name;
    detail::ckpt::entry_kind kind;
    std::function<buffer_view()> view;
  };

  checkpoint& insert(std::string_view operation, std::string name, detail::ckpt::entry_kind kind,
                     std::function<buffer_view()> view) {
    if (name.empty()) {
      detail::raise({operation}, "the name is empty", "Give every entry a non-empty name, unique in the checkpoint");
    }
    if (name.size() > std::numeric_limits<std::uint32_t>::max()) {
      detail::raise({operation}, "the name is " + std::to_string(name.size()) + " bytes long",
                    "Use a name shorter than 4 GiB");
    }
    if (index_.contains(name)) {
      detail::raise({operation}, "an entry named " + detail::ckpt::in_quotes(name) + " is already registered",
                    "Give every entry a unique name");
    }
    index_.emplace(name, entries_.size());
    entries_.push_back({std::move(name), kind, std::move(view)});
    return *this;
  }

  // Each entry's memory as it is now, checked: host memory, a valid dtype, data behind the count.
  std::vector<buffer_view> checked_views() const {
    std::vector<buffer_view> views;
    views.reserve(entries_.size());
    for (const entry& e : entries_) {
      buffer_view v;
      try {
        v = e.view();
      } catch (const std::exception& ex) {
        throw detail::ckpt::failure{
            "the adapter of the tensor " + detail::ckpt::in_quotes(e.name) + " rejected it: " + ex.what(),
            "Register tensors herd can read as contiguous host memory"};
      }
      const std::string what = "the tensor " + detail::ckpt::in_quotes(e.name);
      if (!v.device.is_cpu()) {
        throw detail::ckpt::failure{what + " now lives on " + v.device.str() + "; a checkpoint saves host memory only",
                                    "Keep registered tensors in host memory"};
      }
      if (!is_valid(v.type)) {
        throw detail::ckpt::failure{
            what + " has an invalid dtype (value " + std::to_string(static_cast<int>(v.type)) + ")",
            "Return one of herd::dtype's values from tensor_traits::dtype"};
      }
      if (v.count > std::numeric_limits<std::size_t>::max() / size_of(v.type) || (v.data == nullptr && v.count != 0)) {
        throw detail::ckpt::failure{
            what + " has a null data pointer or an impossible size (" + std::to_string(v.count) + " elements)",
            "Register allocated memory"};
      }
      views.push_back(v);
    }
    return views;
  }

  std::vector<detail::ckpt::record> records(const std::vector<buffer_view>& views) const {
    std::vector<detail::ckpt::record> out(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      out[i].name = entries_[i].name;
      out[i].kind = entries_[i].kind;
      out[i].type = entries_[i].kind == detail::ckpt::entry_kind::value ? detail::ckpt::value_dtype
                                                                        : static_cast<std::uint8_t>(views[i].type);
      out[i].count = views[i].count;
      out[i].bytes = views[i].bytes();
    }
    return out;
  }

  static std::vector<void*> destinations(const std::vector<std::size_t>& order, const std::vector<buffer_view>& views) {
    std::vector<void*> out;
    out.reserve(order.size());
    for (std::size_t i : order) out.push_back(views[i].data);
    return out;
  }

  void write(const std::filesystem::path& path) const {
    const std::vector<buffer_view> views = checked_views();
    detail::ckpt::write_file(path, records(views), views);
  }

  // Raises, on every rank, the failure root reported in `reply`.
  [[noreturn]] static void raise_reported(const detail::error_site& site, detail::ckpt::message_reader& reply, int root,
                                          const char* role) {
    std::string what = reply.text();
    std::string todo = reply.text();
    if (site.rank != root) what = "rank " + std::to_string(root) + ", which " + role + ", failed: " + what;
    detail::raise(site, what, todo);
  }

  std::vector<entry> entries_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

HERD_CONFIG_NAMESPACE_END
}  // namespace herd
