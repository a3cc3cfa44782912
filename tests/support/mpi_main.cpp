// doctest's main for tests run under mpiexec.
// - Tests are named "... [ranks>=N]"; those needing more ranks than launched are filtered out,
//   so doctest counts them as skipped rather than passed. Those of the test suite "one process"
//   (threads as ranks, or no communicator) run only when one rank is launched.
// - Rank 0 prints the usual report and the summary; every other rank prints only its failures,
//   each line prefixed with "[rank k]".
// - A failure on any rank fails every rank's exit code.
// - With HERD_TEST_RANK_OUTPUT=PREFIX, each rank writes its output to the file PREFIX.<rank>
//   instead: output that ranks write at once into one stream can cut each other's lines apart,
//   so a check that reads one rank's lines reads them from that rank's own file.
// It starts MPI itself, so that it tests herd rather than relies on it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <streambuf>
#include <string>

// Defined by the programs that link herd's engine (support/engine.cpp): ends herd's threads before
// MPI_Finalize, as herd::mpi::finalize() does (MPI forbids other threads' calls while it runs). This
// file includes no herd header, so that the single-header and header-only programs share it.
extern "C" __attribute__((weak)) void herd_test_before_finalize();

namespace {

// Prefixes every line written through it with "[rank k] ".
class prefix_buffer : public std::streambuf {
 public:
  prefix_buffer(std::streambuf* target, std::string prefix) : target_(target), prefix_(std::move(prefix)) {}

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    if (at_line_start_) target_->sputn(prefix_.data(), static_cast<std::streamsize>(prefix_.size()));
    at_line_start_ = c == '\n';
    return target_->sputc(static_cast<char>(c));
  }
  int sync() override { return target_->pubsync(); }

 private:
  std::streambuf* target_;
  std::string prefix_;
  bool at_line_start_ = true;
};

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

prefix_buffer& rank_buffer() {
  static prefix_buffer buffer(std::cout.rdbuf(), "[rank " + std::to_string(world_rank()) + "] ");
  return buffer;
}

std::ostream& rank_stream() {
  static std::ostream stream(&rank_buffer());
  return stream;
}

// The console reporter without its intro and summary: failures only, prefixed by rank.
struct rank_reporter : doctest::ConsoleReporter {
  explicit rank_reporter(const doctest::ContextOptions& options) : ConsoleReporter(options, rank_stream()) {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override { rank_stream().flush(); }
};

}  // namespace

DOCTEST_REGISTER_REPORTER("herd_rank", 1, rank_reporter);

#if !defined(HERD_MPI_DOCTEST_MAIN_NAME)
#define HERD_MPI_DOCTEST_MAIN_NAME main
#endif

int HERD_MPI_DOCTEST_MAIN_NAME(int argc, char** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);  // a main in front of this one (gpu_main.cpp) may have started MPI
  if (initialized == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  if (const char* prefix = std::getenv("HERD_TEST_RANK_OUTPUT"); prefix != nullptr && *prefix != '\0') {
    const std::string path = std::string(prefix) + "." + std::to_string(rank);
    if (std::freopen(path.c_str(), "w", stdout) == nullptr || std::freopen(path.c_str(), "a", stderr) == nullptr) {
      std::fprintf(stderr, "[herd] rank %d: cannot write its output to %s\n", rank, path.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    std::setvbuf(stderr, nullptr, _IONBF, 0);
  }

  doctest::Context context;
  context.applyCommandLine(argc, argv);
  std::string too_many;
  for (int needed = size + 1; needed <= 64; ++needed) too_many += "*[ranks>=" + std::to_string(needed) + "]*,";
  context.addFilter("test-case-exclude", too_many.c_str());
  if (size > 1) context.addFilter("test-suite-exclude", "one process");
  if (rank != 0) {
    context.setOption("reporters", "herd_rank");
    context.setOption("minimal", true);
  }
  const int result = context.run();

  int failed_here = result != 0 ? 1 : 0;
  int failed_ranks = 0;
  MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("[herd] %d rank%s ran these tests; %d failed%s\n", size, size == 1 ? "" : "s", failed_ranks,
                failed_ranks ? " (each failing rank printed its failures above)" : "");
    std::fflush(stdout);
  }
  if (herd_test_before_finalize != nullptr) herd_test_before_finalize();
  MPI_Finalize();
  if (context.shouldExit()) return result;
  return failed_ranks == 0 ? 0 : 1;
}
