// xtensor's containers and views as herd tensors (herd/tensor/xtensor.hpp) on MPI ranks:
// allreduce of either layout, fixed shapes, adaptors, a row view and a transposed view in place;
// broadcast and allgather; a view with gaps refused on every rank; the distributed optimizer over
// xtensor gradients; a checkpoint of a column-major array and a transposed view in row-major order.

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xfixed.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include <herd/herd.hpp>
#include <herd/tensor/xtensor.hpp>

#include "../support/mpi_test.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

HERD_MPI_TEST_CASE("xtensor containers, adaptors and contiguous views allreduce as herd tensors", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  const int r = comm.rank();
  xt::xarray<float> a = xt::xarray<float>::from_shape({3, 4});
  a.fill(static_cast<float>(r + 1));
  herd::allreduce(a, comm);
  CHECK(a(2, 3) == static_cast<float>(p * (p + 1) / 2));

  // Memory order is the same on every rank, so (i, j) meets (i, j) in either layout.
  xt::xarray<double, xt::layout_type::column_major> col_major = xt::xarray<double>::from_shape({3, 2});
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 2; ++j) col_major(i, j) = static_cast<double>(10 * i + j + static_cast<std::size_t>(r));
  herd::allreduce(col_major, comm, herd::reduce_op::max);
  CHECK(col_major(2, 1) == 21.0 + (p - 1));
  CHECK(col_major(1, 0) == 10.0 + (p - 1));

  xt::xtensor<std::int32_t, 3> ints({2, 3, 2}, r);
  herd::allreduce(ints, comm, herd::reduce_op::sum);
  CHECK(ints(1, 2, 1) == p * (p - 1) / 2);

  xt::xtensor_fixed<double, xt::xshape<2, 2>> fixed = {{1.0 * r, 2.0}, {3.0, 4.0 * r}};
  herd::broadcast(fixed, comm, p - 1);
  CHECK(fixed(1, 1) == 4.0 * (p - 1));

  std::vector<float> storage(6, 1.0f);
  auto over_vector = xt::adapt(storage, {2, 3});
  herd::allreduce(over_vector, comm);
  CHECK(storage[5] == static_cast<float>(p));
  auto over_pointer = xt::adapt(storage.data(), storage.size(), xt::no_ownership(), std::vector<std::size_t>{6});
  herd::allreduce(over_pointer, comm, herd::reduce_op::min);
  CHECK(storage[0] == static_cast<float>(p));

  xt::xarray<float> whole = xt::zeros<float>({3, 4});
  auto row = xt::view(whole, 1);  // a row of a row-major array: contiguous
  row.fill(1.0f);
  herd::allreduce(row, comm);
  CHECK(whole(1, 3) == static_cast<float>(p));
  CHECK(whole(2, 3) == 0.0f);

  xt::xtensor<float, 2> square = xt::zeros<float>({2, 3});
  square(0, 2) = static_cast<float>(r);
  auto transposed = xt::transpose(square);  // column-major over the same memory
  herd::allreduce(transposed, comm);
  CHECK(square(0, 2) == static_cast<float>(p * (p - 1) / 2));

  const std::vector<double> values(4, 2.0);
  const auto read_only = xt::adapt(values.data(), values.size(), xt::no_ownership(), std::vector<std::size_t>{4});
  auto mean = xt::xtensor<double, 1>::from_shape({4});  // not mean({4}): that is one element, 4
  herd::allreduce(read_only, mean, comm, herd::reduce_op::avg);
  CHECK(mean(3) == 2.0);

  const xt::xtensor<std::int64_t, 1> mine = {r, 10 * r};
  xt::xtensor<std::int64_t, 2> gathered({static_cast<std::size_t>(p), 2});
  herd::allgather(mine, gathered, comm);
  CHECK(gathered(static_cast<std::size_t>(p - 1), 1) == 10 * (p - 1));
}

HERD_MPI_TEST_CASE("an xtensor view with gaps is refused, and every rank is told", 1) {
  herd::mpi_communicator comm;
  xt::xarray<float> big = xt::ones<float>({4, 3});
  xt::xarray<float> fine = xt::ones<float>({4});
  std::string message;
  try {
    if (comm.rank() == 0) {
      auto column = xt::view(big, xt::all(), 1);  // a column of a row-major array: stride 3
      herd::allreduce(column, comm);
    } else {
      herd::allreduce(fine, comm);
    }
  } catch (const herd::error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(comm.rank() == 0 ? "does not hold its elements back to back" : "rank 0 passed a tensor its adapter rejected") !=
        std::string::npos);
  CHECK(big(3, 1) == 1.0f);
  std::vector<float> after(3, 1.0f);  // the communicator goes on
  herd::allreduce(after, comm);
  CHECK(after[0] == static_cast<float>(comm.size()));
}

HERD_MPI_TEST_CASE("the distributed optimizer over xtensor parameters and gradients", 1) {
  herd::mpi_communicator comm;
  const int p = comm.size();
  xt::xtensor<float, 2> w = xt::zeros<float>({8, 3});
  xt::xtensor<float, 2> gw({8, 3});
  xt::xtensor<float, 1> b = xt::zeros<float>({8});
  auto gb = xt::xtensor<float, 1>::from_shape({8});
  herd::sgd sgd(herd::views(w, b), herd::views(gw, gb), {.lr = 1.0});
  herd::distributed_optimizer opt(sgd, herd::views(gw, gb), comm);
  gw.fill(static_cast<float>(comm.rank() + 1));
  gb.fill(static_cast<float>(2 * (comm.rank() + 1)));
  opt.step();
  const float mean = static_cast<float>(p + 1) / 2;
  CHECK(w(7, 2) == -mean);
  CHECK(w(0, 0) == -mean);
  CHECK(b(7) == -2 * mean);
}

// A checkpoint writes a column-major array, and a transposed view of a row-major one, in
// row-major order of their own shape: (i, j) is t[i][j] in the file, as PyTorch reads it.
HERD_MPI_TEST_CASE("xtensor of either layout in a checkpoint: (i, j) is t[i][j] in the file", 1) {
  herd::mpi_communicator comm;
  xt::xtensor<float, 2, xt::layout_type::column_major> column_major({3, 2});
  xt::xtensor<float, 2> row_major({2, 3});
  for (std::size_t i = 0; i < 3; ++i) {
    for (std::size_t j = 0; j < 2; ++j) {
      column_major(i, j) = static_cast<float>(10 * i + j);
      row_major(j, i) = static_cast<float>(10 * i + j);  // its transpose is the same 3x2 matrix
    }
  }
  auto transposed = xt::transpose(row_major);
  std::string path = "herd_xtensor_checkpoint_" + std::to_string(::getpid()) + ".safetensors";
  herd::broadcast_object(path, comm, 0);  // rank 0's name on every rank
  herd::checkpoint out;
  out.add("column_major", column_major, {3, 2}).add("transposed", transposed, {3, 2});
  out.save(path, comm);

  std::vector<float> a(6), b(6);
  herd::checkpoint flat;
  flat.add("column_major", a).add("transposed", b);
  REQUIRE(flat.load(path, comm));
  CHECK(a == std::vector<float>{0, 1, 10, 11, 20, 21});
  CHECK(b == a);

  xt::xtensor<float, 2, xt::layout_type::column_major> back = xt::zeros<float>({3, 2});
  herd::checkpoint in;
  in.add("column_major", back).add("transposed", transposed);
  row_major.fill(-1.0f);
  REQUIRE(in.load(path, comm));
  CHECK(back == column_major);
  CHECK(row_major(1, 2) == 21.0f);
  herd::barrier(comm);
  if (comm.rank() == 0) std::remove(path.c_str());
}
