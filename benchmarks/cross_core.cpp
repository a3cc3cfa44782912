// What moving bytes between two cores costs, the floor under every allreduce through shared memory:
//
//   build/benchmarks/cross_core [--min-bytes 16384] [--max-bytes 4194304] [--iters 2000]
//                               [--writer memset|stream]
//
// Two processes, pinned to cores 0 and 1, share one anonymous mapping and take turns on it. For
// each size, µs per pass over the bytes (medians of --iters turns):
//   read fresh:   memcpy out of lines the other core has just written (they are in its cache)
//   read again:   the same memcpy at once after, the lines now in this core's cache as well
//   write shared: memset over lines the other core has read (it holds copies; each store waits
//                 for them to be invalidated)
//   write own:    memset over lines no other core holds (a buffer private to the writer)
// "read fresh" and "write shared" are the two ways a line crosses between cores. An allreduce at
// 2 ranks that reuses its buffers pays both for each line it exchanges: a rank reads its peer's
// new data, and its next write to a line the peer has read must take the peer's copy away first.
// --writer stream has the other core write with non-temporal stores (x86 SSE2 movntdq, then a
// fence), which skip the read for ownership and leave the lines in memory rather than in its
// cache: whether that makes either crossing cheaper (on the 2-vCPU VM it did not).
// Linux only (fork, sched_setaffinity); needs 2 cores.

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

bool pin(std::size_t core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

// The writer's pass: memset, or non-temporal 16-byte stores (bytes a multiple of 16, p aligned).
bool g_stream = false;
void write_pass(std::byte* p, int value, std::size_t bytes) {
#if defined(__SSE2__)
  if (g_stream) {
    const __m128i v = _mm_set1_epi8(static_cast<char>(value));
    for (std::size_t i = 0; i < bytes; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), v);
    _mm_sfence();
    return;
  }
#endif
  std::memset(p, value, bytes);
}

struct turns {
  std::atomic<long> step{0};
  double last_write = 0;  // the writer's time for its last pass, read once it published the step
};

// One size: the child writes the shared buffer on odd steps, the parent reads it on even ones.
void measure(std::size_t bytes, int iters) {
  const std::size_t page = 4096;
  const std::size_t control = page;
  auto* mapping = static_cast<std::byte*>(
      mmap(nullptr, control + bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (mapping == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* t = new (mapping) turns;
  std::byte* shared = mapping + control;
  std::memset(shared, 0, bytes);
  const pid_t child = fork();
  if (child == 0) {
    if (!pin(1)) _exit(2);
    for (long i = 1; i <= iters; ++i) {
      while (t->step.load(std::memory_order_acquire) != 2 * i - 2) {
      }
      const double start = now();
      write_pass(shared, static_cast<int>(i & 0xff), bytes);
      t->last_write = now() - start;
      t->step.store(2 * i - 1, std::memory_order_release);
    }
    _exit(0);
  }
  if (!pin(0)) {
    std::fprintf(stderr, "cross_core: cannot pin to core 0\n");
    std::exit(1);
  }
  std::vector<std::byte> local(bytes);
  std::vector<std::byte> own(bytes);
  std::vector<double> fresh, again, write_shared, write_own;
  for (long i = 1; i <= iters; ++i) {
    while (t->step.load(std::memory_order_acquire) != 2 * i - 1) {
    }
    if (i > 1) write_shared.push_back(t->last_write);
    double start = now();
    std::memcpy(local.data(), shared, bytes);
    fresh.push_back(now() - start);
    start = now();
    std::memcpy(local.data(), shared, bytes);
    again.push_back(now() - start);
    // The writer's memset wrote lines this core had read: a check that the bytes were new.
    if (local[0] != static_cast<std::byte>(i & 0xff) || local[bytes - 1] != static_cast<std::byte>(i & 0xff)) {
      std::fprintf(stderr, "cross_core: read old bytes at turn %ld\n", i);
      std::exit(1);
    }
    start = now();
    std::memset(own.data(), static_cast<int>(i & 0xff), bytes);
    write_own.push_back(now() - start);
    t->step.store(2 * i, std::memory_order_release);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "cross_core: the writer failed (cannot pin to core 1?)\n");
    std::exit(1);
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  const double f = median(fresh), a = median(again), ws = median(write_shared), wo = median(write_own);
  std::printf("  %12zu | %9.2f %7.1f | %9.2f %7.1f | %9.2f %7.1f | %9.2f %7.1f\n", bytes, f * 1e6, gb / f, a * 1e6, gb / a,
              ws * 1e6, gb / ws, wo * 1e6, gb / wo);
  std::fflush(stdout);
  munmap(mapping, control + bytes);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t min_bytes = 16384;
  std::size_t max_bytes = 4194304;
  int iters = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string word = argv[i + 1];
    const unsigned long long value = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--min-bytes") min_bytes = value;
    else if (flag == "--max-bytes") max_bytes = value;
    else if (flag == "--iters") iters = static_cast<int>(value);
    else if (flag == "--writer" && (word == "memset" || word == "stream")) g_stream = word == "stream";
    else {
      std::fprintf(stderr, "usage: cross_core [--min-bytes B] [--max-bytes B] [--iters N] [--writer memset|stream]\n");
      return 2;
    }
  }
  if (min_bytes == 0 || min_bytes % 16 != 0 || iters < 1) {
    std::fprintf(stderr, "cross_core: --min-bytes must be a positive multiple of 16, --iters positive\n");
    return 2;
  }
#if !defined(__SSE2__)
  if (g_stream) {
    std::fprintf(stderr, "cross_core: --writer stream needs x86 SSE2\n");
    return 2;
  }
#endif
  std::printf("# cross_core: cores 0 and 1, us per pass and GB/s, medians of %d turns; the writer: %s\n", iters,
              g_stream ? "non-temporal stores" : "memset");
  std::printf("# %12s | %17s | %17s | %17s | %17s\n", "bytes", "read fresh", "read again", "write shared", "write own");
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) measure(bytes, iters);
}
