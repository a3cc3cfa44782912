# herd_add_mpi_test(NAME <name> TARGET <target> RANKS <n>... [TIMEOUT <s>] [ARGS ...])
# Adds one ctest per rank count, <name>_np<n>, running the target under mpiexec with n ranks.
# A collective that waits on a missing peer raises herd::error after 30 s instead of hanging.
function(herd_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "RANKS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${T_NAME}_np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    set_tests_properties(${T_NAME}_np${n} PROPERTIES TIMEOUT ${T_TIMEOUT} PROCESSORS ${n}
                         ENVIRONMENT "HERD_STALL_SHUTDOWN_TIME_SECONDS=30;ASAN_OPTIONS=detect_leaks=0")
  endforeach()
endfunction()
