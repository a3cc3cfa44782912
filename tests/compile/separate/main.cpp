// A program built with HERD_SEPARATE_COMPILATION: three files that call collectives, the
// distributed optimizer and checkpoints, and one implementation file. Run under mpiexec; every
// rank checks every result.
#include <herd/herd.hpp>

#include <cstdio>
#include <string>

std::string check_every_collective(herd::mpi_communicator& comm);
std::string check_training(herd::mpi_communicator& comm);

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  const std::string wrong = check_every_collective(comm) + check_training(comm);
  std::printf("rank %d of %d: %s\n", comm.rank(), comm.size(),
              wrong.empty() ? "every collective and the training layer right" : ("wrong: " + wrong).c_str());
  return wrong.empty() ? 0 : 1;
}
