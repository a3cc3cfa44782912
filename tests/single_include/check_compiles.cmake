# Passes only if SOURCE compiles (syntax and templates checked, nothing built) with exactly the
# include folders given: used to show that a header stands alone.
#
#   cmake -DCOMPILER=g++ -DSOURCE=t.cpp -DINCLUDE_DIRS="single_include;/usr/include/eigen3"
#         [-DDEFINES="HERD_NO_MPI"] -P tests/single_include/check_compiles.cmake

foreach(required COMPILER SOURCE)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "check_compiles: pass -D${required}=...")
  endif()
endforeach()
# A list handed through add_test arrives with its separators escaped (a\;b): make it a list again.
string(REPLACE "\\;" ";" INCLUDE_DIRS "${INCLUDE_DIRS}")
string(REPLACE "\\;" ";" DEFINES "${DEFINES}")
set(flags -std=c++20 -fsyntax-only)
foreach(dir IN LISTS INCLUDE_DIRS)
  if(NOT dir STREQUAL "")
    list(APPEND flags "-I${dir}")
  endif()
endforeach()
foreach(define IN LISTS DEFINES)
  list(APPEND flags "-D${define}")
endforeach()
execute_process(COMMAND "${COMPILER}" ${flags} "${SOURCE}" RESULT_VARIABLE result OUTPUT_VARIABLE output
                ERROR_VARIABLE output)
list(JOIN flags " " flags_text)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "check_compiles: ${SOURCE} does not compile:\n  ${COMPILER} ${flags_text} ${SOURCE}\n${output}")
endif()
message(STATUS "check_compiles: ${SOURCE} compiles with only its own include folders")
