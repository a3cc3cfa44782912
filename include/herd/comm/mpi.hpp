#pragma once
// herd::mpi::environment and herd::mpi_communicator: ranks as processes, over MPI.

#include <herd/comm/communicator.hpp>

#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI declares MPIX_Query_cuda_support here
#endif

#include <climits>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

namespace herd {
namespace mpi {

inline bool is_initialized() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Initializes MPI (asking for MPI_THREAD_MULTIPLE by default) unless the program already did, and
// finalizes it on destruction only if it was the one that initialized it.
class environment {
 public:
  environment() : environment(nullptr, nullptr) {}
  environment(int& argc, char**& argv, int required_thread_level = MPI_THREAD_MULTIPLE)
      : environment(&argc, &argv, required_thread_level) {}

  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;

  ~environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

  // The thread support MPI provided (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return provided_; }
  // Whether this guard initialized MPI (and so will finalize it).
  bool owns() const noexcept { return owns_; }

 private:
  environment(int* argc, char*** argv, int required = MPI_THREAD_MULTIPLE) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Query_thread(&provided_);
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      throw error("herd::mpi::environment: MPI was already finalized in this process and cannot be started again. "
                  "Create the environment once, at the top of main.");
    }
    if (MPI_Init_thread(argc, argv, required, &provided_) != MPI_SUCCESS) {
      throw error("herd::mpi::environment: MPI_Init_thread failed. Check that the program runs under mpiexec "
                  "(or srun) of the same MPI it was built with.");
    }
    owns_ = true;
  }

  bool owns_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

// Whether this MPI moves CUDA device memory itself (is "CUDA-aware"): then herd's staged ring hands
// it device buffers instead of copying through page-locked host memory. HERD_MPI_CUDA_AWARE=0 or 1
// overrides what the MPI library says (it must then be the same on every rank).
inline bool cuda_aware() {
  if (const char* forced = std::getenv("HERD_MPI_CUDA_AWARE"); forced != nullptr && *forced != '\0') {
    return std::string(forced) != "0";
  }
#if defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) == MPI_SUCCESS) return supported != 0;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() != 0;
#endif
  return false;
}

// This process's rank among the processes of `comm` on the same node, and their number (through
// MPI_COMM_TYPE_SHARED): what picks a GPU per process, like Horovod's local_rank().
namespace detail {
// (rank, size) within the processes of `comm` that share this node.
inline std::pair<int, int> node_rank_and_size(MPI_Comm comm, const char* operation) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) {
    throw error(std::string("herd::mpi::") + operation + ": MPI_Comm_split_type failed. Is MPI initialized?");
  }
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return {rank, size};
}
}  // namespace detail

inline int local_rank(MPI_Comm comm = MPI_COMM_WORLD) { return detail::node_rank_and_size(comm, "local_rank").first; }
inline int local_size(MPI_Comm comm = MPI_COMM_WORLD) { return detail::node_rank_and_size(comm, "local_size").second; }

}  // namespace mpi

class mpi_communicator {
 public:
  // A pending isend or irecv. Destroying one that is still pending cancels a receive (so MPI never
  // writes into memory the caller may free) and lets a send finish on its own.
  class request {
   public:
    request() = default;
    request(request&& other) noexcept { *this = std::move(other); }
    request& operator=(request&& other) noexcept {
      if (this != &other) {
        release();
        handle_ = std::exchange(other.handle_, MPI_REQUEST_NULL);
        peer_ = other.peer_;
        tag_ = other.tag_;
        receiving_ = other.receiving_;
        collective_ = other.collective_;
      }
      return *this;
    }
    ~request() { release(); }

    bool pending() const noexcept { return handle_ != MPI_REQUEST_NULL; }

   private:
    friend class mpi_communicator;
    void release() noexcept {
      if (handle_ == MPI_REQUEST_NULL || !mpi::is_initialized()) return;
      if (collective_) {
        // MPI forbids freeing or cancelling a nonblocking collective: leave it to MPI_Finalize.
      } else if (receiving_) {
        MPI_Cancel(&handle_);
        MPI_Wait(&handle_, MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&handle_);
      }
      handle_ = MPI_REQUEST_NULL;
    }

    MPI_Request handle_ = MPI_REQUEST_NULL;
    int peer_ = -1;
    int tag_ = 0;
    bool receiving_ = false;
    bool collective_ = false;
  };

  // Duplicates `comm`, so herd's messages never mix with the caller's own on it.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, comm_options options = {}) : options_(options) {
    if (!mpi::is_initialized()) {
      throw error("herd::mpi_communicator: MPI is not initialized. Create a herd::mpi::environment (or call "
                  "MPI_Init_thread) before any communicator.");
    }
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    adopt();
  }

  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  mpi_communicator(mpi_communicator&& other) noexcept { *this = std::move(other); }
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      free();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      options_ = other.options_;
      cuda_aware_ = other.cuda_aware_;
    }
    return *this;
  }
  ~mpi_communicator() { free(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm native() const noexcept { return comm_; }
  const comm_options& options() const noexcept { return options_; }

  // Host memory only; device buffers go through herd's staging path or the NCCL communicator.
  bool supports(device d) const noexcept { return d.is_cpu(); }
  // Whether the staged path may hand MPI device memory directly (mpi::cuda_aware()).
  bool cuda_aware() const noexcept { return cuda_aware_; }

  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("isend", rank_, size_, peer);
    detail::check_buffer("isend", rank_, size_, data, bytes);
    request r;
    r.peer_ = peer;
    r.tag_ = tag;
#if MPI_VERSION >= 4
    check(MPI_Isend_c(data, static_cast<MPI_Count>(bytes), MPI_BYTE, peer, tag, comm_, &r.handle_), "MPI_Isend_c");
#else
    check(MPI_Isend(data, count_of(bytes), MPI_BYTE, peer, tag, comm_, &r.handle_), "MPI_Isend");
#endif
    return r;
  }

  request irecv(void* data, std::size_t bytes, int peer, int tag) {
    detail::check_peer("irecv", rank_, size_, peer);
    detail::check_buffer("irecv", rank_, size_, data, bytes);
    request r;
    r.peer_ = peer;
    r.tag_ = tag;
    r.receiving_ = true;
#if MPI_VERSION >= 4
    check(MPI_Irecv_c(data, static_cast<MPI_Count>(bytes), MPI_BYTE, peer, tag, comm_, &r.handle_), "MPI_Irecv_c");
#else
    check(MPI_Irecv(data, count_of(bytes), MPI_BYTE, peer, tag, comm_, &r.handle_), "MPI_Irecv");
#endif
    return r;
  }

  // True once the request completed (it is then no longer pending).
  bool test(request& r) {
    if (!r.pending()) return true;
    int done = 0;
    check(MPI_Test(&r.handle_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }

  // Polls with a yield between tests instead of MPI_Wait's busy spin: with more ranks than cores,
  // the rank being waited for gets the core sooner. Watches for stalls (comm_options).
  void wait(request& r) {
    for (int i = 0; i < 32; ++i) {
      if (test(r)) return;
    }
    detail::stall_watch watch(options_);
    for (unsigned polls = 1;; ++polls) {
      if (test(r)) return;
      std::this_thread::yield();
      if ((polls & 1023u) == 0) watch.check(rank_, size_, r.peer_, r.receiving_, r.tag_);
    }
  }

  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    request rr = irecv(receive, receive_bytes, source, tag);
    request sr = isend(send, send_bytes, destination, tag);
    wait(rr);
    wait(sr);
  }

  void barrier() {
    request r;
    r.peer_ = -1;  // no one peer: the stall message says "in a barrier"
    r.tag_ = detail::tag_value(detail::tag::barrier);
    r.collective_ = true;
    check(MPI_Ibarrier(comm_, &r.handle_), "MPI_Ibarrier");
    wait(r);
  }

  // Ranks passing the same color form a new communicator, ordered by key then by rank here.
  mpi_communicator split(int color, int key) const {
    // Agree first: a rank that raised alone would leave the others inside MPI_Comm_split.
    int lowest = color;
    check(MPI_Allreduce(&color, &lowest, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    if (lowest < 0) {
      detail::raise({"split", rank_, size_},
                    color < 0 ? "color " + std::to_string(color) + " is negative" : std::string("another rank passed a negative color"),
                    "Pass a color >= 0 on every rank; ranks with equal colors end up in the same communicator");
    }
    MPI_Comm part = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");
    return mpi_communicator(part, options_, adopt_tag{});
  }

 private:
  struct adopt_tag {};
  mpi_communicator(MPI_Comm owned, comm_options options, adopt_tag) : comm_(owned), options_(options) { adopt(); }

  void adopt() {
    cuda_aware_ = mpi::cuda_aware();
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  void free() noexcept {
    if (comm_ != MPI_COMM_NULL && mpi::is_initialized()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    detail::raise({"mpi_communicator", rank_, size_}, std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(length)),
                  "This is an error inside MPI; check the MPI installation and that every rank is alive");
  }

#if MPI_VERSION < 4
  int count_of(std::size_t bytes) const {
    if (bytes > static_cast<std::size_t>(INT_MAX)) {
      detail::raise({"mpi_communicator", rank_, size_}, "message of " + std::to_string(bytes) + " bytes",
                    "This MPI (before MPI-4) takes at most 2^31-1 bytes per message; split the buffer");
    }
    return static_cast<int>(bytes);
  }
#endif

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  comm_options options_;
  bool cuda_aware_ = false;
};

}  // namespace herd
