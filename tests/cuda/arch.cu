// Compiled twice, for two GPU architectures, as arch_a and arch_b (see CMakeLists.txt);
// arch_main.cpp by the host compiler.
#include <herd/herd.hpp>

#define HERD_TEST_NAME_(base, suffix) base##_##suffix
#define HERD_TEST_NAME(base, suffix) HERD_TEST_NAME_(base, suffix)

const char* HERD_TEST_NAME(configuration, ARCH_SUFFIX)() { return herd::configuration(); }

float HERD_TEST_NAME(sum, ARCH_SUFFIX)(int ranks) {
  float result = 0;
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    std::vector<float> v(100, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) result = v[99];
  });
  return result;
}
