// Must NOT compile: herd::gather on a communicator with native collectives (nccl_communicator's
// shape, here its stand-in) has to stop at herd's static_assert, which says what to use instead.

#include <herd/collectives/gather.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include "../support/native_stand_in.hpp"

#include <vector>

int main() {
  herd::local::run(2, [](herd::local_communicator& host) {
    herd_test::native_stand_in comm(host);
    std::vector<float> mine(4), all(8);
    herd::gather(mine, all, comm, 0);
  });
}
