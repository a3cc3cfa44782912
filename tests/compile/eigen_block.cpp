// Must NOT compile: a block of an Eigen matrix handed to a collective has to stop at herd's
// message saying what to pass instead (a Ref, a Map, or a copy), not at "not adapted".

#include <Eigen/Core>
#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/eigen.hpp>

int main() {
  herd::local::run(2, [](herd::local_communicator& comm) {
    Eigen::MatrixXf m = Eigen::MatrixXf::Ones(4, 4);
    auto block = m.block(0, 0, 2, 2);
    herd::allreduce(block, comm);
  });
}
