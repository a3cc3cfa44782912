#pragma once
// Reading (Fashion-)MNIST's IDX files, gzip-compressed as Debian's dataset-fashion-mnist ships
// them. Every problem (a missing file, a truncated or corrupt one, images and labels that do not
// belong together) raises idx::error with a message that names the file and where to get it.
//
// IDX format (big-endian): magic 0x00000803 (unsigned bytes, 3 dimensions) for images,
// 0x00000801 (unsigned bytes, 1 dimension) for labels, then one u32 per dimension, then the bytes.

#include <zlib.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace idx {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The hint appended to every data error: the likeliest fix is installing the package.
inline std::string data_error_message(const std::filesystem::path& path, const std::string& problem) {
  return path.string() + ": " + problem +
         ". The Fashion-MNIST files come from the Debian package dataset-fashion-mnist "
         "(sudo apt-get install dataset-fashion-mnist, which puts them in /usr/share/datasets/fashion-mnist); "
         "or point --data at a directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
         "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
}

// Images of one split: count images of rows x cols bytes each, one after another.
struct images {
  std::size_t count = 0;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint8_t> pixels;

  std::size_t pixels_per_image() const noexcept { return rows * cols; }
  const std::uint8_t* image(std::size_t i) const noexcept { return pixels.data() + i * pixels_per_image(); }
};

struct labeled_images {
  images inputs;
  std::vector<std::uint8_t> labels;  // one per image, each below `classes`
};

namespace detail {

// gzclose on scope exit, so that every error path releases the file.
struct gz_closer {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};
using gz_file = std::unique_ptr<gzFile_s, gz_closer>;

class reader {
 public:
  explicit reader(std::filesystem::path path) : path_(std::move(path)) {
    errno = 0;
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) {
      const int saved = errno;
      fail(saved != 0 ? std::string("cannot open it: ") + std::strerror(saved) : "cannot open it");
    }
  }

  [[noreturn]] void fail(const std::string& problem) const { throw error(data_error_message(path_, problem)); }

  // Fills `out` completely or fails: a short read means a truncated (or corrupt) file.
  void read(void* out, std::size_t bytes, const char* what) {
    auto* at = static_cast<unsigned char*>(out);
    while (bytes > 0) {
      // gzread takes an unsigned count and returns an int: read in pieces of at most 1 GiB.
      const unsigned piece = static_cast<unsigned>(bytes < (std::size_t{1} << 30) ? bytes : (std::size_t{1} << 30));
      const int got = gzread(file_.get(), at, piece);
      if (got < 0) fail(std::string("the file is corrupt, in ") + what + " (" + zlib_message() + ")");
      if (got == 0) fail(std::string("the file ends early, in ") + what + " (truncated download or copy?)");
      at += got;
      bytes -= static_cast<std::size_t>(got);
    }
  }

  std::uint32_t read_u32(const char* what) {
    unsigned char b[4];
    read(b, sizeof b, what);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | std::uint32_t{b[3]};
  }

  // Nothing may follow the data: trailing bytes mean the header's counts are wrong.
  void expect_end() {
    unsigned char extra = 0;
    const int got = gzread(file_.get(), &extra, 1);
    // gzip's checksum comes after the data, so a damaged stream often shows only here.
    if (got < 0) fail("the file is corrupt (" + zlib_message() + ")");
    if (got > 0) fail("the file holds more bytes than its header announces");
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::string zlib_message() const {
    int code = 0;
    const char* message = gzerror(file_.get(), &code);
    std::string text = message != nullptr && *message != '\0' ? message : "unknown error";
    // zlib puts the path in front, which our message already starts with.
    if (const std::string prefix = path_.string() + ": "; text.starts_with(prefix)) text.erase(0, prefix.size());
    return "zlib: " + text;
  }

  std::filesystem::path path_;
  gz_file file_;
};

// Upper bound on one file's payload, so that a corrupt header cannot ask for a huge allocation.
inline constexpr std::size_t max_payload_bytes = std::size_t{1} << 31;

}  // namespace detail

inline images read_images(const std::filesystem::path& path) {
  detail::reader in(path);
  const std::uint32_t magic = in.read_u32("the header");
  if (magic != 0x00000803u) {
    char text[64];
    std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(magic));
    in.fail(std::string("not an IDX image file (magic ") + text + ", expected 0x00000803)");
  }
  images result;
  result.count = in.read_u32("the header");
  result.rows = in.read_u32("the header");
  result.cols = in.read_u32("the header");
  if (result.count == 0 || result.rows == 0 || result.cols == 0 || result.rows > 4096 || result.cols > 4096) {
    in.fail("implausible dimensions " + std::to_string(result.count) + " x " + std::to_string(result.rows) + " x " +
            std::to_string(result.cols));
  }
  const std::size_t bytes = result.count * result.rows * result.cols;
  if (bytes > detail::max_payload_bytes) in.fail("the header announces " + std::to_string(bytes) + " bytes of pixels");
  result.pixels.resize(bytes);
  in.read(result.pixels.data(), bytes, "the pixels");
  in.expect_end();
  return result;
}

inline std::vector<std::uint8_t> read_labels(const std::filesystem::path& path, unsigned classes) {
  detail::reader in(path);
  const std::uint32_t magic = in.read_u32("the header");
  if (magic != 0x00000801u) {
    char text[64];
    std::snprintf(text, sizeof text, "0x%08x", static_cast<unsigned>(magic));
    in.fail(std::string("not an IDX label file (magic ") + text + ", expected 0x00000801)");
  }
  const std::size_t count = in.read_u32("the header");
  if (count == 0 || count > detail::max_payload_bytes) in.fail("implausible label count " + std::to_string(count));
  std::vector<std::uint8_t> labels(count);
  in.read(labels.data(), count, "the labels");
  in.expect_end();
  for (std::size_t i = 0; i < count; ++i) {
    if (labels[i] >= classes) {
      in.fail("label " + std::to_string(i) + " is " + std::to_string(labels[i]) + ", outside 0.." +
              std::to_string(classes - 1));
    }
  }
  return labels;
}

// One split: images and labels that must agree in count, with the expected image size.
inline labeled_images read_split(const std::filesystem::path& images_path, const std::filesystem::path& labels_path,
                                 std::size_t rows, std::size_t cols, unsigned classes) {
  labeled_images split;
  split.inputs = read_images(images_path);
  if (split.inputs.rows != rows || split.inputs.cols != cols) {
    throw error(data_error_message(images_path, "the images are " + std::to_string(split.inputs.rows) + " x " +
                                                    std::to_string(split.inputs.cols) + " pixels, expected " +
                                                    std::to_string(rows) + " x " + std::to_string(cols)));
  }
  split.labels = read_labels(labels_path, classes);
  if (split.labels.size() != split.inputs.count) {
    throw error(data_error_message(labels_path, "it holds " + std::to_string(split.labels.size()) +
                                                    " labels but " + images_path.string() + " holds " +
                                                    std::to_string(split.inputs.count) + " images"));
  }
  return split;
}

}  // namespace idx
