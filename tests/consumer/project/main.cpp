// A user's own tensor type, adapted to herd with one traits specialization, averaged across
// ranks. Exits non-zero if the result is wrong.
#include <herd/herd.hpp>

#include <cstdio>
#include <vector>

namespace my {
struct Tensor {
  std::vector<float> values;
};
}  // namespace my

template <> struct herd::tensor_traits<my::Tensor> {
  static void* data(my::Tensor& t) { return t.values.data(); }
  static std::size_t size(const my::Tensor& t) { return t.values.size(); }
  static herd::dtype dtype(const my::Tensor&) { return herd::dtype::f32; }
  static herd::device device(const my::Tensor&) { return herd::device::cpu(); }
};

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  my::Tensor t{std::vector<float>(1000, static_cast<float>(comm.rank()))};
  herd::allreduce(t, comm, herd::reduce_op::avg);
  const float expected = static_cast<float>(comm.size() - 1) / 2.0f;
  const bool ok = t.values.front() == expected && t.values.back() == expected;
  if (comm.rank() == 0) std::printf("consumer: average of ranks = %g (%s)\n", static_cast<double>(t.values.back()), ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
