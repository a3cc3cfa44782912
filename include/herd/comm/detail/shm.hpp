#ifndef HERD_COMM_DETAIL_SHM_HPP
#define HERD_COMM_DETAIL_SHM_HPP
// Shared memory between the ranks of a communicator that run on one node: one segment that every
// one of them maps, in which each rank owns a region (two buffers and two counters). The
// collectives over it (collectives/detail/shm.hpp) move data by plain loads and stores and
// synchronize through the counters, not through MPI messages.
//
// Tickets. Every step of every collective over the segment takes the next ticket t, the same
// number on every rank (the steps follow from the operation, which the ranks agreed on). In step t
// a rank writes into its own buffer t % 2, publishes t in its `arrived` counter, waits until every
// other rank's counter reached t, and then reads the others' buffers t % 2. Two buffers are enough
// for a rank never to overwrite what a peer still reads: a rank writes buffer t % 2 again in step
// t + 2 only after waiting in step t + 1 for every peer, and a peer arrives at t + 1 only once it
// has finished step t. So there is no other barrier. (The allreduce has a second counter,
// `reduced`, for its second half-step: see shm_allreduce.)
//
// Operations. Each step also carries the number of the operation it belongs to (the last 8 bytes
// of its buffer's header), and a rank that finds a peer's step t to belong to another operation
// than its own raises instead of reading it. Ranks whose operations take different numbers of
// steps (arguments that differ, unchecked with HERD_CHECK_ARGUMENTS=0) would otherwise pair one
// operation's steps with the next one's, and complete it with another operation's data.
//
// Why POSIX shared memory and not MPI_Win_allocate_shared: freeing an MPI window is collective
// and synchronizing, so a communicator's destructor would wait for every peer to destroy theirs;
// herd never lets a destructor hang on another rank. The segment is anonymous (shm_segment), so
// it vanishes with the last process that unmaps it, crashed or not, and unmapping is local. Which ranks share a node is still MPI's answer
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED on the communicator itself), never an
// environment variable, so sub-communicators and process subsets work.
//
// Waiting follows every herd wait's rules (comm/detail/watchdog.hpp): spin briefly, then yield,
// then sleep; the watchdog names the rank waited for; a peer's abort or departure (MPI notices)
// raises at once.

#include <herd/comm/detail/fault_hooks.hpp>
#include <herd/comm/detail/operation_state.hpp>
#include <herd/comm/detail/watchdog.hpp>
#include <herd/core/config.hpp>
#include <herd/core/error.hpp>
#include <herd/runtime/timeline.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {

// One shared-memory segment mapped into this process. It has no name in /dev/shm at any moment
// where one could be left behind: the creating rank makes it anonymous (memfd_create) and keeps its
// descriptor open while the other ranks of the node open it through /proc/<pid>/fd/<fd>; closing
// that descriptor (release_name) then leaves only the mappings, which go with their processes,
// killed or not. Where memfd_create is missing, or the ranks cannot reach each other's /proc (PID
// namespaces), a named POSIX segment is the fallback (unlinked at the same point, so a rank killed
// before it leaves that name behind; docs/how-it-works.md says so).
class shm_segment {
 public:
  shm_segment() = default;
  shm_segment(shm_segment&& other) noexcept { *this = std::move(other); }
  shm_segment& operator=(shm_segment&& other) noexcept;
  ~shm_segment() { reset(); }

  // What the creator writes in the last bytes of a segment and an opener compares before it uses
  // what it mapped: a path names a file of this process's view (/proc/<pid>/fd/<n> of another PID
  // namespace is some other process's descriptor), which may be anything.
  struct identity {
    std::uint64_t token[2] = {0, 0};  // random, drawn by the creator
    std::uint64_t bytes = 0;
    bool operator==(const identity&) const = default;
  };

  // Creates a segment of `bytes`, with its memory reserved (so that a lack of memory is an error
  // here, not a SIGBUS later), a name the node's other ranks open it by, and its identity. Empty,
  // with `problem` set, on failure. `named`: a POSIX name in /dev/shm with a random part, not an
  // anonymous segment (which the others reach through /proc, only in the same PID namespace).
  static shm_segment create(std::size_t bytes, std::string& problem, bool named = false);

  // Maps the segment another rank of the node created (while it still holds its name), once it
  // found there the identity the creator sent: a file of another size, or of another identity, is
  // left untouched (never written) and is a problem.
  static shm_segment open(const std::string& name, std::size_t bytes, const identity& expected, std::string& problem);

  const identity& id() const noexcept { return identity_; }

  // Once every rank of the node has it open: removes the name (closes the descriptor others opened
  // it through, or unlinks the POSIX name). The memory stays until the last process unmaps it.
  void release_name() noexcept;

  std::byte* data() const noexcept { return base_; }
  const std::string& name() const noexcept { return name_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }

 private:
  void map(int fd, std::size_t bytes, std::string& problem);

  void reset() noexcept {
    release_name();
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

  // Eight bytes from the kernel's generator (read from /dev/urandom, not through <random>, which
  // costs every file that includes herd a tenth of a second to parse); the clock and a counter
  // where it cannot be read.
  static std::uint64_t random_word();

  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  identity identity_;
  std::string name_;
  bool linked_ = false;  // a POSIX name to unlink
  int fd_ = -1;          // the anonymous segment's descriptor, open until the others have it
};

// shm_segment's members that create, open, map and name segments: inline, or with
// HERD_SEPARATE_COMPILATION only in the program's implementation file (core/config.hpp).
#if defined(HERD_SEPARATE_DEFINITIONS)
HERD_SEPARATE shm_segment& shm_segment::operator=(shm_segment&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    identity_ = other.identity_;
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

HERD_SEPARATE shm_segment shm_segment::create(std::size_t bytes, std::string& problem, bool named) {
  shm_segment s;
  int fd = -1;
#if defined(MFD_CLOEXEC)
  if (!named) fd = ::memfd_create("herd", MFD_CLOEXEC);
  if (fd >= 0) {
    s.fd_ = fd;
    s.name_ = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd);
  }
#endif
  if (fd < 0) {
    static std::atomic<unsigned> counter{0};
    const auto stamp = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count());
    s.name_ = "/herd." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." +
              std::to_string(stamp % 1000000007ull) + "." + std::to_string(random_word() % 1000000007ull);
    fd = ::shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      problem = "shm_open(" + s.name_ + ") failed: " + std::strerror(errno);
      return {};
    }
    s.linked_ = true;
  }
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    problem = "ftruncate of " + s.name_ + " to " + std::to_string(bytes) + " bytes failed: " + std::strerror(errno);
  } else if (const int code = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); code != 0) {
    problem = "reserving " + std::to_string(bytes) + " bytes of shared memory failed: " + std::strerror(code) +
              " (is there that much memory, or room in /dev/shm?)";
  } else {
    s.map(fd, bytes, problem);
  }
  if (s.fd_ < 0) ::close(fd);
  if (!problem.empty()) {
    s.reset();
    return {};
  }
  s.identity_.token[0] = random_word();
  s.identity_.token[1] = random_word();
  s.identity_.bytes = bytes;
  std::memcpy(s.base_ + bytes - sizeof(identity), &s.identity_, sizeof(identity));
  return s;
}

HERD_SEPARATE shm_segment shm_segment::open(const std::string& name, std::size_t bytes, const identity& expected,
                                           std::string& problem) {
  const bool anonymous = name.rfind("/proc/", 0) == 0;
  const int fd = anonymous ? ::open(name.c_str(), O_RDWR | O_CLOEXEC) : ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    problem = std::string(anonymous ? "open(" : "shm_open(") + name + ") failed: " + std::strerror(errno);
    if (anonymous) problem += " (the creator's /proc entry is not reachable: another PID namespace?)";
    return {};
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::size_t>(st.st_size) != bytes) {
    problem = name + " is not the node's segment (not a file of " + std::to_string(bytes) + " bytes" +
              (anonymous ? ": the creator's descriptor number names another file here, in another PID namespace?)"
                         : ")");
    ::close(fd);
    return {};
  }
  shm_segment s;
  s.map(fd, bytes, problem);
  ::close(fd);
  if (!problem.empty()) return {};
  identity found;
  std::memcpy(&found, s.base_ + bytes - sizeof(identity), sizeof found);
  if (!(found == expected)) {
    problem = name + " is not the node's segment (its identity differs" +
              std::string(anonymous ? ": the creator's descriptor number names another file here, in another PID "
                                      "namespace?)"
                                    : ")");
    s.reset();
    return {};
  }
  s.identity_ = expected;
  return s;
}

HERD_SEPARATE void shm_segment::release_name() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

HERD_SEPARATE void shm_segment::map(int fd, std::size_t bytes, std::string& problem) {
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    problem = "mmap of " + std::to_string(bytes) + " bytes of shared memory failed: " + std::strerror(errno);
    return;
  }
  base_ = static_cast<std::byte*>(at);
  bytes_ = bytes;
}

HERD_SEPARATE std::uint64_t shm_segment::random_word() {
  std::uint64_t word = 0;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool read_all = fd >= 0 && ::read(fd, &word, sizeof word) == static_cast<ssize_t>(sizeof word);
  if (fd >= 0) ::close(fd);
  if (read_all) return word;
  static std::atomic<std::uint64_t> calls{0};
  const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (now * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(::getpid()) << 32) ^ calls++;
}
#endif  // HERD_SEPARATE_DEFINITIONS

// Room at the start of each buffer for an agreement's signature (comm/detail/agreement.hpp).
inline constexpr std::size_t shm_header_bytes = 256;

// The ranks of one node and their shared segment, as one of them sees it.
class shm_node {
 public:
  enum counter : std::size_t { arrived = 0, reduced = 1 };

  // The layout of a segment for `size` ranks with buffers of `slice_bytes` of data each (its last
  // page holds no rank's region: the segment's identity is at its end).
  static std::size_t segment_bytes(int size, std::size_t slice_bytes) {
    return static_cast<std::size_t>(size) * rank_stride(slice_bytes) + page;
  }

  // `members[i]`: the communicator rank of the node's i-th rank; this rank is members[rank].
  // `cores`: the node's processors (the same on every rank of the node).
  shm_node(shm_segment segment, int rank, std::vector<int> members, std::size_t slice_bytes, int cores)
      : segment_(std::move(segment)), rank_(rank), members_(std::move(members)), slice_bytes_(slice_bytes),
        allreduce_slice_bytes_(size() > cores ? slice_bytes : slice_bytes / 2) {}

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return static_cast<int>(members_.size()); }
  int member(int i) const noexcept { return members_[static_cast<std::size_t>(i)]; }
  // Bytes of data a step may put in one buffer: the slice of the shared-memory pipelines.
  std::size_t slice_bytes() const noexcept { return slice_bytes_; }
  // The allreduce's slice: half a buffer, so that every use of a buffer has at least two windows
  // (window()). With whole-buffer slices a 1 MiB allreduce at 2 ranks rewrote at every call the
  // lines its peer had read at the last one, and each rank's input, buffer and peer's buffer
  // (3 MiB) did not fit its core's 2 MiB of L2; with half-buffer slices it is 1.2x as fast, 2 and
  // 4 MiB 1.3x (benchmarks/RESULTS.md). Where the node's ranks outnumber its cores, a step costs a
  // turn of the scheduler whatever its size, and the whole buffer (half the steps) stays.
  std::size_t allreduce_slice_bytes() const noexcept { return allreduce_slice_bytes_; }
  shm_segment& segment() noexcept { return segment_; }

  // The next step's ticket (the same on every rank of the node), for the operation `comm` runs:
  // the operation goes with the step (step_word).
  template <class C> std::uint64_t next_ticket(C& comm) {
    const operation_state& ops = comm.operations();
    operation_ = ops.in_operation() ? step_word(ops.current()) : 0;
    ++ticket_;
    std::memcpy(operation_word(rank_, ticket_), &operation_, sizeof operation_);
    return ticket_;
  }

  // The ticket of the last step this rank began.
  std::uint64_t ticket() const noexcept { return ticket_; }

  // Rank i's buffer of step t: shm_header_bytes of header, then data_bytes(slice_bytes) of data.
  std::byte* header(int i, std::uint64_t t) const noexcept {
    return region(i) + 2 * cache_line + (t % 2) * buffer_stride(slice_bytes_);
  }
  std::byte* buffer(int i, std::uint64_t t) const noexcept { return header(i, t) + shm_header_bytes; }

  // Where rank i's data of step t begin when every rank's step carries `bytes` of them (the same
  // on every rank). A buffer serves every other step, and each time its data move on to the next
  // window of it (as many as fit), so that a rank writes lines its peers last read several uses
  // before, which have left their caches by then. Writing a line that a peer's cache still holds
  // waits for that copy to be taken away, one line at a time: at 2 ranks that was half of a 64 KiB
  // allreduce's time (benchmarks/RESULTS.md). Windows are a page and five lines apart beyond the
  // data, so that a copy's source and its window seldom share offsets within their pages.
  std::byte* window(int i, std::uint64_t t, std::size_t bytes) const noexcept {
    const std::size_t stride = (bytes + page - 1) / page * page + 5 * cache_line;
    const std::size_t windows = data_bytes(slice_bytes_) / stride;
    return buffer(i, t) + (windows > 1 ? (t / 2) % windows * stride : 0);
  }

  // This rank has finished writing step t (of `which` half-step).
  void publish(std::uint64_t t, counter which = arrived) {
    if (shm_hook hook = shm_step_hook()) hook(t);
    flag(rank_, which).store(t, std::memory_order_release);
  }

  // What the ranks' steps must share to pair up: the whole operation (step_word), or only its
  // number, for an agreement's exchange, whose signatures compare the rest and say more.
  enum class pairing { whole, number };

  // Waits until every other rank of the node published t; what they wrote before is visible after.
  // Raises if a peer's step t belongs to another operation than this rank's.
  template <class C> void wait_all(C& comm, std::uint64_t t, counter which = arrived, pairing pair = pairing::whole) {
    wait_for_peers(comm, t, which);
    if (which != arrived) return;  // the same step's second half: its operation was checked
    // (Whether the operation is typed only shapes the message.)
    const std::uint64_t compared = pair == pairing::whole ? ~typed : seq_mask | in_operation;
    for (int i = 0; i < size(); ++i) {
      if (i == rank_) continue;
      std::uint64_t theirs = 0;
      std::memcpy(&theirs, operation_word(i, t), sizeof theirs);
      if (((theirs ^ operation_) & compared) != 0) mismatched(comm, i, theirs);
    }
  }

 private:
  // What each step carries of its operation: the number (its low 40 bits), the collective, and the
  // dtype where the operation has one (a barrier or a grouped allreduce has none: u8, untyped).
  // The number alone would let steps of two collectives pair up where the ranks' arguments are not
  // compared (HERD_CHECK_ARGUMENTS=0) and one rank calls, say, allgather where another calls
  // allreduce: the allgather would return the other's half-copied data. The same collective on
  // the same dtype is labelled the same on every rank, so the fields differ only when the ranks
  // disagree. What the word cannot see, with checks off: grouped allreduces of equal byte sizes
  // whose tensors differ in dtype, and differing counts (those end in a stall the watchdog reports).
  static constexpr std::uint64_t seq_mask = (std::uint64_t{1} << 40) - 1;
  static constexpr std::uint64_t in_operation = std::uint64_t{1} << 56;
  static constexpr std::uint64_t typed = std::uint64_t{1} << 57;
  static std::uint64_t step_word(const op_label& label) noexcept {
    return (label.seq & seq_mask) | std::uint64_t{static_cast<std::uint8_t>(label.kind)} << 40 |
           std::uint64_t{static_cast<std::uint8_t>(label.type)} << 48 | in_operation | (label.typed ? typed : 0);
  }
  static std::string step_text(std::uint64_t word);

  template <class C> [[noreturn]] void mismatched(C& comm, int i, std::uint64_t theirs) const {
    const operation_state& ops = comm.operations();
    raise(site_of(ops, "shared memory", comm.rank(), comm.size()),
          "rank " + std::to_string(member(i)) + " is in " + step_text(theirs) + " where rank " +
              std::to_string(comm.rank()) + " is in " + (ops.in_operation() ? ops.current().str() : "no operation") +
              ": their shared-memory steps do not pair up, because the ranks called different collectives or the "
              "same one with different arguments",
          "Call the same collectives with the same arguments on every rank; HERD_CHECK_ARGUMENTS=1 (the default) "
          "names the difference");
  }

  template <class C> void wait_for_peers(C& comm, std::uint64_t t, counter which) {
    std::optional<trace::span> phase;  // in the timeline from the first peer not there yet
    for (int i = 0; i < size(); ++i) {
      if (i == rank_) continue;
      std::atomic_ref<std::uint64_t> peer = flag(i, which);
      if (peer.load(std::memory_order_acquire) >= t) continue;
      bool there = false;
      for (int spin = 0; spin < 256 && !there; ++spin) there = peer.load(std::memory_order_acquire) >= t;
      if (there) continue;
      if (!phase && trace::on()) {
        phase.emplace(comm.operations().track(), "wait for peers", trace::fields{.extra_name = "first_peer", .extra = member(i)});
      }
      const operation_state& ops = comm.operations();
      watched_wait(
          comm.options(), site_of(ops, "shared memory", comm.rank(), comm.size()),
          [&] { return peer.load(std::memory_order_acquire) >= t; },
          [&] {
            // A peer's abort or departure raises here. (Only an mpi_communicator has a node; other
            // communicators compile this path for shared_node_of's sake and never take it.)
            if constexpr (requires { comm.while_waiting(); }) comm.while_waiting();
          },
          [&] {
            return (ops.in_operation() ? "in " + ops.current().str() + " " : std::string()) + "for rank " +
                   std::to_string(member(i)) + " (through shared memory)";
          });
    }
  }

  static constexpr std::size_t cache_line = 64;
  static constexpr std::size_t page = 4096;
  // A buffer's room for data: slice_bytes, and room for the windows' offsets (five lines each,
  // window()) so that k windows of slice_bytes / k fit when that is whole pages, for k up to 6:
  // two for the allreduce's half-buffer slices of a 1 MiB buffer.
  static std::size_t data_bytes(std::size_t slice_bytes) { return slice_bytes + 32 * cache_line; }

  // Buffers and regions are cache-line aligned but never a multiple of 4 KiB apart: copies
  // between addresses with equal offsets in their pages are several times slower on x86.
  static std::size_t buffer_stride(std::size_t slice_bytes) {
    return (shm_header_bytes + data_bytes(slice_bytes) + cache_line - 1) / cache_line * cache_line + 3 * cache_line;
  }
  static std::size_t rank_stride(std::size_t slice_bytes) {
    const std::size_t bytes = 2 * cache_line + 2 * buffer_stride(slice_bytes);
    return (bytes + page - 1) / page * page + 5 * cache_line;
  }

  std::byte* region(int i) const noexcept {
    return segment_.data() + static_cast<std::size_t>(i) * rank_stride(slice_bytes_);
  }
  // Where rank i writes the number of the operation its step t belongs to.
  std::byte* operation_word(int i, std::uint64_t t) const noexcept {
    return header(i, t) + shm_header_bytes - sizeof(std::uint64_t);
  }
  // The flags are shared between processes: only a lock-free atomic works there (one with a lock
  // would keep the lock in each process's own memory).
  static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);
  std::atomic_ref<std::uint64_t> flag(int i, counter which) const noexcept {
    return std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(region(i) + which * cache_line));
  }

  shm_segment segment_;
  int rank_ = 0;
  std::vector<int> members_;
  std::size_t slice_bytes_ = 0;
  std::size_t allreduce_slice_bytes_ = 0;
  std::uint64_t ticket_ = 0;
  std::uint64_t operation_ = 0;  // the operation of the step of ticket_
};

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::string shm_node::step_text(std::uint64_t word) {
  if (word == 0) return "no operation";
  std::string text =
      std::string(name(static_cast<op_kind>((word >> 40) & 0xff))) + " #" + std::to_string(word & seq_mask);
  if ((word & typed) != 0) text += " of " + std::string(name(static_cast<dtype>((word >> 48) & 0xff)));
  return text;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_SHM_HPP
