#include <herd/herd.hpp>

#include <vector>

// The same instantiations as two_tu_main.cpp, from a second translation unit.
float sum_on_threads(int ranks) {
  float result = 0;
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    std::vector<float> v(10, 1.0f);
    herd::allreduce(v, comm);
    if (comm.rank() == 0) result = v[0];
  });
  return result;
}
