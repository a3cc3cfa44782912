// herd::checkpoint: round trips through safetensors files, files from other writers loaded by
// name, damaged, malformed and mismatching files refused before anything is written, a writer
// killed mid-save leaving the previous checkpoint loadable, the communicator variants on threads
// (root's values everywhere, errors on every rank), and column-major tensors in row-major order.

#include <herd/comm/local.hpp>
#include <herd/core/half.hpp>
#include <herd/checkpoint/checkpoint.hpp>
#include <herd/optim/sgd.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include "../support/checks.hpp"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

using herd_test::error_of;
using herd_test::has;

namespace {

// A fresh directory under the system's temporary directory, removed with everything in it.
struct scratch_directory {
  fs::path path;
  scratch_directory() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("herd-test-checkpoint-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_directory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  scratch_directory(const scratch_directory&) = delete;
  scratch_directory& operator=(const scratch_directory&) = delete;
};

struct rng_state {
  std::uint64_t words[2];
  std::int16_t tag;
  friend bool operator==(const rng_state&, const rng_state&) = default;
};

// Everything a training run might checkpoint, filled from one seed so two instances differ.
struct training_state {
  std::vector<float> weights;
  std::vector<herd::half> activations;
  std::vector<std::int64_t> indices;
  std::vector<std::uint8_t> raw_storage;
  herd::buffer_view raw;
  int epoch = 0;
  double learning_rate = 0;
  rng_state rng{};

  explicit training_state(int seed) : weights(37), activations(11), indices(5), raw_storage(24) {
    raw = herd::buffer_view{raw_storage.data(), raw_storage.size() / 4, herd::dtype::i32};
    fill(seed);
  }
  training_state(const training_state&) = delete;  // raw points into raw_storage
  training_state& operator=(const training_state&) = delete;

  // New values in the same memory, so registrations stay valid.
  void fill(int seed) {
    for (std::size_t i = 0; i < weights.size(); ++i)
      weights[i] = static_cast<float>(seed) * 1.5f + static_cast<float>(i);
    for (std::size_t i = 0; i < activations.size(); ++i)
      activations[i] = herd::half(static_cast<float>(seed) - 0.25f * static_cast<float>(i));
    for (std::size_t i = 0; i < indices.size(); ++i)
      indices[i] = (std::int64_t{seed} << 40) - static_cast<std::int64_t>(i);
    for (std::size_t i = 0; i < raw_storage.size(); ++i)
      raw_storage[i] = static_cast<std::uint8_t>(seed * 31 + static_cast<int>(i));
    epoch = seed + 100;
    learning_rate = 1.0 / (seed + 3);
    rng = {{std::uint64_t{0x9e3779b97f4a7c15} * static_cast<std::uint64_t>(seed + 1), static_cast<std::uint64_t>(seed)},
           static_cast<std::int16_t>(-seed)};
  }

  void register_into(herd::checkpoint& c) {
    c.add("weights", weights).add("activations", activations).add("indices", indices).add("raw", raw);
    c.add_value("epoch", epoch).add_value("learning_rate", learning_rate).add_value("rng", rng);
  }

  bool same_as(const training_state& o) const {
    bool same_activations = activations.size() == o.activations.size();
    for (std::size_t i = 0; same_activations && i < activations.size(); ++i)
      same_activations = activations[i].bits == o.activations[i].bits;
    return same_activations && weights == o.weights && indices == o.indices && raw_storage == o.raw_storage &&
           epoch == o.epoch && learning_rate == o.learning_rate && rng == o.rng;
  }
};

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file as another program might write it: the length of `header`, `header` as it
// is, then `data`.
void write_safetensors(const fs::path& p, const std::string& header, const std::vector<unsigned char>& data = {}) {
  std::vector<char> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(std::uint64_t{header.size()} >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(p, bytes);
}

template <class T> void append_bytes(std::vector<unsigned char>& out, const std::vector<T>& values) {
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  out.insert(out.end(), p, p + values.size() * sizeof(T));
}

// The header of a file herd wrote, and where its data starts.
std::pair<std::string, std::size_t> header_of(const std::vector<char>& file) {
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(file[static_cast<std::size_t>(i)])} << (8 * i);
  return {std::string(file.data() + 8, static_cast<std::size_t>(n)), 8 + static_cast<std::size_t>(n)};
}

// Puts the right checksum into a herd file edited by hand: FNV-1a 64 of it with its 16 digits as '0'.
void fix_checksum(std::vector<char>& file) {
  const std::size_t at = 8 + std::string(R"({"__metadata__":{"herd.checksum":"fnv1a64:)").size();
  std::uint64_t hash = 14695981039346656037ull;
  for (std::size_t i = 0; i < file.size(); ++i) {
    const char c = i >= at && i < at + 16 ? '0' : file[i];
    hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(hash));
  std::memcpy(file.data() + at, digits, 16);
}

// Saves training_state(1) to `path` in a checkpoint of its own.
void save_state(const fs::path& path, int seed = 1) {
  training_state s(seed);
  herd::checkpoint c;
  s.register_into(c);
  c.save(path);
}

void kill_self(std::size_t) { ::kill(::getpid(), SIGKILL); }

}  // namespace

TEST_CASE("checkpoint: tensors of several dtypes, a buffer_view and plain values round-trip") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  training_state saved(1);
  herd::checkpoint out;
  saved.register_into(out);
  out.save(path);

  // A safetensors file: herd's metadata first, then the entries by decreasing element size (each
  // aligned), the values last as U8 tensors of their bytes, and the data right after the header.
  const std::vector<char> bytes = read_bytes(path);
  const auto [header, data_start] = header_of(bytes);
  CHECK(header.size() % 8 == 0);
  CHECK(header.starts_with(R"({"__metadata__":{"herd.checksum":"fnv1a64:)"));
  CHECK(has(header, R"(,"herd.checkpoint":"1","herd.values":"[\"epoch\",\"learning_rate\",\"rng\"]"},)"));
  CHECK(has(header, R"("indices":{"dtype":"I64","shape":[5],"data_offsets":[0,40]},)"
                    R"("weights":{"dtype":"F32","shape":[37],"data_offsets":[40,188]},)"
                    R"("raw":{"dtype":"I32","shape":[6],"data_offsets":[188,212]},)"
                    R"("activations":{"dtype":"F16","shape":[11],"data_offsets":[212,234]},)"
                    R"("epoch":{"dtype":"U8","shape":[4],"data_offsets":[234,238]},)"));
  CHECK(bytes.size() == data_start + 246 + sizeof(rng_state));
  CHECK(std::memcmp(bytes.data() + data_start + 40, saved.weights.data(), 37 * sizeof(float)) == 0);

  training_state loaded(2);
  CHECK(!loaded.same_as(saved));
  herd::checkpoint in;
  loaded.register_into(in);
  CHECK(in.load(path));
  CHECK(loaded.same_as(saved));

  // Saving again replaces the file and leaves no temporary file behind.
  training_state next(3);
  herd::checkpoint again;
  next.register_into(again);
  again.save(path);
  CHECK(in.load(path));
  CHECK(loaded.same_as(next));
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    ++files;
    CHECK(e.path().filename() == "state.safetensors");
  }
  CHECK(files == 1);

  // An empty checkpoint and empty tensors are valid too.
  herd::checkpoint empty;
  empty.save(dir.path / "empty.safetensors");
  CHECK(empty.load(dir.path / "empty.safetensors"));
  std::vector<double> nothing;
  herd::checkpoint holds_empty;
  holds_empty.add("nothing", nothing);
  holds_empty.save(dir.path / "nothing.safetensors");
  CHECK(holds_empty.load(dir.path / "nothing.safetensors"));
}

TEST_CASE("checkpoint: a missing file loads as false and touches nothing") {
  scratch_directory dir;
  training_state s(4);
  const training_state before(4);
  herd::checkpoint c;
  s.register_into(c);
  CHECK(!c.load(dir.path / "never-saved.safetensors"));
  CHECK(s.same_as(before));
}

TEST_CASE("checkpoint: a truncated file raises herd::error naming the path, and writes nothing") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  save_state(path);
  const std::vector<char> full = read_bytes(path);
  training_state s(2);
  const training_state before(2);
  herd::checkpoint c;
  s.register_into(c);
  const std::size_t data_start = header_of(full).second;
  const std::string tensors_end = "its tensors end at byte " + std::to_string(full.size() - data_start);
  const std::pair<std::size_t, std::string> cuts[] = {
      {0, "it is 0 bytes long; it is truncated"},
      {7, "it is 7 bytes long; it is truncated"},
      {27, "its header length, " + std::to_string(data_start - 8) + " bytes, runs past its end (it is 27 bytes long)"},
      {data_start - 1, "runs past its end"},
      {data_start, tensors_end + " of its data section, which holds 0 bytes"},
      {(data_start + full.size()) / 2, tensors_end + " of its data section, which holds"},
      {full.size() - 1, tensors_end + " of its data section, which holds " + std::to_string(full.size() - 1 - data_start)}};
  for (const auto& [length, expected] : cuts) {
    write_bytes(path, std::vector<char>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(length)));
    const std::string message = error_of([&] { c.load(path); });
    INFO("length ", length, ": ", message);
    CHECK(has(message, "herd::checkpoint::load: " + path.string() + " is damaged: "));
    CHECK(has(message, expected));
    CHECK(has(message, "restore it from a backup"));
    CHECK(s.same_as(before));
  }
}

TEST_CASE("checkpoint: every flipped byte is detected before anything is written") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  save_state(path);
  const std::vector<char> good = read_bytes(path);
  training_state s(2);
  const training_state before(2);
  herd::checkpoint c;
  s.register_into(c);
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::vector<char> bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    write_bytes(path, bad);
    const std::string message = error_of([&] { c.load(path); });
    INFO("byte ", at, ": ", message);
    CHECK(has(message, "herd::checkpoint::load: " + path.string()));
    CHECK(has(message, "restore it from a backup"));  // whole: a damaged name is printed escaped
    CHECK(s.same_as(before));
  }
  // A flipped data byte fails the checksum.
  std::vector<char> bad = good;
  bad[good.size() - 20] = static_cast<char>(bad[good.size() - 20] ^ 1);
  write_bytes(path, bad);
  const std::string message = error_of([&] { c.load(path); });
  CHECK(has(message, "its checksum does not match its content"));
  CHECK(has(message, "Delete it or restore it from a backup"));
}

TEST_CASE("checkpoint: a file whose entries differ from the registered ones is refused") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  save_state(path);
  training_state s(2);
  const training_state before(2);
  std::string message;

  SUBCASE("another dtype") {
    std::vector<double> weights(37);
    herd::checkpoint c;
    c.add("weights", weights).add("activations", s.activations).add("indices", s.indices).add("raw", s.raw);
    c.add_value("epoch", s.epoch).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"weights\" differs: F32 tensor of 37 elements in the file, F64 tensor of 37 elements here"));
  }
  SUBCASE("another element count") {
    std::vector<std::int64_t> indices(6);
    herd::checkpoint c;
    c.add("weights", s.weights).add("activations", s.activations).add("indices", indices).add("raw", s.raw);
    c.add_value("epoch", s.epoch).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"indices\" differs: I64 tensor of 5 elements in the file, I64 tensor of 6 elements here"));
  }
  SUBCASE("a value of another size") {
    std::int64_t epoch = 0;
    herd::checkpoint c;
    c.add("weights", s.weights).add("activations", s.activations).add("indices", s.indices).add("raw", s.raw);
    c.add_value("epoch", epoch).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"epoch\" differs: U8 tensor of 4 elements in the file, value of 8 bytes here"));
  }
  SUBCASE("an extra and a missing entry") {
    int step = 0;
    herd::checkpoint c;
    c.add("weights", s.weights).add("activations", s.activations).add("indices", s.indices).add("raw", s.raw);
    c.add_value("step", step).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"epoch\" is in the file but not registered"));
    CHECK(has(message, "\"step\" is registered but not in the file"));
  }
  INFO(message);
  CHECK(has(message, "herd::checkpoint::load: " + path.string() + " does not match the registered entries"));
  CHECK(has(message, "Register the same entries"));
  CHECK(s.same_as(before));
}

TEST_CASE("checkpoint: bad registrations") {
  std::vector<float> a(3), b(3);
  int value = 0;
  herd::checkpoint c;
  c.add("a", a);
  std::string message = error_of([&] { c.add("a", b); });
  CHECK(has(message, "herd::checkpoint::add: an entry named \"a\" is already registered"));
  message = error_of([&] { c.add_value("a", value); });
  CHECK(has(message, "herd::checkpoint::add_value: an entry named \"a\" is already registered"));
  message = error_of([&] { c.add("", b); });
  CHECK(has(message, "herd::checkpoint::add: the name \"\" is empty, not UTF-8, or reserved"));
  herd::buffer_view on_gpu{b.data(), b.size(), herd::dtype::f32, herd::device::cuda(0)};
  message = error_of([&] { c.add("gpu", on_gpu); });
  CHECK(has(message, "the tensor \"gpu\" lives on cuda:0; a checkpoint saves host memory only"));
  message = error_of([&] { c.add("__metadata__", b); });
  CHECK(has(message, "the name \"__metadata__\" is empty, not UTF-8, or reserved"));
  message = error_of([&] { c.add("bad\xff", b); });
  CHECK(has(message, "the name \"bad\xff\" is empty, not UTF-8, or reserved. Give every entry a UTF-8 name"));
  message = error_of([&] { c.add("m", b, {2, 2}); });
  CHECK(has(message, "herd::checkpoint::add: the tensor \"m\" has 3 elements, which do not fill its shape [2, 2]"));
  // The failed registrations left the checkpoint as it was: one entry.
  c.add_value("value", value);
  CHECK_NOTHROW(c.add("b", b));
  CHECK_NOTHROW(c.add("m", b, {3, 1}));
  // A tensor resized after registration no longer fits its shape: save says so.
  b.resize(4);
  message = error_of([&] { c.save(fs::temp_directory_path() / "herd-never-written.safetensors"); });
  CHECK(has(message, "herd::checkpoint::save: the tensor \"m\" has 4 elements, which do not fill its shape [3, 1]"));
}

TEST_CASE("checkpoint: a tensor saved with a shape keeps it, and loads into tensors of any shape") {
  scratch_directory dir;
  const fs::path path = dir.path / "shaped.safetensors";
  std::vector<double> matrix = {1, 2, 3, 4, 5, 6};
  std::vector<std::int32_t> none;
  herd::checkpoint out;
  out.add("matrix", matrix, {2, 1, 3}).add("none", none, {0, 5});
  out.save(path);
  CHECK(has(header_of(read_bytes(path)).first,
            R"("matrix":{"dtype":"F64","shape":[2,1,3],"data_offsets":[0,48]},)"
            R"("none":{"dtype":"I32","shape":[0,5],"data_offsets":[48,48]}})"));
  std::vector<double> flat(6), other(6);
  std::vector<std::int32_t> empty;
  herd::checkpoint in;
  in.add("matrix", flat).add("none", empty);
  CHECK(in.load(path));
  CHECK(flat == matrix);
  herd::checkpoint transposed;
  transposed.add("matrix", other, {3, 2}).add("none", empty, {5, 0});
  CHECK(transposed.load(path));
  CHECK(other == matrix);
}

namespace {

// A tensor stored column by column, as Eigen's and Armadillo's matrices are: (i, j) at i + j * rows.
struct column_major_matrix {
  std::size_t rows, cols;
  std::vector<float> data;
  column_major_matrix(std::size_t r, std::size_t c) : rows(r), cols(c), data(r * c, -1.0f) {}
  float& at(std::size_t i, std::size_t j) { return data[i + j * rows]; }
};

}  // namespace

template <> struct herd::tensor_traits<column_major_matrix> {
  static void* data(column_major_matrix& m) { return m.data.data(); }
  static const void* data(const column_major_matrix& m) { return m.data.data(); }
  static std::size_t size(const column_major_matrix& m) { return m.data.size(); }
  static herd::dtype dtype(const column_major_matrix&) { return herd::dtype::f32; }
  static herd::device device(const column_major_matrix&) { return herd::device::cpu(); }
  static std::vector<std::size_t> column_major_shape(const column_major_matrix& m) { return {m.rows, m.cols}; }
};

TEST_CASE("checkpoint: a column-major tensor is written in row-major order, so that (i, j) is t[i][j] in the file") {
  scratch_directory dir;
  const fs::path path = dir.path / "column_major.safetensors";
  column_major_matrix m(3, 2);
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 2; ++j) m.at(i, j) = static_cast<float>(10 * i + j);
  herd::checkpoint out;
  out.add("m", m, {3, 2});
  out.save(path);
  // What a row-major reader (PyTorch, numpy, herd into a std::vector) finds: M(0,0), M(0,1), M(1,0), ...
  std::vector<float> row_major(6);
  herd::checkpoint flat;
  flat.add("m", row_major);
  REQUIRE(flat.load(path));
  CHECK(row_major == std::vector<float>{0, 1, 10, 11, 20, 21});
  // Back into a column-major matrix: the same matrix, also when the root sends it to other ranks.
  column_major_matrix back(3, 2);
  herd::checkpoint in;
  in.add("m", back);
  REQUIRE(in.load(path));
  CHECK(back.data == m.data);
  herd::local::run(2, [&](herd::local_communicator& comm) {
    column_major_matrix mine(3, 2);
    herd::checkpoint c;
    c.add("m", mine, {3, 2});
    REQUIRE(c.load(path, comm));
    CHECK(mine.data == m.data);
    c.save(dir.path / "again.safetensors", comm);
  });
  CHECK(read_bytes(dir.path / "again.safetensors") == read_bytes(path));
}

TEST_CASE("checkpoint: reordering a column-major tensor of three dimensions") {
  // A 2x3x4 tensor, (i, j, k) at i + 2j + 6k in memory, 100i + 10j + k in value.
  std::vector<int> column_major(24), row_major(24), back(24);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) column_major[static_cast<std::size_t>(i + 2 * j + 6 * k)] = 100 * i + 10 * j + k;
  herd::detail::ckpt::reorder(row_major.data(), column_major.data(), {2, 3, 4}, sizeof(int), true);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(row_major[static_cast<std::size_t>(12 * i + 4 * j + k)] == 100 * i + 10 * j + k);
  herd::detail::ckpt::reorder(back.data(), row_major.data(), {2, 3, 4}, sizeof(int), false);
  CHECK(back == column_major);
  CHECK_FALSE(herd::detail::ckpt::reorders({5, 1}));
  CHECK_FALSE(herd::detail::ckpt::reorders({1, 1, 7}));
  CHECK(herd::detail::ckpt::reorders({2, 2}));
}

TEST_CASE("checkpoint: a safetensors file from another writer loads by name") {
  scratch_directory dir;
  const fs::path path = dir.path / "foreign.safetensors";
  // Entries out of data order, white space, escapes in names, a scalar, metadata of its own.
  const std::vector<double> scale = {0.125};
  const std::vector<std::int64_t> steps = {-3, 1LL << 40};
  const std::vector<std::uint16_t> brain = {0x3f80, 0xc000, 0x0001};  // bfloat16 bits: 1, -2, tiny
  const std::vector<std::uint8_t> bytes = {7, 8, 9};
  std::vector<unsigned char> data;
  append_bytes(data, steps);
  append_bytes(data, scale);
  append_bytes(data, brain);
  append_bytes(data, bytes);
  write_safetensors(path,
                    R"({ "__metadata__" : {"format":"pt"},
  "caf\u00e9 \ud83d\ude00\t\"x\"": {"dtype":"U8", "shape":[3], "data_offsets":[30, 33]},
  "scale": {"shape": [], "dtype": "F64", "data_offsets": [16, 24]},
  "brain": {"dtype": "BF16", "shape": [3, 1], "data_offsets": [24, 30]},
  "steps": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}
}  )",
                    data);
  std::vector<double> scale_in(1);
  std::vector<std::int64_t> steps_in(2);
  std::vector<herd::bfloat16> brain_in(3);
  std::vector<std::uint8_t> bytes_in(3);
  herd::checkpoint c;
  c.add("scale", scale_in).add("steps", steps_in).add("brain", brain_in).add("caf\u00e9 \U0001F600\t\"x\"", bytes_in);
  CHECK(c.load(path));
  CHECK(scale_in == scale);
  CHECK(steps_in == steps);
  CHECK(brain_in[0].bits == brain[0]);
  CHECK(brain_in[1].bits == brain[1]);
  CHECK(brain_in[2].bits == brain[2]);
  CHECK(bytes_in == bytes);

  // Its entries must still match the registered ones: a dtype herd lacks, a shape of another size.
  write_safetensors(path,
                    R"({"odd":{"dtype":"U16","shape":[2],"data_offsets":[0,4]},)"
                    R"("grid":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]}})",
                    std::vector<unsigned char>(28));
  std::vector<herd::half> odd(2);
  std::vector<float> grid(5);
  herd::checkpoint mismatched;
  mismatched.add("odd", odd).add("grid", grid);
  const std::string message = error_of([&] { mismatched.load(path); });
  CHECK(has(message, "unsupported dtype U16 in tensor \"odd\""));  // a dtype herd lacks, named as such
  CHECK(has(message, "\"grid\" differs: F32 tensor of 6 elements in the file, F32 tensor of 5 elements here"));
}

TEST_CASE("checkpoint: a malformed safetensors file is refused as damaged, naming what is wrong") {
  scratch_directory dir;
  const fs::path path = dir.path / "malformed.safetensors";
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":)";
  const std::vector<unsigned char> eight(8, 0x3f);
  // header, data bytes, what the error says
  const std::vector<std::tuple<std::string, std::size_t, std::string>> cases = {
      {"", 0, "not valid JSON: expected '{' (at byte 0"},
      {"{", 0, "not valid JSON: expected '\"' (at byte 1 of the header)"},
      {"[]", 0, "expected '{'"},
      {"{" + a + "[0,8]}", 8, "expected '}'"},
      {"{" + a + "[0,8]}} x", 8, "unexpected text after the object (at byte"},
      {"{" + a + "[0,8]},}", 8, "expected '\"'"},
      {"{" + a + "[0,8]} \"b\":1}", 8, "expected '}'"},
      {R"({"a\q":{}})", 0, "a string holds an invalid escape"},
      {"{\"a\tb\":{}}", 0, "a string holds a control character"},
      {"{\"a\xff\":{}}", 0, "its header is not valid UTF-8"},
      {"{\"a\xc0\xaf\":{}}", 0, "its header is not valid UTF-8"},
      {R"({"a\ud800":{}})", 0, "a \\u escape is a lone surrogate"},
      {R"({"a\u12":{}})", 0, "a \\u escape needs four hex digits"},
      {"{" + a + "[-1,8]}}", 8, "expected a non-negative integer"},
      {"{" + a + "[0,8.0]}}", 8, "expected a non-negative integer"},
      {"{" + a + "[00,8]}}", 8, "expected a non-negative integer"},
      {"{" + a + "[0,99999999999999999999]}}", 8, "an integer is too large"},
      {"{" + a + "null}}", 8, "expected '['"},
      {"{" + a + "[0,8]}," + a + "[0,8]}}", 8, "its header names \"a\" twice"},
      {R"({"__metadata__":{"k":"v","k":"w"}})", 0, "its metadata repeats \"k\""},
      {R"({"__metadata__":{"k":1}})", 0, "expected '\"'"},
      {"{" + a + "[0,8],\"extra\":1}}", 8, "the tensor \"a\" has the unknown field \"extra\""},
      {R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "repeats the field \"dtype\""},
      {R"({"a":{"dtype":"F32","shape":[2]}})", 8, "needs \"dtype\", \"shape\" and \"data_offsets\""},
      {"{" + a + "[0,4,8]}}", 8, "needs \"dtype\", \"shape\" and \"data_offsets\" (two numbers)"},
      {R"({"a":{"dtype":"X32","shape":[2],"data_offsets":[0,8]}})", 8, "has the dtype \"X32\", unknown to herd"},
      {"{" + a + "[0,4]}}", 4, "has data_offsets [0, 4], which do not hold 2 elements of F32"},
      {"{" + a + "[8,0]}}", 8, "has data_offsets [8, 0], which do not hold 2 elements of F32"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8, "do not hold too many"},
      {"{" + a + "[4,12]}}", 12, "the tensor \"a\" starts at byte 4 of the data section, but the tensors before it end "
                                 "at byte 0 (a gap)"},
      {"{" + a + R"([0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})", 12,
       "the tensor \"b\" starts at byte 4 of the data section, but the tensors before it end at byte 8 (they overlap)"},
      {"{" + a + R"([0,8]},"b":{"dtype":"I32","shape":[2],"data_offsets":[12,20]}})", 20, "(a gap)"},
      {"{" + a + "[0,8]}}", 4, "its tensors end at byte 8 of its data section, which holds 4 bytes"},
      {"{" + a + "[0,8]}}", 12, "its tensors end at byte 8 of its data section, which holds 12 bytes"},
      {R"({"__metadata__":{"herd.checkpoint":"1"},)" + a + "[0,8]}}", 8,
       "its checksum does not match its content (herd.checksum \"\" is missing or not first)"},
  };
  std::vector<float> mine = {1.5f, 2.5f};
  herd::checkpoint c;
  c.add("a", mine);
  for (const auto& [header, data_bytes, expected] : cases) {
    write_safetensors(path, header, std::vector<unsigned char>(data_bytes, 0x3f));
    const std::string message = error_of([&] { c.load(path); });
    INFO(header, ": ", message);
    CHECK(has(message, "herd::checkpoint::load: " + path.string() + " is damaged: "));
    CHECK(has(message, expected));
    CHECK(mine == std::vector<float>{1.5f, 2.5f});
  }
  // A well-formed file with the same entry loads: the cases above fail for what they name.
  write_safetensors(path, "{" + a + "[0,8]}}", eight);
  CHECK(c.load(path));
  CHECK(mine[0] == 0.7470588088035583f);
}

TEST_CASE("checkpoint: a herd checkpoint of another version is refused") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  save_state(path);
  std::vector<char> bytes = read_bytes(path);
  const std::string tag = R"("herd.checkpoint":"1")";
  const std::size_t at = std::string(bytes.begin(), bytes.end()).find(tag);
  REQUIRE(at != std::string::npos);
  bytes[at + tag.size() - 2] = '2';
  fix_checksum(bytes);
  write_bytes(path, bytes);
  training_state s(2);
  herd::checkpoint c;
  s.register_into(c);
  const std::string message = error_of([&] { c.load(path); });
  CHECK(has(message, path.string() + " is a herd checkpoint of version \"2\"; this herd reads version 1"));
  CHECK(s.same_as(training_state(2)));
  // The same edit with the checksum left as it was is damage.
  bytes[at + tag.size() - 2] = '1';
  write_bytes(path, bytes);
  CHECK(has(error_of([&] { c.load(path); }), "its checksum does not match its content"));
}

TEST_CASE("checkpoint: a writer killed mid-save leaves the previous checkpoint loadable") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  save_state(path, 1);

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child saves other values and dies right after the first entry reaches the temporary file.
    training_state s(5);
    herd::checkpoint c;
    s.register_into(c);
    herd::detail::checkpoint_after_entry_hook = kill_self;
    try {
      c.save(path);
    } catch (...) {
    }
    ::_exit(3);  // only if the hook did not fire
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  const std::string temporary_prefix = path.filename().string() + ".tmp-" + std::to_string(child) + "-";
  int temporaries = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir.path))
    temporaries += e.path().filename().string().rfind(temporary_prefix, 0) == 0;
  CHECK(temporaries == 1);  // it died mid-save, not before

  training_state loaded(2);
  herd::checkpoint c;
  loaded.register_into(c);
  CHECK(c.load(path));
  CHECK(loaded.same_as(training_state(1)));
}

TEST_CASE("checkpoint: a save leaves other writers' temporary files alone") {
  // Another host's writer of the same path on a shared file system can have this process's pid.
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  fs::path other = path;
  other += ".tmp-" + std::to_string(::getpid());
  const std::vector<char> theirs{'t', 'h', 'e', 'i', 'r', 's'};
  write_bytes(other, theirs);
  save_state(path, 1);
  CHECK(read_bytes(other) == theirs);
  training_state loaded(2);
  herd::checkpoint c;
  loaded.register_into(c);
  CHECK(c.load(path));
  CHECK(loaded.same_as(training_state(1)));
  int files = 0;
  for ([[maybe_unused]] const fs::directory_entry& e : fs::directory_iterator(dir.path)) ++files;
  CHECK(files == 2);  // the checkpoint and the other writer's file: no temporary of this save left
}

TEST_CASE("checkpoint: save and load over a communicator give every rank the root's values") {
  for (int root : {0, 2}) {
    INFO("root ", root);
    scratch_directory dir;
    const fs::path path = dir.path / "state.safetensors";
    std::vector<int> matches(3, 0);
    std::vector<int> missing(3, 0);
    herd::local::run(3, [&](herd::local_communicator& comm) {
      training_state s(10 + comm.rank());
      herd::checkpoint c;
      s.register_into(c);
      missing[static_cast<std::size_t>(comm.rank())] = !c.load(path, comm, root);
      c.save(path, comm, root);
      s.fill(20 + comm.rank());
      if (c.load(path, comm, root))
        matches[static_cast<std::size_t>(comm.rank())] = s.same_as(training_state(10 + root));
    });
    CHECK(missing == std::vector<int>{1, 1, 1});
    CHECK(matches == std::vector<int>{1, 1, 1});
    CHECK(fs::exists(path));
  }
}

TEST_CASE("checkpoint: a damaged file, a mismatch on one rank, a failed write raise on every rank") {
  for (int root : {0, 2}) {
    INFO("root ", root);
    scratch_directory dir;
    const fs::path path = dir.path / "state.safetensors";
    save_state(path);
    std::vector<char> bytes = read_bytes(path);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x40);
    write_bytes(path, bytes);

    std::vector<std::string> messages(3);
    std::vector<int> untouched(3, 0);
    herd::local::run(3, [&](herd::local_communicator& comm) {
      training_state s(7);
      herd::checkpoint c;
      s.register_into(c);
      messages[static_cast<std::size_t>(comm.rank())] = error_of([&] { c.load(path, comm, root); });
      untouched[static_cast<std::size_t>(comm.rank())] = s.same_as(training_state(7));
    });
    for (std::size_t r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", messages[r]);
      CHECK(has(messages[r], "herd::checkpoint::load on rank " + std::to_string(r) + " of 3"));
      CHECK(has(messages[r], path.string() + " is damaged"));
      CHECK(has(messages[r], "restore it from a backup"));
      if (static_cast<int>(r) != root) CHECK(has(messages[r], "rank " + std::to_string(root) + ", which reads"));
      CHECK(untouched[r] == 1);
    }

    // Rank 1 registers a longer tensor than the file holds: every rank stops, nothing is written.
    save_state(path);
    herd::local::run(3, [&](herd::local_communicator& comm) {
      training_state s(7);
      if (comm.rank() == 1) s.weights.resize(40);
      herd::checkpoint c;
      s.register_into(c);
      messages[static_cast<std::size_t>(comm.rank())] = error_of([&] { c.load(path, comm, root); });
      untouched[static_cast<std::size_t>(comm.rank())] = s.weights[0] == training_state(7).weights[0];
    });
    for (std::size_t r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", messages[r]);
      CHECK(has(messages[r], "herd::checkpoint::load on rank " + std::to_string(r) + " of 3"));
      CHECK(has(messages[r], r == 1 ? "\"weights\" differs: F32 tensor of 37 elements in the file, F32 tensor of 40"
                                    : "rank 1's registered entries do not match " + path.string()));
      CHECK(untouched[r] == 1);
    }

    // Root cannot write into a directory that does not exist.
    const fs::path unwritable = dir.path / "no-such-directory" / "state.herd";
    herd::local::run(3, [&](herd::local_communicator& comm) {
      training_state s(7);
      herd::checkpoint c;
      s.register_into(c);
      messages[static_cast<std::size_t>(comm.rank())] = error_of([&] { c.save(unwritable, comm, root); });
    });
    for (std::size_t r = 0; r < 3; ++r) {
      INFO("rank ", r, ": ", messages[r]);
      CHECK(has(messages[r], "herd::checkpoint::save on rank " + std::to_string(r) + " of 3"));
      CHECK(has(messages[r], "cannot create the temporary file"));
      CHECK(has(messages[r], "Check that the directory of " + unwritable.string()));
    }
  }
}

TEST_CASE("checkpoint keeps buffer_views by value and registers an optimizer's whole state") {
  const auto dir = std::filesystem::temp_directory_path() / ("herd-ckpt-state-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "state.safetensors";
  std::vector<float> w = {1.0f, 2.0f}, g = {0.5f, 0.5f};
  herd::sgd sgd(herd::views(w), herd::views(g), {.lr = 0.1, .momentum = 0.9});
  sgd.step();
  {
    herd::checkpoint saved;
    saved.add("w", herd::view_of(w));  // a temporary view: kept by value
    saved.add_optimizer_state("sgd.", sgd);
    saved.save(path);
  }
  std::vector<float> w2(2), g2(2);
  herd::sgd fresh(herd::views(w2), herd::views(g2), {.lr = 0.1, .momentum = 0.9});
  herd::checkpoint loaded;
  loaded.add("w", herd::view_of(w2)).add_optimizer_state("sgd.", fresh);
  CHECK(loaded.load(path));
  CHECK(w2 == w);
  CHECK(fresh.steps() == 1);
  // Same state and gradients: the next steps agree exactly.
  g2 = g;
  sgd.step();
  fresh.step();
  CHECK(w2 == w);
  std::filesystem::remove_all(dir);
}

TEST_CASE("checkpoint: strict off loads the entries both sides have and lists the rest, on every rank") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.safetensors";
  {
    std::vector<float> a = {1, 2, 3};
    std::vector<std::int64_t> counter = {42};
    herd::checkpoint c;
    c.add("a", a).add("num_batches_tracked", counter);
    c.save(path);
  }
  std::vector<std::string> errors(3);
  herd::local::run(3, [&](herd::local_communicator& comm) {
    std::vector<float> a(3), extra(2, 5.0f);
    herd::checkpoint c;
    c.add("a", a).add("extra", extra).set_strict(false);
    CHECK(c.load(path, comm, 1));
    CHECK(a == std::vector<float>{1, 2, 3});
    CHECK(extra == std::vector<float>{5, 5});
    CHECK(c.missing_keys() == std::vector<std::string>{"extra"});
    CHECK(c.unexpected_keys() == std::vector<std::string>{"num_batches_tracked"});
    // Strict, the same registration is refused, naming both differences.
    const std::string strict = error_of([&] { c.set_strict(true).load(path, comm); });
    CHECK(has(strict, "\"num_batches_tracked\" is in the file but not registered"));
    CHECK(has(strict, "\"extra\" is registered but not in the file"));
    // Ranks that would load different entries are stopped, every one of them.
    std::vector<float> b(3);
    herd::checkpoint differs;
    if (comm.rank() == 2) differs.add("b", b);
    else differs.add("a", b);
    differs.set_strict(false);
    errors[static_cast<std::size_t>(comm.rank())] = error_of([&] { differs.load(path, comm); });
  });
  for (const auto& e : errors) CHECK(has(e, "the ranks' registered entries match different tensors"));

  // The same entries registered in another order on each rank load alike (strict or not).
  herd::local::run(3, [&](herd::local_communicator& comm) {
    for (const bool strict : {false, true}) {
      std::vector<float> a(3);
      std::vector<std::int64_t> counter(1);
      herd::checkpoint c;
      if (comm.rank() == 1) c.add("num_batches_tracked", counter).add("a", a);
      else c.add("a", a).add("num_batches_tracked", counter);
      c.set_strict(strict);
      INFO("rank ", comm.rank(), ", strict ", strict);
      CHECK_NOTHROW(CHECK(c.load(path, comm)));
      CHECK(a == std::vector<float>{1, 2, 3});
      CHECK(counter == std::vector<std::int64_t>{42});
    }
  });
}

TEST_CASE("checkpoint: a registered entry of a safetensors dtype herd lacks is refused by name, not as damaged") {
  scratch_directory dir;
  const fs::path path = dir.path / "complex.safetensors";
  write_safetensors(path, R"({"z":{"dtype":"C64","shape":[2],"data_offsets":[0,16]},"ok":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
                    std::vector<unsigned char>(20, 0));
  std::vector<float> z(4), ok(1, 3.0f);
  herd::checkpoint c;
  c.add("z", z);
  const std::string message = error_of([&] { c.load(path); });
  CHECK(has(message, "unsupported dtype C64 in tensor \"z\""));
  CHECK_FALSE(has(message, "damaged"));
  herd::checkpoint partial;
  partial.add("ok", ok).set_strict(false);
  CHECK(partial.load(path));
  CHECK(ok[0] == 0.0f);
  CHECK(partial.unexpected_keys() == std::vector<std::string>{"z"});

  // The 8-bit floats of AMD's convention and the sub-byte floats (F4: two a byte, F6: four in three
  // bytes), which safetensors 0.8 writes, are tensors herd lacks, not damage.
  const fs::path packed = dir.path / "packed.safetensors";
  write_safetensors(packed, R"({"q":{"dtype":"F8_E4M3FNUZ","shape":[4],"data_offsets":[0,4]},"r":{"dtype":"F8_E5M2FNUZ","shape":[2],"data_offsets":[4,6]},"f4":{"dtype":"F4","shape":[2,3],"data_offsets":[6,9]},"f6":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[9,12]},"ok":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                    std::vector<unsigned char>(16, 0));
  herd::checkpoint fp8;
  ok[0] = 3.0f;
  fp8.add("ok", ok).set_strict(false);
  CHECK(fp8.load(packed));
  CHECK(ok[0] == 0.0f);
  CHECK(fp8.unexpected_keys() == std::vector<std::string>{"q", "r", "f4", "f6"});  // in the file's order
  std::vector<std::uint8_t> q(4);
  herd::checkpoint wants_q;
  wants_q.add("q", q).set_strict(false);
  const std::string refused = error_of([&] { wants_q.load(packed); });
  CHECK(has(refused, "unsupported dtype F8_E4M3FNUZ in tensor \"q\""));
  CHECK_FALSE(has(refused, "damaged"));
  // An F4 tensor of an odd count cannot fill whole bytes: that is damage.
  const fs::path odd = dir.path / "odd.safetensors";
  write_safetensors(odd, R"({"f4":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", std::vector<unsigned char>(2, 0));
  herd::checkpoint none;
  none.set_strict(false);
  CHECK(has(error_of([&] { none.load(odd); }), "damaged"));
}
