// herd::checkpoint: round trips, damaged and mismatching files refused before anything is
// written, a writer killed mid-save leaving the previous checkpoint loadable, and the
// communicator variants on threads (root's values everywhere, errors on every rank).

#include <herd/comm/local.hpp>
#include <herd/core/half.hpp>
#include <herd/optim/checkpoint.hpp>
#include <herd/optim/sgd.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

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

// The message of the herd::error that fn raises ("" if none).
template <class Fn> std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const herd::error& e) {
    return e.what();
  }
  return "";
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
  const fs::path path = dir.path / "state.herd";
  training_state saved(1);
  herd::checkpoint out;
  saved.register_into(out);
  out.save(path);

  const std::vector<char> bytes = read_bytes(path);
  REQUIRE(bytes.size() > 8);
  CHECK(std::string(bytes.data(), 8) == "HERDCKPT");

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
    CHECK(e.path().filename() == "state.herd");
  }
  CHECK(files == 1);

  // An empty checkpoint and empty tensors are valid too.
  herd::checkpoint empty;
  empty.save(dir.path / "empty.herd");
  CHECK(empty.load(dir.path / "empty.herd"));
  std::vector<double> nothing;
  herd::checkpoint holds_empty;
  holds_empty.add("nothing", nothing);
  holds_empty.save(dir.path / "nothing.herd");
  CHECK(holds_empty.load(dir.path / "nothing.herd"));
}

TEST_CASE("checkpoint: a missing file loads as false and touches nothing") {
  scratch_directory dir;
  training_state s(4);
  const training_state before(4);
  herd::checkpoint c;
  s.register_into(c);
  CHECK(!c.load(dir.path / "never-saved.herd"));
  CHECK(s.same_as(before));
}

TEST_CASE("checkpoint: a truncated file raises herd::error naming the path, and writes nothing") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.herd";
  save_state(path);
  const std::vector<char> full = read_bytes(path);
  training_state s(2);
  const training_state before(2);
  herd::checkpoint c;
  s.register_into(c);
  for (std::size_t length : {std::size_t{0}, std::size_t{7}, std::size_t{27}, std::size_t{40}, full.size() / 2,
                             full.size() - 9, full.size() - 8, full.size() - 1}) {
    write_bytes(path, std::vector<char>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(length)));
    const std::string message = error_of([&] { c.load(path); });
    INFO("length ", length, ": ", message);
    CHECK(has(message, "herd::checkpoint::load: " + path.string() + " is damaged"));
    CHECK(has(message, "restore it from a backup"));
    CHECK(s.same_as(before));
  }
}

TEST_CASE("checkpoint: every flipped byte is detected before anything is written") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.herd";
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
  const fs::path path = dir.path / "state.herd";
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
    CHECK(has(message, "\"weights\" differs: f32 tensor of 37 elements in the file, f64 tensor of 37 elements here"));
  }
  SUBCASE("another element count") {
    std::vector<std::int64_t> indices(6);
    herd::checkpoint c;
    c.add("weights", s.weights).add("activations", s.activations).add("indices", indices).add("raw", s.raw);
    c.add_value("epoch", s.epoch).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"indices\" differs: i64 tensor of 5 elements in the file, i64 tensor of 6 elements here"));
  }
  SUBCASE("a value of another size") {
    std::int64_t epoch = 0;
    herd::checkpoint c;
    c.add("weights", s.weights).add("activations", s.activations).add("indices", s.indices).add("raw", s.raw);
    c.add_value("epoch", epoch).add_value("learning_rate", s.learning_rate).add_value("rng", s.rng);
    message = error_of([&] { c.load(path); });
    CHECK(has(message, "\"epoch\" differs: value of 4 bytes in the file, value of 8 bytes here"));
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
  CHECK(has(message, "the name is empty"));
  herd::buffer_view on_gpu{b.data(), b.size(), herd::dtype::f32, herd::device::cuda(0)};
  message = error_of([&] { c.add("gpu", on_gpu); });
  CHECK(has(message, "the tensor \"gpu\" lives on cuda:0; a checkpoint saves host memory only"));
  // The failed registrations left the checkpoint as it was: one entry.
  c.add_value("value", value);
  CHECK_NOTHROW(c.add("b", b));
}

TEST_CASE("checkpoint: a writer killed mid-save leaves the previous checkpoint loadable") {
  scratch_directory dir;
  const fs::path path = dir.path / "state.herd";
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
  fs::path temporary = path;
  temporary += ".tmp-" + std::to_string(child);
  CHECK(fs::exists(temporary));  // it died mid-save, not before

  training_state loaded(2);
  herd::checkpoint c;
  loaded.register_into(c);
  CHECK(c.load(path));
  CHECK(loaded.same_as(training_state(1)));
}

TEST_CASE("checkpoint: save and load over a communicator give every rank the root's values") {
  for (int root : {0, 2}) {
    INFO("root ", root);
    scratch_directory dir;
    const fs::path path = dir.path / "state.herd";
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
    const fs::path path = dir.path / "state.herd";
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
      CHECK(has(messages[r], r == 1 ? "\"weights\" differs: f32 tensor of 37 elements in the file, f32 tensor of 40"
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
  const auto path = dir / "state.ckpt";
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
