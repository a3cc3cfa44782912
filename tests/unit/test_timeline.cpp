// herd::timeline: the file's name and lifetime, and the events of operations on threads. (Two MPI
// ranks of examples/fashion_mnist are checked as JSON by tests/support/check_timeline.py.)

#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/comm/local.hpp>
#include <herd/runtime/timeline.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

std::filesystem::path scratch_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("herd_timeline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::string> lines_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The number after "key": on an event line, or -1.
long long number_of(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  return std::stoll(line.substr(at + key.size() + 3));
}

bool is(const std::string& line, const std::string& name, char phase) {
  return line.find("{\"name\":\"" + name + "\"") == 0 && line.find(std::string("\"ph\":\"") + phase + "\"") != std::string::npos;
}

}  // namespace

TEST_CASE("the timeline's file carries the rank; a file that cannot be opened is an error that says which") {
  CHECK(herd::detail::trace::rank_file("/x/run.json", 3) == "/x/run.rank3.json");
  CHECK(herd::detail::trace::rank_file("/x/run", 0) == "/x/run.rank0.json");
  CHECK(herd::detail::trace::rank_file("run.trace", 12) == "run.rank12.trace");
  CHECK_FALSE(herd::timeline::active());
  try {
    herd::timeline::start("/nonexistent-directory/t.json", 0);
    FAIL("no error for a file in a directory that does not exist");
  } catch (const herd::error& e) {
    CHECK(std::string(e.what()).find("/nonexistent-directory/t.rank0.json") != std::string::npos);
    CHECK(std::string(e.what()).find("directory that exists") != std::string::npos);
  }
  CHECK_FALSE(herd::timeline::active());
  CHECK_FALSE(herd::detail::trace::on());
}

TEST_CASE("a timeline of three ranks on threads: every operation on its rank's track, with its phases") {
  const auto dir = scratch_dir();
  herd::timeline::start(dir / "threads.json", 5);
  CHECK(herd::timeline::active());
  CHECK(herd::timeline::file() == dir / "threads.rank5.json");
  constexpr int ops_per_rank = 4;
  herd::local::run(3, [](herd::local_communicator& comm) {
    std::vector<float> small(16, 1.0f);
    std::vector<float> large(100000, 1.0f);  // beyond the agreement's payload: the ring
    herd::allreduce(small, comm);
    herd::allreduce(large, comm);
    herd::handle h = herd::allreduce_async(large, comm, herd::reduce_op::avg);
    h.wait();
    herd::broadcast(small, comm, 1);
  });
  herd::timeline::stop();
  CHECK_FALSE(herd::timeline::active());
  CHECK_FALSE(herd::detail::trace::on());

  const auto lines = lines_of(dir / "threads.rank5.json");
  REQUIRE(lines.size() > 10);
  CHECK(lines.front() == "[");
  CHECK(lines.back() == "]");  // complete JSON once stopped
  CHECK(lines[1].find("\"args\":{\"name\":\"rank 5\"}") != std::string::npos);

  // Three communicator tracks, named by rank, each with operations #0..#ops_per_rank.
  std::map<long long, std::string> names;
  std::map<long long, std::set<long long>> seqs;
  std::map<std::string, int> phases;
  int async_begins = 0, async_ends = 0;
  for (const auto& line : lines) {
    if (is(line, "thread_name", 'M')) {
      const auto at = line.find("\"args\":{\"name\":\"") + 16;
      names[number_of(line, "tid")] = line.substr(at, line.find('"', at) - at);
    }
    for (const char* op : {"communicator creation", "allreduce", "broadcast"}) {
      if (is(line, op, 'X')) seqs[number_of(line, "tid")].insert(number_of(line, "seq"));
    }
    for (const char* phase : {"agreement", "ring reduce-scatter", "ring allgather", "reduction", "wait to receive"}) {
      if (is(line, phase, 'X')) ++phases[phase];
    }
    if (is(line, "allreduce", 'b')) ++async_begins;
    if (is(line, "allreduce", 'e')) ++async_ends;
  }
  REQUIRE(seqs.size() == 3);
  std::set<std::string> ranks_named;
  for (const auto& [tid, numbers] : seqs) {
    CHECK(numbers == std::set<long long>{0, 1, 2, 3, 4});
    REQUIRE(names.count(tid) == 1);
    CHECK(names[tid].find(" of 3") != std::string::npos);
    ranks_named.insert(names[tid].substr(names[tid].find("rank ")));
  }
  CHECK(ranks_named == std::set<std::string>{"rank 0 of 3", "rank 1 of 3", "rank 2 of 3"});
  CHECK(phases["agreement"] >= 3 * ops_per_rank);
  CHECK(phases["ring reduce-scatter"] == 3 * 2);  // the two large allreduces on every rank
  CHECK(phases["ring allgather"] == 3 * 2);
  CHECK(phases["reduction"] >= 3 * 3);
  CHECK(async_begins == 3);
  CHECK(async_ends == 3);
  // The typed operations say what they moved.
  bool described = false;
  for (const auto& line : lines) {
    if (is(line, "allreduce", 'X') && line.find("\"count\":100000,\"dtype\":\"f32\",\"bytes\":400000") != std::string::npos) {
      described = true;
    }
  }
  CHECK(described);

  // Off again: operations write nothing more.
  const auto size = std::filesystem::file_size(dir / "threads.rank5.json");
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> v(8, 1.0f);
    herd::allreduce(v, comm);
  });
  CHECK(std::filesystem::file_size(dir / "threads.rank5.json") == size);
  std::filesystem::remove_all(dir);
}
