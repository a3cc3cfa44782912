#ifndef HERD_CHECKPOINT_DETAIL_ON_ROOT_HPP
#define HERD_CHECKPOINT_DETAIL_ON_ROOT_HPP
// One rank does the file work of a collective save or load; every rank learns how it went, and
// raises the same herd::error if it failed.

#include <herd/checkpoint/detail/file.hpp>
#include <herd/collectives/object.hpp>
#include <herd/comm/communicator.hpp>
#include <herd/core/error.hpp>

#include <exception>
#include <filesystem>
#include <string>
#include <utility>

namespace herd::detail::ckpt {

// Runs `step` on root alone and returns, on every rank, what it returned: "o" (ok) and what else
// root has to say, or "m" (missing). If it failed, every rank raises what failed and what to do
// (sent split by a NUL: names in messages are escaped, so neither holds one).
template <communicator C, class F>
std::string on_root(const error_site& site, C& comm, int root, const std::filesystem::path& path, const char* role,
                    F&& step) {
  if (root < 0 || root >= site.size) {
    raise(site, "root " + std::to_string(root) + " is out of range",
          "Pass a root in [0, " + std::to_string(site.size) + ")");
  }
  std::string status;
  try {
    if (site.rank == root) status = step();
  } catch (const failure& f) {
    status = "f" + f.what + '\0' + f.todo;
  } catch (const std::exception& e) {
    status = "f" + path.string() + ": " + e.what() + '\0';
  }
  broadcast_object(status, comm, root);
  if (status[0] == 'o' || status[0] == 'm') return status;
  const std::size_t split = status.find('\0');
  std::string what = status.substr(1, split - 1);
  if (site.rank != root) what = "rank " + std::to_string(root) + ", which " + role + ", failed: " + what;
  raise(site, what, status.substr(split + 1));
}

}  // namespace herd::detail::ckpt

#endif  // HERD_CHECKPOINT_DETAIL_ON_ROOT_HPP
