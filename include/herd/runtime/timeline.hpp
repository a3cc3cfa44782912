#ifndef HERD_RUNTIME_TIMELINE_HPP
#define HERD_RUNTIME_TIMELINE_HPP
// herd::timeline: where a run's time goes, as Chrome trace-event JSON that Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   HERD_TIMELINE=/tmp/run.json mpiexec -n 2 ./train     // from the first communicator to exit
//   herd::timeline::start("/tmp/run.json"); ... herd::timeline::stop();   // or a stretch of it
//
// Every process writes a file of its own: /tmp/run.json becomes /tmp/run.rank0.json,
// /tmp/run.rank1.json, ... (the rank named by the launcher: PMI_RANK, OMPI_COMM_WORLD_RANK,
// PMIX_RANK or SLURM_PROCID). One file per process rather than one gathered on rank 0, because
// a timeline is wanted most when a run hangs or dies, when no gather at the end would happen; each
// file is written as the run goes (at most a fraction of a second behind) and stays loadable
// after a crash (the trace format allows the closing bracket to be missing); and recording sends
// no message of its own, so it does not change the communication it shows. Perfetto opens the
// ranks' files together ("Open multiple trace files") on one time axis: the times are the system
// clock's, in microseconds since 2025-01-01 UTC.
//
// In a file: a process per rank, a track per communicator (and one per distributed optimizer), on
// which each operation is a slice named by its kind with its sequence number, dtype, element
// count and bytes, holding its phases: the agreement, the waits for peers, the reductions, the
// copies in and out of shared memory; asynchronous operations also appear from submission to
// completion; the distributed optimizer's steps, packing, bucket launches and unpacking on its own.
//
// Cost: when off, a relaxed atomic load where an event could start. When on, an event is queued in
// memory (a clock read and a short lock) and a thread of the timeline's own formats and writes
// batches; at most 262144 events wait, beyond which events are counted and dropped (the file says
// how many), so memory stays bounded whatever the run.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace herd::detail::trace {

// What an event says beyond its name and time (shown as its arguments).
struct fields {
  static constexpr std::uint64_t none = ~std::uint64_t{0};
  std::uint64_t seq = none;    // the operation's sequence number
  std::uint64_t count = none;  // elements
  dtype type = dtype::u8;
  bool typed = false;
  const char* extra_name = nullptr;  // one more number: "peer", "bucket", "step"...
  std::int64_t extra = 0;

  static fields elements(std::size_t n, dtype t) noexcept {
    fields f;
    f.count = n;
    f.type = t;
    f.typed = true;
    return f;
  }
};

struct event {
  std::int64_t begin_ns = 0;  // on the steady clock since the timeline's origin
  std::int64_t end_ns = 0;
  const char* name = "";  // a string literal
  std::uint64_t id = 0;   // pairs an asynchronous begin with its end
  std::uint32_t track = 0;
  char phase = 'X';  // X: a slice; b, e: an asynchronous span's ends; i: an instant
  fields args;
};

inline std::atomic<bool>& enabled() noexcept {
  static std::atomic<bool> flag{false};
  return flag;
}
// Whether events are recorded now: the one check on every path when the timeline is off.
inline bool on() noexcept { return enabled().load(std::memory_order_relaxed); }

inline std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A track: one per communicator and per distributed optimizer, numbered in the process.
inline std::uint32_t new_track() noexcept {
  static std::atomic<std::uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// This process's rank as its launcher tells it (0 when none does).
HERD_SEPARATE int launcher_rank() noexcept;

// /tmp/run.json -> /tmp/run.rank3.json
HERD_SEPARATE std::filesystem::path rank_file(const std::filesystem::path& path, int rank);

class recorder {
 public:
  static constexpr std::size_t max_waiting = std::size_t{1} << 18;
  static constexpr std::size_t batch = 8192;

  static recorder& instance();
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;
  ~recorder() { stop(); }

  // Opens `file` (after closing the one open) and starts recording into it.
  void start(const std::filesystem::path& file, int rank);

  // Writes what waits, closes the file; a no-op when none is open.
  void stop() noexcept;

  bool active() const;
  std::filesystem::path file() const;

  void record(const event& e);

  // Names a track (a communicator's "rank 1 of 4"), once per track for all files to come.
  void name_track(std::uint32_t track, std::string name);

 private:
  recorder() = default;

  void write_loop();

  void write_name(std::FILE* out, std::uint32_t track, const std::string& name) const;

  // Microseconds with three decimals, from integer nanoseconds (a double would round them).
  static void print_us(char* out, std::size_t size, std::int64_t ns);

  void write(std::FILE* out, const event& e) const;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::FILE* out_ = nullptr;
  std::filesystem::path file_;
  int rank_ = 0;
  std::int64_t origin_ns_ = 0;
  std::vector<event> waiting_;
  std::uint64_t dropped_ = 0;
  std::map<std::uint32_t, std::string> names_;
  std::vector<std::pair<std::uint32_t, std::string>> unwritten_names_;
  bool stopping_ = false;
  std::thread writer_;
};

// A slice on `track` from construction to destruction, recorded if the timeline was on at its
// start (and `name`, a string literal, is not null).
class span {
 public:
  span(std::uint32_t track, const char* name, fields args = {}) noexcept {
    if (!on() || name == nullptr) return;
    std::construct_at(&event_, event{now_ns(), 0, name, 0, track, 'X', args});
    live_ = true;
  }
  span(const span&) = delete;
  span& operator=(const span&) = delete;
  ~span() {
    if (!live_) return;
    event_.end_ns = now_ns();
    try {
      recorder::instance().record(event_);
    } catch (...) {
    }
  }

 private:
  union {
    event event_;  // written only when the span is live: nothing to initialize when off
  };
  bool live_ = false;
};

// Identifies an operation's asynchronous span in the process.
inline std::uint64_t async_id(std::uint32_t track, std::uint64_t seq) noexcept {
  return (std::uint64_t{track} << 40) ^ seq;
}

// The two ends of an asynchronous span (an operation from submission to completion).
inline void async_begin(std::uint32_t track, const char* name, std::uint64_t id, std::int64_t at_ns, fields args) noexcept {
  if (!on()) return;
  try {
    recorder::instance().record({at_ns, at_ns, name, id, track, 'b', args});
  } catch (...) {
  }
}
inline void async_end(std::uint32_t track, const char* name, std::uint64_t id) noexcept {
  if (!on()) return;
  try {
    const std::int64_t t = now_ns();
    recorder::instance().record({t, t, name, id, track, 'e', {}});
  } catch (...) {
  }
}

inline void name_track(std::uint32_t track, std::string name) noexcept {
  try {
    recorder::instance().name_track(track, std::move(name));
  } catch (...) {
  }
}

// HERD_TIMELINE: started once per process, by its first communicator. A file that cannot be
// opened is reported on stderr and the run goes on without a timeline.
HERD_SEPARATE void start_from_environment(int rank) noexcept;

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE int launcher_rank() noexcept {
  for (const char* variable : {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* text = std::getenv(variable);
    if (text != nullptr && *text != '\0') return std::atoi(text);
  }
  return 0;
}

HERD_SEPARATE std::filesystem::path rank_file(const std::filesystem::path& path, int rank) {
  std::filesystem::path file = path;
  const std::string extension = path.has_extension() ? path.extension().string() : std::string(".json");
  file.replace_filename(path.stem().string() + ".rank" + std::to_string(rank) + extension);
  return file;
}

HERD_SEPARATE recorder& recorder::instance() {
  static recorder r;
  return r;
}

HERD_SEPARATE void recorder::start(const std::filesystem::path& file, int rank) {
  stop();
  std::FILE* out = std::fopen(file.c_str(), "w");
  if (out == nullptr) {
    const std::string reason = std::generic_category().message(errno);
    throw error("herd::timeline: cannot open '" + file.string() + "' for writing (" + reason +
                "). Give a path in a directory that exists and that this process may write.");
  }
  std::lock_guard lock(mutex_);
  out_ = out;
  file_ = file;
  rank_ = rank;
  dropped_ = 0;
  // Times on the system clock, so that files of ranks on different machines share an axis,
  // counted from 2025-01-01 UTC rather than 1970: viewers read them as doubles, which then still
  // resolve nanoseconds.
  constexpr std::int64_t since_1970_ns = std::int64_t{1735689600} * 1000000000;
  const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
  origin_ns_ = wall - since_1970_ns - now_ns();
  unwritten_names_.assign(names_.begin(), names_.end());
  stopping_ = false;
  std::fputs("[\n", out_);
  std::fprintf(out_, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n", rank, rank);
  std::fprintf(out_, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n", rank, rank);
  writer_ = std::thread([this] { write_loop(); });
  enabled().store(true, std::memory_order_release);
}

HERD_SEPARATE void recorder::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (out_ == nullptr) return;
    enabled().store(false, std::memory_order_release);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  std::lock_guard lock(mutex_);
  if (dropped_ != 0) {
    std::fprintf(out_, "{\"name\":\"herd: %llu events dropped (too many waited to be written)\",\"ph\":\"i\",\"s\":\"p\","
                 "\"pid\":%d,\"tid\":0,\"ts\":0},\n", static_cast<unsigned long long>(dropped_), rank_);
  }
  // A last metadata event, so that the array needs no trailing comma removed.
  std::fprintf(out_, "{\"name\":\"herd_timeline_end\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"dropped\":%llu}}\n]\n", rank_,
               static_cast<unsigned long long>(dropped_));
  std::fclose(out_);
  out_ = nullptr;
}

HERD_SEPARATE bool recorder::active() const {
  std::lock_guard lock(mutex_);
  return out_ != nullptr;
}

HERD_SEPARATE std::filesystem::path recorder::file() const {
  std::lock_guard lock(mutex_);
  return out_ != nullptr ? file_ : std::filesystem::path();
}

HERD_SEPARATE void recorder::record(const event& e) {
  std::lock_guard lock(mutex_);
  if (out_ == nullptr || stopping_) return;
  if (waiting_.size() >= max_waiting) {
    ++dropped_;
    return;
  }
  waiting_.push_back(e);
  if (waiting_.size() == batch) wake_.notify_one();
}

HERD_SEPARATE void recorder::name_track(std::uint32_t track, std::string name) {
  std::lock_guard lock(mutex_);
  auto [at, added] = names_.emplace(track, std::move(name));
  if (added && out_ != nullptr) unwritten_names_.emplace_back(at->first, at->second);
}

HERD_SEPARATE void recorder::write_loop() {
  std::vector<event> taken;
  std::vector<std::pair<std::uint32_t, std::string>> names;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_ || waiting_.size() >= batch; });
    taken.swap(waiting_);
    names.swap(unwritten_names_);
    const bool last = stopping_;
    std::FILE* out = out_;
    lock.unlock();
    for (const auto& [track, name] : names) write_name(out, track, name);
    for (const event& e : taken) write(out, e);
    std::fflush(out);
    taken.clear();
    names.clear();
    lock.lock();
    if (last && waiting_.empty()) return;
  }
}

HERD_SEPARATE void recorder::write_name(std::FILE* out, std::uint32_t track, const std::string& name) const {
  std::string escaped;
  for (char c : name) {
    if (c == '"' || c == '\\') escaped.push_back('\\');
    if (static_cast<unsigned char>(c) >= 0x20) escaped.push_back(c);
  }
  std::fprintf(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,\"args\":{\"name\":\"%s\"}},\n", rank_, track,
               escaped.c_str());
  std::fprintf(out, "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,\"args\":{\"sort_index\":%u}},\n", rank_,
               track, track);
}

HERD_SEPARATE void recorder::print_us(char* out, std::size_t size, std::int64_t ns) {
  const bool negative = ns < 0;
  const auto magnitude = static_cast<unsigned long long>(negative ? -ns : ns);
  std::snprintf(out, size, "%s%llu.%03llu", negative ? "-" : "", magnitude / 1000, magnitude % 1000);
}

HERD_SEPARATE void recorder::write(std::FILE* out, const event& e) const {
  char ts[32];
  print_us(ts, sizeof ts, origin_ns_ + e.begin_ns);
  std::fprintf(out, "{\"name\":\"%s\",\"cat\":\"herd\",\"ph\":\"%c\",\"pid\":%d,\"tid\":%u,\"ts\":%s", e.name, e.phase, rank_,
               e.track, ts);
  if (e.phase == 'X') {
    char dur[32];
    print_us(dur, sizeof dur, e.end_ns - e.begin_ns);
    std::fprintf(out, ",\"dur\":%s", dur);
  } else if (e.phase == 'b' || e.phase == 'e') {
    std::fprintf(out, ",\"id\":\"0x%llx\"", static_cast<unsigned long long>(e.id));
  } else if (e.phase == 'i') {
    std::fputs(",\"s\":\"t\"", out);
  }
  std::fputs(",\"args\":{", out);
  const char* comma = "";
  if (e.args.seq != fields::none) {
    std::fprintf(out, "\"seq\":%llu", static_cast<unsigned long long>(e.args.seq));
    comma = ",";
  }
  if (e.args.count != fields::none) {
    std::fprintf(out, "%s\"count\":%llu", comma, static_cast<unsigned long long>(e.args.count));
    if (e.args.typed) {
      std::fprintf(out, ",\"dtype\":\"%.*s\",\"bytes\":%llu", static_cast<int>(name(e.args.type).size()),
                   name(e.args.type).data(), static_cast<unsigned long long>(e.args.count * size_of(e.args.type)));
    }
    comma = ",";
  }
  if (e.args.extra_name != nullptr) std::fprintf(out, "%s\"%s\":%lld", comma, e.args.extra_name, static_cast<long long>(e.args.extra));
  std::fputs("}},\n", out);
}

HERD_SEPARATE void start_from_environment(int rank) noexcept {
  static std::once_flag once;
  std::call_once(once, [rank] {
    const char* path = std::getenv("HERD_TIMELINE");
    if (path == nullptr || *path == '\0') return;
    try {
      recorder::instance().start(rank_file(path, rank), rank);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s (HERD_TIMELINE; no timeline is written)\n", e.what());
    }
  });
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail::trace

namespace herd::timeline {

// Starts writing this process's timeline to `path` with its rank inserted (run.json ->
// run.rank0.json); a timeline already running is closed first. `rank`: the process's rank in the
// file (-1: as its launcher says). Raises herd::error if the file cannot be opened.
inline void start(const std::filesystem::path& path, int rank = -1) {
  const int r = rank >= 0 ? rank : detail::trace::launcher_rank();
  detail::trace::recorder::instance().start(detail::trace::rank_file(path, r), r);
}

// Writes what is recorded and closes the file (it is complete JSON from then on).
inline void stop() noexcept { detail::trace::recorder::instance().stop(); }

inline bool active() { return detail::trace::recorder::instance().active(); }

// The file being written ("" when none is).
inline std::filesystem::path file() { return detail::trace::recorder::instance().file(); }

}  // namespace herd::timeline

#endif  // HERD_RUNTIME_TIMELINE_HPP
