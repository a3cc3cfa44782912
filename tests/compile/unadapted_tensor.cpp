// Must NOT compile: herd::allreduce on a type with no tensor_traits specialization has to stop
// at herd's static_assert ("this tensor type is not adapted"), not in a wall of template errors.
// check_compile_fails.cmake runs the compiler on it and looks for that text.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>

namespace {

struct Unadapted {
  float values[8];
};

}  // namespace

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    Unadapted t{};
    herd::allreduce(t, comm);
  });
}
