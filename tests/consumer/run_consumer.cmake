# cmake -DHERD_BINARY_DIR=... -DWORK_DIR=... -DCXX_COMPILER=... -DMPIEXEC=... -P run_consumer.cmake
# Installs herd from its build folder into a prefix under WORK_DIR, then configures and builds
# tests/consumer/cuda_project, a .cu program that finds herd::nccl in the installed package, and runs
# it on 2 ranks (its host part needs no GPU).
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE code)
  if(NOT code EQUAL 0)
    list(JOIN ARGV " " line)
    message(FATAL_ERROR "consumer (find_package_cuda): this step failed (${code}): ${line}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${HERD_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/cuda_project -B ${WORK_DIR}/build -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${MPIEXEC} -n 2 ${WORK_DIR}/build/consumer)
