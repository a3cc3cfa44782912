#include <herd/herd.hpp>

#include <cstdio>
#include <vector>

float sum_on_threads(int ranks);

int main() {
  float here = 0;
  herd::local::run(2, [&](herd::local_communicator& comm) {
    std::vector<float> v(10, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) here = v[0];
  });
  const float there = sum_on_threads(3);
  if (here != 2.0f || there != 3.0f) {
    std::printf("two translation units: got %g and %g, want 2 and 3\n", static_cast<double>(here), static_cast<double>(there));
    return 1;
  }
  return 0;
}
