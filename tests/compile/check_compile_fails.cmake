# Passes only if SOURCE fails to compile and the compiler's output contains EXPECT.
#
#   cmake -DCOMPILER=g++ -DSOURCE=tests/compile/unadapted_tensor.cpp -DINCLUDE_DIRS="include;/other"
#         -DEXPECT="this tensor type is not adapted" -P tests/compile/check_compile_fails.cmake
#
# -fsyntax-only: the checks under test are static_asserts, so nothing needs to be built.
# FLAGS (a list) replaces the default "-std=c++20;-fsyntax-only", e.g. for another standard or nvcc.

foreach(required COMPILER SOURCE EXPECT)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "check_compile_fails: pass -D${required}=...")
  endif()
endforeach()
if(NOT EXISTS "${SOURCE}")
  message(FATAL_ERROR "check_compile_fails: no such source file: ${SOURCE}")
endif()

# A list handed through add_test arrives with its separators escaped (a\;b): make it a list again.
string(REPLACE "\\;" ";" INCLUDE_DIRS "${INCLUDE_DIRS}")
set(include_flags)
foreach(dir IN LISTS INCLUDE_DIRS)
  if(NOT dir STREQUAL "")
    list(APPEND include_flags "-I${dir}")
  endif()
endforeach()

if(NOT DEFINED FLAGS)
  set(FLAGS -std=c++20 -fsyntax-only)
endif()
string(REPLACE "\\;" ";" FLAGS "${FLAGS}")

execute_process(
  COMMAND "${COMPILER}" ${FLAGS} ${include_flags} "${SOURCE}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)

list(JOIN include_flags " " flags_text)
list(JOIN FLAGS " " compile_flags_text)
set(command "${COMPILER} ${compile_flags_text} ${flags_text} ${SOURCE}")

# result is 0 on success, a non-zero code on failure, or a message when the compiler did not run:
# only a non-zero number counts as "failed to compile".
if(NOT result MATCHES "^[0-9]+$")
  message(FATAL_ERROR "check_compile_fails: could not run the compiler (${result}):\n  ${command}")
endif()
if(result EQUAL 0)
  message(FATAL_ERROR "check_compile_fails: ${SOURCE} compiled, but it must not.\n  ${command}\n${output}")
endif()
string(FIND "${output}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "check_compile_fails: ${SOURCE} failed to compile, but not with \"${EXPECT}\".\n"
                      "  ${command}\n${output}")
endif()
message(STATUS "check_compile_fails: ${SOURCE} fails to compile with \"${EXPECT}\", as it must")
