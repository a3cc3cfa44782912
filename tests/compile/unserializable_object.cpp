// Must NOT compile: herd::allgather_object of a type that is neither trivially copyable, nor a
// std::string, nor a std::vector of those has to stop at herd's static_assert, which says so.

#include <herd/collectives/object.hpp>
#include <herd/comm/local.hpp>

#include <map>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    const std::map<int, int> table{{1, 2}};
    (void)herd::allgather_object(table, comm);
  });
}
