// What the programs that run docs/' code blocks share (snippets.cpp, torch_snippets.cpp): the
// counts of blocks run and of checks failed, and main's frame around the blocks.
#ifndef HERD_TESTS_DOCS_SNIPPET_CHECKS_HPP
#define HERD_TESTS_DOCS_SNIPPET_CHECKS_HPP

#include <herd/herd.hpp>

#include <cstdio>
#include <string>

namespace snippet_checks {

inline int failures = 0;
inline int blocks = 0;

inline void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
  }
}

// main: runs body(comm) on a communicator whose hang fails the test (20 s) rather than blocking
// it, then prints "rank R: N <blocks_name> of docs/ ran and checked" if every check held.
template <class Body> int run_blocks(int argc, char** argv, const char* blocks_name, Body&& body) {
  herd::mpi::environment env(argc, argv);
  herd::comm_options options;
  options.stall_shutdown_seconds = 20;
  herd::mpi_communicator comm(MPI_COMM_WORLD, options);
  body(comm);
  if (failures == 0) std::printf("rank %d: %d %s of docs/ ran and checked\n", comm.rank(), blocks, blocks_name);
  return failures == 0 ? 0 : 1;
}

}  // namespace snippet_checks

#endif  // HERD_TESTS_DOCS_SNIPPET_CHECKS_HPP
