// Compiled for another GPU architecture than arch_a.cu; main.cpp by the host compiler.
#include <herd/herd.hpp>

const char* configuration_b() { return herd::configuration(); }

float sum_b(int ranks) {
  float result = 0;
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    std::vector<float> v(100, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) result = v[99];
  });
  return result;
}
