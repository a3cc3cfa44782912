#ifndef HERD_CHECKPOINT_DETAIL_FILE_HPP
#define HERD_CHECKPOINT_DETAIL_FILE_HPP
// herd's rules on top of the safetensors format (detail/safetensors.hpp), and the one writer and
// reader of checkpoint files. herd's metadata: "herd.checksum" (first, so that its 16 hex digits
// have a fixed place): "fnv1a64:" and FNV-1a 64 of the whole file with those digits read as '0';
// "herd.checkpoint": "1", the version of these rules; "herd.values": a JSON array of the names
// saved with add_value, as U8 tensors of their bytes. The writer goes through a temporary file
// and a rename, so that a writer killed at any moment leaves the previous checkpoint whole.
// POSIX only (fsync, rename).

#include <herd/checkpoint/detail/safetensors.hpp>
#include <herd/core/config.hpp>
#include <herd/tensor/buffer_view.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace herd {
namespace detail {
// Test hook: called after entry `entry_index` has been handed to the temporary file, so a test
// can kill the writer half way through a save. Not for production use.
inline void (*checkpoint_after_entry_hook)(std::size_t entry_index) = nullptr;
}  // namespace detail

// What herd::checkpoint is built from: herd's rules on top of the format, the writer and reader.
namespace detail::ckpt {

namespace st = detail::safetensors;

inline constexpr char format_version[] = "1";
inline constexpr std::string_view checksum_prefix = R"({"__metadata__":{"herd.checksum":"fnv1a64:)";
inline constexpr std::size_t checksum_digits = 16;

// A problem found before it is known which rank reports it. Thrown and caught inside the checkpoint headers
// only; the public functions turn it into herd::error with their own error_site.
struct failure {
  std::string what;
  std::string todo;
};

HERD_SEPARATE std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t state = 14695981039346656037ull);

HERD_SEPARATE std::string system_message(int code);

HERD_SEPARATE std::string hex(std::uint64_t value);

[[noreturn]] HERD_SEPARATE void fail_damaged(const std::filesystem::path& path, const std::string& detail);

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_handle = std::unique_ptr<std::FILE, file_closer>;

// Writes the length of `header`, `header` with its checksum filled in, and the data of `views` to
// a temporary file beside `path`, then renames it over `path`. Until the rename, `path` keeps its
// previous content, whatever happens to this process.
HERD_SEPARATE void write_file(const std::filesystem::path& path, std::string header, const std::vector<buffer_view>& views);

// A checkpoint file read into memory: one snapshot, so that what was checked is what is loaded.
struct file_contents {
  std::string bytes;
  std::size_t data_start = 0;
  std::vector<st::tensor_info> tensors;  // by offset
  std::string_view header() const { return std::string_view(bytes).substr(8, data_start - 8); }

  // The bytes of tensors[t].
  const std::byte* data(std::size_t t) const {
    return reinterpret_cast<const std::byte*>(bytes.data() + data_start + tensors[t].begin);
  }
};

// The file at `path`, its structure (and a herd file's checksum and version) checked; nullopt if
// it does not exist.
HERD_SEPARATE std::optional<file_contents> read_file(const std::filesystem::path& path);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)
[[noreturn]] HERD_SEPARATE void fail_damaged(const std::filesystem::path& path, const std::string& detail) {
  throw failure{path.string() + " is damaged: " + detail,
                "Delete it or restore it from a backup; herd's own saves never leave a partial file, so it was damaged "
                "after it was written (disk, copy, or another program)"};
}

HERD_SEPARATE std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t state) {
  for (std::size_t i = 0; i < n; ++i) state = (state ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return state;
}

HERD_SEPARATE std::string system_message(int code) { return std::generic_category().message(code); }

HERD_SEPARATE std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

HERD_SEPARATE void write_file(const std::filesystem::path& path, std::string header, const std::vector<buffer_view>& views) {
  const std::uint64_t length = header.size();  // little-endian, as the host (safetensors.hpp)
  // The file's hash with the digits as '0', as `header` holds them now.
  std::uint64_t hash = fnv1a64(header.data(), header.size(), fnv1a64(&length, sizeof length));
  for (const buffer_view& v : views) hash = fnv1a64(v.data, v.bytes(), hash);
  header.replace(checksum_prefix.size(), checksum_digits, hex(hash));

  // The temporary's name is new (O_EXCL): a pid alone repeats across the hosts of a shared file
  // system, and another writer's temporary must never be truncated or renamed over `path`.
  std::filesystem::path temporary;
  file_handle file;
  for (int attempt = 0; !file; ++attempt) {
    std::uint32_t word = 0;  // getentropy (unistd.h; POSIX 2024, glibc 2.25): <random> is a heavy header to parse
    if (::getentropy(&word, sizeof word) != 0) word = static_cast<std::uint32_t>(std::time(nullptr) + attempt);
    temporary = path;
    temporary += ".tmp-" + std::to_string(::getpid()) + "-" + hex(word).substr(8);
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // umask applies
    int code = errno;
    if (fd >= 0) {
      file.reset(::fdopen(fd, "wb"));
      code = errno;
      if (!file) {
        ::close(fd);
        std::remove(temporary.c_str());
      }
    }
    if (!file && (fd >= 0 || code != EEXIST || attempt == 15)) {
      throw failure{"cannot create the temporary file " + temporary.string() + ": " + system_message(code),
                    "Check that the directory of " + path.string() + " exists and is writable"};
    }
  }
  const auto fail_io = [&](const char* step) {
    const int code = errno;
    file.reset();
    std::remove(temporary.c_str());  // a failed save leaves no temporary file behind
    throw failure{"could not " + std::string(step) + " " + temporary.string() + " while saving " + path.string() +
                      ": " + system_message(code),
                  "Check free space and permissions; the previous checkpoint at " + path.string() + " is unchanged"};
  };
  const auto write = [&](const void* data, std::size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, file.get()) != n) fail_io("write");
  };
  write(&length, sizeof length);
  write(header.data(), header.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    write(views[i].data, views[i].bytes());
    if (checkpoint_after_entry_hook) {
      std::fflush(file.get());  // so the temporary file holds what a real crash would leave
      checkpoint_after_entry_hook(i);
    }
  }
  if (std::fflush(file.get()) != 0 || ::fsync(::fileno(file.get())) != 0) fail_io("write and sync");
  if (std::fclose(file.release()) != 0) fail_io("close");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) fail_io("rename");
  // The rename lives in the directory: sync it too, or a power loss may bring back the old file.
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int code = dir < 0 || ::fsync(dir) != 0 ? errno : 0;
  if (dir >= 0) ::close(dir);
  if (code != 0) {
    throw failure{path.string() + " was written, but its directory could not be synced (" + system_message(code) +
                      "), so it may not survive a power loss",
                  "Check the file system; save again to be sure"};
  }
}

HERD_SEPARATE std::optional<file_contents> read_file(const std::filesystem::path& path) {
  file_handle file(std::fopen(path.c_str(), "rb"));
  struct stat info {};
  const int code = !file ? errno : ::fstat(::fileno(file.get()), &info) != 0 ? errno : 0;
  if (code == ENOENT && !file) return std::nullopt;
  if (code != 0) {
    throw failure{"cannot open " + path.string() + ": " + system_message(code), "Check the path and its permissions"};
  }
  if (!S_ISREG(info.st_mode)) throw failure{path.string() + " is not a regular file", "Pass a checkpoint file's path"};
  file_contents f;
  std::string& bytes = f.bytes;
  bytes.resize(static_cast<std::size_t>(info.st_size));
  if (std::fread(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    const int error = errno;
    if (std::ferror(file.get())) {
      throw failure{"could not read " + path.string() + ": " + system_message(error), "Check the file system"};
    }
    fail_damaged(path, "it ended while being read (it was " + std::to_string(bytes.size()) + " bytes when opened)");
  }
  const std::string size = std::to_string(bytes.size()) + " bytes long";
  if (bytes.size() < 8) fail_damaged(path, "it is " + size + "; it is truncated");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian, as the host (safetensors.hpp)
  if (n > bytes.size() - 8) {
    fail_damaged(path, "its header length, " + std::to_string(n) + " bytes, runs past its end (it is " + size + ")");
  }
  f.data_start = 8 + static_cast<std::size_t>(n);
  st::header parsed;
  try {
    parsed = st::parse_header(f.header());
  } catch (const st::malformed& m) {
    fail_damaged(path, m.what);
  }
  if (parsed.data_bytes != bytes.size() - f.data_start) {
    fail_damaged(path, "its tensors end at byte " + std::to_string(parsed.data_bytes) + " of its data section, which " +
                           "holds " + std::to_string(bytes.size() - f.data_start) + " bytes");
  }
  // A herd file's checksum covers it all, its digits read as '0'.
  auto& meta = parsed.metadata;
  if (meta.contains("herd.checksum") || meta.contains("herd.checkpoint")) {
    const std::size_t at = 8 + checksum_prefix.size();
    const bool placed = f.header().starts_with(checksum_prefix) && bytes.size() >= at + checksum_digits;
    std::uint64_t hash = 0;
    if (placed) {
      hash = fnv1a64("0000000000000000", checksum_digits, fnv1a64(bytes.data(), at));
      hash = fnv1a64(bytes.data() + at + checksum_digits, bytes.size() - at - checksum_digits, hash);
    }
    if (!placed || meta["herd.checksum"] != "fnv1a64:" + hex(hash)) {
      fail_damaged(path, "its checksum does not match its content (herd.checksum " +
                             st::json_string(meta["herd.checksum"]) +
                             (placed ? ", computed fnv1a64:" + hex(hash) : " is missing or not first") + ")");
    }
    if (meta["herd.checkpoint"] != format_version) {
      throw failure{path.string() + " is a herd checkpoint of version " + st::json_string(meta["herd.checkpoint"]) +
                        "; this herd reads version " + format_version,
                    "Load it with the herd release that wrote it"};
    }
  }
  f.tensors = std::move(parsed.tensors);
  return f;
}

#endif

}  // namespace detail::ckpt
}  // namespace herd

#endif  // HERD_CHECKPOINT_DETAIL_FILE_HPP
