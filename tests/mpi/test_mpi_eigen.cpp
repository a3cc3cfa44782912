// Eigen's dense objects as herd tensors (herd/tensor/eigen.hpp) on MPI ranks: allreduce of
// matrices of either storage order, arrays, fixed sizes, Maps and Refs; a strided view refused on
// every rank; the distributed optimizer over Eigen gradients.

#include <Eigen/Core>

#include <herd/herd.hpp>
#include <herd/tensor/eigen.hpp>

#include "../support/mpi_test.hpp"

#include <string>
#include <vector>

HERD_MPI_TEST_CASE("Eigen matrices, arrays, maps and refs allreduce as herd tensors", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  const double r = comm.rank();
  Eigen::MatrixXf m = Eigen::MatrixXf::Constant(7, 5, static_cast<float>(r + 1));
  herd::allreduce(m, comm);
  CHECK(m.isConstant(static_cast<float>(p * (p + 1) / 2)));

  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> row_major(3, 4);
  for (int i = 0; i < 12; ++i) row_major.data()[i] = i + r;
  herd::allreduce(row_major, comm, herd::reduce_op::max);
  CHECK(row_major(2, 3) == 11 + (p - 1));

  Eigen::ArrayXi ints = Eigen::ArrayXi::Constant(9, comm.rank());
  herd::allreduce(ints, comm, herd::reduce_op::sum);
  CHECK((ints == p * (p - 1) / 2).all());

  Eigen::Matrix4d fixed = Eigen::Matrix4d::Identity() * (r + 1);
  herd::broadcast(fixed, comm, p - 1);
  CHECK(fixed(3, 3) == p);

  std::vector<float> storage(6, 1.0f);
  Eigen::Map<Eigen::VectorXf> map(storage.data(), 6);
  herd::allreduce(map, comm);
  CHECK(storage[5] == static_cast<float>(p));

  Eigen::MatrixXf whole = Eigen::MatrixXf::Ones(4, 3);
  Eigen::Ref<Eigen::VectorXf> column = whole.col(1);  // a column of a column-major matrix: contiguous
  herd::allreduce(column, comm);
  CHECK(whole(3, 1) == static_cast<float>(p));
  CHECK(whole(3, 2) == 1.0f);

  // A 1x4 column-major Map whose inner stride never steps (one element per column): back to back.
  std::vector<float> row_storage(4, 1.0f);
  Eigen::Map<Eigen::MatrixXf, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>> one_row(row_storage.data(), 1, 4,
                                                                                        Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(1, 7));
  herd::allreduce(one_row, comm);
  CHECK(row_storage[3] == static_cast<float>(p));

  const Eigen::VectorXf in = Eigen::VectorXf::Constant(5, 2.0f);
  Eigen::VectorXf out(5);
  herd::allreduce(in, out, comm, herd::reduce_op::avg);
  CHECK(out.isConstant(2.0f));
}

HERD_MPI_TEST_CASE("an Eigen view with gaps is refused, and every rank is told", 1) {
  herd::mpi_communicator comm;
  Eigen::MatrixXf big = Eigen::MatrixXf::Ones(6, 6);
  Eigen::MatrixXf fine = Eigen::MatrixXf::Ones(3, 3);
  std::string message;
  try {
    if (comm.rank() == 0) {
      Eigen::Ref<Eigen::MatrixXf, 0, Eigen::OuterStride<>> block = big.block(1, 1, 3, 3);  // rows 1-3 of 6: gaps
      herd::allreduce(block, comm);
    } else {
      herd::allreduce(fine, comm);
    }
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(comm.rank() == 0 ? "does not hold its elements back to back" : "rank 0 passed a tensor its adapter rejected") !=
        std::string::npos);
  std::vector<float> after(3, 1.0f);  // the communicator goes on
  herd::allreduce(after, comm);
  CHECK(after[0] == static_cast<float>(comm.size()));
}

HERD_MPI_TEST_CASE("the distributed optimizer over Eigen parameters and gradients", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  Eigen::MatrixXf w = Eigen::MatrixXf::Zero(8, 3), gw(8, 3);
  Eigen::VectorXf b = Eigen::VectorXf::Zero(8), gb(8);
  herd::sgd sgd(herd::views(w, b), herd::views(gw, gb), {.lr = 1.0});
  herd::distributed_optimizer opt(sgd, herd::views(gw, gb), comm);
  gw.setConstant(static_cast<float>(comm.rank() + 1));
  gb.setConstant(static_cast<float>(2 * (comm.rank() + 1)));
  opt.step();
  const float mean = static_cast<float>(p + 1) / 2;
  CHECK(w.isConstant(-mean));
  CHECK(b.isConstant(-2 * mean));
}
