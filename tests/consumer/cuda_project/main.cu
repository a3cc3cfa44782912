// A user's .cu file including herd: herd's kernels compile in this translation unit. Runs its
// host part anywhere (no GPU needed) and prints the configuration it was compiled in.
#include <herd/herd.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

__global__ void use_a_herd_functor(float* out, const float* a, const float* b) {
  out[threadIdx.x] = herd::combine<herd::reduce_op::max>{}(a[threadIdx.x], b[threadIdx.x]);
}

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  std::vector<float> v(100, 1.0f);
  herd::allreduce(v, comm);
  const bool ok = v[99] == static_cast<float>(comm.size()) && std::strncmp(herd::configuration(), "cuda", 4) == 0;
  if (comm.rank() == 0) std::printf("cuda consumer: configuration %s, sum %g (%s)\n", herd::configuration(),
                                    static_cast<double>(v[99]), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
