// A program built with HERD_SEPARATE_COMPILATION: two files that call collectives and one
// implementation file. Run under mpiexec; every rank checks every result.
#include <herd/herd.hpp>

#include <cstdio>
#include <string>

std::string check_every_collective(herd::mpi_communicator& comm);

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  const std::string wrong = check_every_collective(comm);
  std::printf("rank %d of %d: %s\n", comm.rank(), comm.size(), wrong.empty() ? "every collective right" : ("wrong: " + wrong).c_str());
  return wrong.empty() ? 0 : 1;
}
