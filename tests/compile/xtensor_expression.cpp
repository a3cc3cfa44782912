// Must NOT compile: an xtensor expression (here a + b) has no storage for herd to read, so
// herd/tensor/xtensor.hpp stops it with its own words ("has no storage of its own") instead of
// errors from deep inside xtensor. check_compile_fails.cmake runs the compiler on it.

#include <xtensor/xarray.hpp>

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/xtensor.hpp>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    xt::xarray<float> a = {1.0f, 2.0f}, b = {3.0f, 4.0f}, sum = {0.0f, 0.0f};
    herd::allreduce(a + b, sum, comm);
  });
}
