// Must NOT compile: an Armadillo expression (here a transpose) holds no block of memory, so
// herd/tensor/armadillo.hpp stops it with its own words ("holds no block of memory") instead of
// a wall of template errors. check_compile_fails.cmake runs the compiler on it.

#include <armadillo>

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/armadillo.hpp>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    arma::mat a(2, 3, arma::fill::ones), out(3, 2);
    herd::allreduce(a.t(), out, comm);
  });
}
