#ifndef HERD_CORE_ERROR_HPP
#define HERD_CORE_ERROR_HPP
// herd::error: what went wrong, on which rank, and what to do about it.

#include <herd/core/config.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace herd {

class error : public std::runtime_error {
 public:
  explicit error(const std::string& message, int rank = -1) : std::runtime_error(message), rank_(rank) {}

  // The rank that raised it, or -1 where no communicator was involved.
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

// A mistake in the arguments of a collective (on any rank, or between the ranks: counts, dtypes,
// ops, roots, order), found by the agreement that starts every operation before any data moved.
// Every rank of the operation raises it alike, and the communicator stays usable.
class argument_error : public error {
 public:
  using error::error;
};

namespace detail {

// Where an error happened: the operation ("allreduce") and, when known, the rank and world size.
struct error_site {
  std::string_view operation;
  int rank = -1;
  int size = 0;
};

// "herd::allreduce on rank 1 of 4: <what>. <todo>"
HERD_SEPARATE std::string error_message(const error_site& site, std::string_view what, std::string_view todo);

[[noreturn]] inline void raise(const error_site& site, std::string_view what, std::string_view todo) {
  throw error(error_message(site, what, todo), site.rank);
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::string error_message(const error_site& site, std::string_view what, std::string_view todo) {
  std::string message = "herd";
  if (!site.operation.empty()) message.append("::").append(site.operation);
  if (site.rank >= 0) {
    message.append(" on rank ").append(std::to_string(site.rank));
    if (site.size > 0) message.append(" of ").append(std::to_string(site.size));
  }
  message.append(": ").append(what);
  if (!todo.empty()) message.append(". ").append(todo);
  if (message.back() != '.') message.push_back('.');
  return message;
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace detail
}  // namespace herd

#endif  // HERD_CORE_ERROR_HPP
