// Translation units compiled by g++ (with and without HERD_WITH_NCCL) and by nvcc for different
// GPUs link into one program, and each keeps its own herd: the configuration namespaces differ,
// so no definition is shared.
#include <herd/herd.hpp>

#include <cstdio>
#include <cstring>

const char* configuration_a();
const char* configuration_b();
const char* configuration_host();
float sum_a(int ranks);
float sum_b(int ranks);
float sum_host(int ranks);

int main() {
  const char* here = herd::configuration();
  const char* a = configuration_a();
  const char* b = configuration_b();
  const char* plain = configuration_host();
  std::printf("configurations: %s, %s, %s, %s\n", here, a, b, plain);
  float mine = 0;
  herd::local::run(2, [&](herd::local_communicator& comm) {
    std::vector<float> v(100, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) mine = v[0];
  });
  const char* all[] = {here, a, b, plain};
  bool distinct = true;
  for (int i = 0; i < 4; ++i)
    for (int j = i + 1; j < 4; ++j) distinct = distinct && std::strcmp(all[i], all[j]) != 0;
  const bool sums = mine == 2.0f && sum_a(3) == 3.0f && sum_b(4) == 4.0f && sum_host(2) == 2.0f;
  if (!distinct || !sums) {
    std::printf("FAILED: configurations distinct %d, sums right %d\n", distinct, sums);
    return 1;
  }
  return 0;
}
