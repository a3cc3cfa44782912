# cmake -DMODE=find_package|add_subdirectory|fetch_content -DHERD_SOURCE_DIR=... -DHERD_BINARY_DIR=...
#       -DWORK_DIR=... -DCXX_COMPILER=... -DMPIEXEC=... -P run_consumer.cmake
# Configures, builds and runs tests/consumer/project against herd taken the MODE way.
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE code)
  if(NOT code EQUAL 0)
    list(JOIN ARGV " " line)
    message(FATAL_ERROR "consumer (${MODE}): this step failed (${code}): ${line}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(options -DHERD_CONSUME=${MODE} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${HERD_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND options -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND options -DHERD_SOURCE_DIR=${HERD_SOURCE_DIR})
else()
  file(MAKE_DIRECTORY ${WORK_DIR})
  execute_process(COMMAND ${CMAKE_COMMAND} -E tar czf ${WORK_DIR}/herd.tar.gz CMakeLists.txt cmake include
                  WORKING_DIRECTORY ${HERD_SOURCE_DIR} RESULT_VARIABLE code)
  list(APPEND options -DHERD_ARCHIVE=${WORK_DIR}/herd.tar.gz)
endif()
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/project -B ${WORK_DIR}/build ${options})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${MPIEXEC} -n 2 ${WORK_DIR}/build/consumer)
