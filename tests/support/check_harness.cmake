# cmake -DMPIEXEC=... -DTESTS=<mpi_tests binary> -P check_harness.cmake
# Runs the harness self-check on 2 ranks: the run must fail, rank 1 must print its failure with
# its prefix, and only rank 0 may print a summary.
execute_process(COMMAND ${MPIEXEC} -n 2 ${TESTS} "--test-case=harness self-check*" --no-skip
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE code)
set(all "${out}${err}")
string(REGEX MATCHALL "\\[doctest\\] test cases:" summaries "${all}")
list(LENGTH summaries summary_count)
if(code EQUAL 0)
  message(FATAL_ERROR "a failure on rank 1 alone did not fail the run:\n${all}")
endif()
if(NOT all MATCHES "\\[rank 1\\][^\n]*ERROR: CHECK\\( rank != 1 \\)")
  message(FATAL_ERROR "rank 1 did not report its failure with its prefix:\n${all}")
endif()
if(NOT all MATCHES "\\[herd\\] 2 ranks ran these tests; 1 failed")
  message(FATAL_ERROR "rank 0 did not report that one rank failed:\n${all}")
endif()
if(NOT summary_count EQUAL 1)
  message(FATAL_ERROR "expected one summary (rank 0's), found ${summary_count}:\n${all}")
endif()
message(STATUS "harness: the failure on rank 1 alone failed the run (exit ${code}); one summary printed")
