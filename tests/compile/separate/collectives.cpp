// Every collective that separate compilation covers, called from a file compiled with
// HERD_SEPARATE_COMPILATION: the engine behind them comes from the implementation file, the herd.cpp of docs/building.md.
#include <herd/herd.hpp>

#include <cstddef>
#include <string>
#include <vector>

std::string check_every_collective(herd::mpi_communicator& comm) {
  const int p = comm.size();
  const int r = comm.rank();
  std::string wrong;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) wrong += std::string(what) + " ";
  };
  std::vector<float> v(3000, static_cast<float>(r + 1));  // large enough for the ring or shared memory
  herd::allreduce(v, comm);
  expect(v.front() == static_cast<float>(p * (p + 1) / 2) && v.back() == v.front(), "allreduce");
  std::vector<double> a(5, 1.0), b(7, 2.0);
  herd::allreduce(herd::views(a, b), comm, herd::reduce_op::avg);
  expect(a[4] == 1.0 && b[6] == 2.0, "grouped allreduce");
  std::vector<int> root_value(4, r == 0 ? 42 : 0);
  herd::broadcast(root_value, comm, 0);
  expect(root_value[3] == 42, "broadcast");
  std::vector<int> mine(2, r), all(2 * static_cast<std::size_t>(p));
  herd::allgather(mine, all, comm);
  expect(all.back() == p - 1, "allgather");
  std::vector<float> whole(2 * static_cast<std::size_t>(p), 1.0f), part(2);
  herd::reduce_scatter(whole, part, comm);
  expect(part[1] == static_cast<float>(p), "reduce_scatter");
  std::vector<int> gathered(r == 0 ? 2 * static_cast<std::size_t>(p) : 0);
  herd::gather(mine, gathered, comm, 0);
  expect(r != 0 || gathered.back() == p - 1, "gather");
  std::vector<int> pieces(r == 0 ? 2 * static_cast<std::size_t>(p) : 0, 7), piece(2);
  herd::scatter(pieces, piece, comm, 0);
  expect(piece[0] == 7, "scatter");
  std::vector<int> total(r == 0 ? 2 : 0);
  herd::reduce(mine, total, comm, herd::reduce_op::sum, 0);
  expect(r != 0 || total[0] == p * (p - 1) / 2, "reduce");
  // An _async form: the queue that runs it comes from the implementation file.
  std::vector<float> later(3000, static_cast<float>(r + 1));
  herd::allreduce_async(later, comm).wait();
  expect(later[2999] == static_cast<float>(p * (p + 1) / 2), "allreduce_async");
  herd::barrier(comm);
  return wrong;
}
