// Built with only single_include/ on the include path: the generated header stands alone.
#include <herd/herd.hpp>

#include "../support/mpi_test.hpp"

#include <vector>

HERD_MPI_TEST_CASE("the single header gives the collectives on MPI and on threads", 1) {
  herd::mpi_communicator comm;
  std::vector<float> v(1000, static_cast<float>(comm.rank() + 1));
  herd::allreduce(v, comm, herd::reduce_op::avg);
  CHECK(v[999] == static_cast<float>(comm.size() + 1) / 2.0f);

  herd::local::run(3, [](herd::local_communicator& local) {
    std::vector<herd::half> h(5, herd::half(1.0f));
    herd::allreduce(h, local);
    CHECK(static_cast<float>(h[4]) == 3.0f);
  });
}
