// Translation units compiled by g++ and by nvcc for different GPUs link into one program, and
// each keeps its own herd: the configuration namespaces differ, so no definition is shared.
#include <herd/herd.hpp>

#include <cstdio>
#include <cstring>

const char* configuration_a();
const char* configuration_b();
float sum_a(int ranks);
float sum_b(int ranks);

int main() {
  const char* here = herd::configuration();
  const char* a = configuration_a();
  const char* b = configuration_b();
  std::printf("configurations: %s, %s, %s\n", here, a, b);
  float mine = 0;
  herd::local::run(2, [&](herd::local_communicator& comm) {
    std::vector<float> v(100, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) mine = v[0];
  });
  const bool distinct = std::strcmp(here, a) != 0 && std::strcmp(here, b) != 0 && std::strcmp(a, b) != 0;
  const bool sums = mine == 2.0f && sum_a(3) == 3.0f && sum_b(4) == 4.0f;
  if (!distinct || !sums) {
    std::printf("FAILED: configurations distinct %d, sums right %d\n", distinct, sums);
    return 1;
  }
  return 0;
}
