// Must NOT compile: an Eigen expression handed to a collective has to stop at herd's
// message saying to evaluate it into a Matrix first.

#include <Eigen/Core>
#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/eigen.hpp>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    Eigen::MatrixXf m = Eigen::MatrixXf::Ones(4, 4);
    auto sum = m + m;
    herd::allreduce(sum, comm);
  });
}
