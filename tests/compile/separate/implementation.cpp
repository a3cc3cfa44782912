// The program's one implementation file: herd's collectives engine for mpi_communicator is
// compiled here, and only here (see <herd/collectives/separate_compilation.hpp>).
#define HERD_IMPLEMENTATION
#include <herd/herd.hpp>
