// Must NOT compile: herd has no complex dtype, and herd/tensor/armadillo.hpp says so for
// Armadillo's complex types. check_compile_fails.cmake runs the compiler on it.

#include <armadillo>

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/armadillo.hpp>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    arma::cx_mat z(2, 2, arma::fill::zeros);
    herd::allreduce(z, comm);
  });
}
