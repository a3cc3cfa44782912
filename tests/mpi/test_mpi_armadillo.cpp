// Armadillo's dense objects as herd tensors (herd/tensor/armadillo.hpp) on MPI ranks: allreduce
// of Mat, Col, Row, Cube, fixed sizes, imat's 64-bit integers, subviews of whole columns and a
// cube's slice in place; broadcast and allgather; subviews with gaps refused on every rank; the
// distributed optimizer over Armadillo gradients; a checkpoint of a matrix and a cube in row-major order.

#include <armadillo>

#include <herd/herd.hpp>
#include <herd/tensor/armadillo.hpp>

#include "../support/mpi_test.hpp"

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

HERD_MPI_TEST_CASE("Armadillo matrices, vectors, cubes and column subviews allreduce as herd tensors", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  arma::fmat m(7, 5);
  m.fill(static_cast<float>(r + 1));
  herd::allreduce(m, comm);
  CHECK(arma::all(arma::vectorise(m) == static_cast<float>(p * (p + 1) / 2)));

  arma::vec column = arma::regspace(0.0, 4.0) + r;
  herd::allreduce(column, comm, herd::reduce_op::max);
  CHECK(column(4) == 4.0 + (p - 1));

  arma::Row<std::int32_t> row(6);
  row.fill(r);
  herd::allreduce(row, comm);
  CHECK(row(5) == p * (p - 1) / 2);

  // imat's elements are long long, taken as int64: sums past 32 bits stay exact.
  arma::imat big(2, 2);
  big.fill((1LL << 40) + r);
  herd::allreduce(big, comm);
  CHECK(big(1, 1) == p * (1LL << 40) + p * (p - 1) / 2);

  // Armadillo's signed 8-bit type (arma::s8) is char, neither int8_t nor uint8_t: taken as i8.
  arma::Mat<char> small(3, 2);
  small.fill(static_cast<char>(-r));
  CHECK(herd::view_of(small).type == herd::dtype::i8);
  herd::allreduce(small, comm, herd::reduce_op::min);
  CHECK(small(2, 1) == static_cast<char>(-(p - 1)));

  arma::cube cube(2, 3, 4);
  cube.fill(1.0);
  herd::allreduce(cube, comm);
  CHECK(cube(1, 2, 3) == p);

  arma::mat::fixed<3, 3> fixed;
  fixed.fill(r);
  herd::broadcast(fixed, comm, p - 1);
  CHECK(fixed(2, 2) == p - 1);

  arma::mat whole(4, 4, arma::fill::ones);
  auto middle = whole.cols(1, 2);  // whole columns: one block of column-major memory
  herd::allreduce(middle, comm);
  CHECK(whole(3, 2) == p);
  CHECK(whole(3, 3) == 1.0);
  CHECK(whole(0, 0) == 1.0);
  auto part = whole.col(3).rows(1, 2);  // part of one column
  herd::allreduce(part, comm);
  CHECK(whole(2, 3) == p);
  CHECK(whole(3, 3) == 1.0);

  arma::fcube layers(2, 2, 3, arma::fill::zeros);
  layers.slice(1).fill(1.0f);
  herd::allreduce(layers.slice(1), comm);  // a slice is a Mat over the cube's memory
  CHECK(layers(1, 1, 1) == static_cast<float>(p));
  CHECK(layers(1, 1, 2) == 0.0f);
  auto last_two = layers.slices(1, 2);
  herd::allreduce(last_two, comm, herd::reduce_op::min);
  CHECK(layers(0, 0, 1) == static_cast<float>(p));

  const arma::vec in(5, arma::fill::ones);
  arma::vec out(5);
  herd::allreduce(in, out, comm, herd::reduce_op::avg);
  CHECK(out(4) == 1.0);

  const arma::Col<std::int32_t> mine = {r, 10 * r};
  arma::Mat<std::int32_t> gathered(2, static_cast<arma::uword>(p));  // rank i's pair is column i
  herd::allgather(mine, gathered, comm);
  CHECK(gathered(1, static_cast<arma::uword>(p - 1)) == 10 * (p - 1));
}

HERD_MPI_TEST_CASE("Armadillo subviews with gaps are refused, and every rank is told", 1) {
  herd::mpi_communicator comm;
  arma::mat m(4, 4, arma::fill::ones);
  arma::cube c(2, 3, 4, arma::fill::ones);
  const std::vector<std::function<void()>> refused = {  // 4 elements each, as the other ranks pass
      [&] { auto row = m.row(1); herd::allreduce(row, comm); },
      [&] { auto block = m.submat(0, 0, 1, 1); herd::allreduce(block, comm); },
      [&] { auto tube = c.tube(0, 0); herd::allreduce(tube, comm); },  // one element of each slice
  };
  for (const auto& pass : refused) {
    arma::vec fine(4, arma::fill::ones);
    std::string message;
    try {
      if (comm.rank() == 0) pass();
      else herd::allreduce(fine, comm);
    } catch (const herd::error& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find(comm.rank() == 0 ? "does not hold its elements back to back"
                                        : "rank 0 passed a tensor its adapter rejected") != std::string::npos);
  }
  CHECK(arma::all(arma::vectorise(m) == 1.0));
  CHECK(arma::all(arma::vectorise(c) == 1.0));
  std::vector<float> after(3, 1.0f);  // the communicator goes on
  herd::allreduce(after, comm);
  CHECK(after[0] == static_cast<float>(comm.size()));
}

HERD_MPI_TEST_CASE("the distributed optimizer over Armadillo parameters and gradients", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  arma::fmat w(8, 3, arma::fill::zeros), gw(8, 3);
  arma::fvec b(8, arma::fill::zeros), gb(8);
  herd::sgd sgd(herd::views(w, b), herd::views(gw, gb), {.lr = 1.0});
  herd::distributed_optimizer opt(sgd, herd::views(gw, gb), comm);
  gw.fill(static_cast<float>(comm.rank() + 1));
  gb.fill(static_cast<float>(2 * (comm.rank() + 1)));
  opt.step();
  const float mean = static_cast<float>(p + 1) / 2;
  CHECK(arma::all(arma::vectorise(w) == -mean));
  CHECK(arma::all(b == -2 * mean));
}

// A checkpoint writes Armadillo's column-major objects in row-major order of their own shape, as
// PyTorch reads a file: a matrix's (i, j) and a cube's (i, j, k) land where t[i][j] and t[i][j][k]
// do, and load back into the same objects on every rank.
HERD_MPI_TEST_CASE("Armadillo matrices and cubes in a checkpoint: (i, j) is t[i][j] in the file", 1) {
  herd::mpi_communicator comm;
  arma::fmat m(3, 2);
  arma::fcube c(2, 3, 4);
  for (arma::uword i = 0; i < 3; ++i)
    for (arma::uword j = 0; j < 2; ++j) m(i, j) = static_cast<float>(10 * i + j);
  for (arma::uword i = 0; i < 2; ++i)
    for (arma::uword j = 0; j < 3; ++j)
      for (arma::uword k = 0; k < 4; ++k) c(i, j, k) = static_cast<float>(100 * i + 10 * j + k);
  const std::string path = "herd_armadillo_checkpoint_" + std::to_string(::getpid()) + ".safetensors";
  std::string shared = path;
  herd::broadcast_object(shared, comm, 0);  // rank 0's name on every rank
  herd::checkpoint out;
  out.add("m", m, {3, 2}).add("c", c, {2, 3, 4});
  out.save(shared, comm);

  std::vector<float> m_rows(6), c_rows(24);
  herd::checkpoint flat;
  flat.add("m", m_rows).add("c", c_rows);
  REQUIRE(flat.load(shared, comm));
  CHECK(m_rows == std::vector<float>{0, 1, 10, 11, 20, 21});
  bool cube_in_order = true;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) cube_in_order &= c_rows[static_cast<std::size_t>(12 * i + 4 * j + k)] == static_cast<float>(100 * i + 10 * j + k);
  CHECK(cube_in_order);

  arma::fmat m_back(3, 2, arma::fill::zeros);
  arma::fcube c_back(2, 3, 4, arma::fill::zeros);
  herd::checkpoint in;
  in.add("m", m_back).add("c", c_back);
  REQUIRE(in.load(shared, comm));
  CHECK(arma::approx_equal(m_back, m, "absdiff", 0.0f));
  CHECK(arma::approx_equal(c_back, c, "absdiff", 0.0f));
  herd::barrier(comm);
  if (comm.rank() == 0) std::remove(shared.c_str());
}
