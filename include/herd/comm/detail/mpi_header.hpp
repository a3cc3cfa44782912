#ifndef HERD_COMM_DETAIL_MPI_HEADER_HPP
#define HERD_COMM_DETAIL_MPI_HEADER_HPP
// <mpi.h>, without the C++ bindings (MPI::Comm and the rest) that MPICH's and older Open MPI's
// headers still bring by default. MPI-2.2 deprecated them and MPI-3.0 removed them from the
// standard; herd calls the C functions only, and parsing the bindings cost every file that
// includes herd about 0.2 s (benchmarks/RESULTS.md, compile times). A program that still uses
// them defines HERD_MPI_CXX_BINDINGS, or includes <mpi.h> before herd: either way it gets them.

#if !defined(HERD_MPI_CXX_BINDINGS)
#if !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#if !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#endif

#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI declares MPIX_Query_cuda_support here
#endif

#endif  // HERD_COMM_DETAIL_MPI_HEADER_HPP
