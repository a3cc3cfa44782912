// Must NOT compile: herd includes <mpi.h> without MPI's C++ bindings unless the program asks for
// them (comm/detail/mpi_header.hpp), so MPI::COMM_WORLD is undeclared.

#include <herd/comm/mpi.hpp>

int main() { return MPI::COMM_WORLD.Get_rank(); }
