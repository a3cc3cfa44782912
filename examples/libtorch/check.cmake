# Smoke tests of libtorch_mnist, run by ctest as
#   cmake -DMODE=<mode> -DMPIEXEC=<mpiexec> -DNP_FLAG=<-n> -DPROGRAM=<libtorch_mnist> -DWORK_DIR=<dir> -P check.cmake
# MODE:
#   smoke         2 ranks, 1 epoch on 2000 samples, with --checkpoint: exit 0, the final accuracy
#                 and summary lines, and the checkpoint file
#   missing_data  --data at an empty directory: exit 1, a message naming the path and the package
#   usage         an unknown flag: exit 2 and the usage text
#   reproducible  4 ranks, HERD_REPRODUCIBLE=1: the same parameters digest whatever the algorithm
#                 (ring, shared memory, hierarchical over 2 simulated nodes), the DDP wrapper's bucket
#                 size and the reduction (DDP wrapper or distributed_optimizer); without the mode, ring
#                 and shared memory differ (so the comparison can see a difference)
# A script rather than PASS_REGULAR_EXPRESSION, which would make ctest ignore the exit status.
cmake_minimum_required(VERSION 3.21)

foreach(var MODE MPIEXEC NP_FLAG PROGRAM WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is missing")
  endif()
endforeach()

# Runs the program on ${ranks} ranks (2 unless a mode says otherwise) with the given arguments and
# the environment variables in ${run_env} (NAME=value ...); sets run_rc and run_out.
set(ranks 2)
set(run_env)
function(run_training)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${run_env} ${MPIEXEC} ${NP_FLAG} ${ranks} ${PROGRAM} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 50)
  list(JOIN ARGN " " shown)
  list(JOIN run_env " " shown_env)
  message(STATUS "${shown_env} libtorch_mnist ${shown} (${ranks} ranks) -> exit status ${rc}\n${out}")
  set(run_rc "${rc}" PARENT_SCOPE)
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

function(expect_status expected)
  if(NOT "${run_rc}" STREQUAL "${expected}")
    message(FATAL_ERROR "expected exit status ${expected}, got '${run_rc}'")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "smoke")
  set(ckpt "${WORK_DIR}/model.pt")
  run_training(--epochs 1 --train-samples 2000 --checkpoint "${ckpt}")
  expect_status(0)
  if(NOT run_out MATCHES "final test accuracy: [0-9.]+")
    message(FATAL_ERROR "no 'final test accuracy' line in the output")
  endif()
  if(NOT run_out MATCHES "summary: ranks=2 epochs=1 ")
    message(FATAL_ERROR "no 'summary:' line for 2 ranks and 1 epoch in the output")
  endif()
  if(NOT EXISTS "${ckpt}")
    message(FATAL_ERROR "--checkpoint ${ckpt} wrote no file")
  endif()

elseif(MODE STREQUAL "missing_data")
  set(empty "${WORK_DIR}/empty")
  file(MAKE_DIRECTORY "${empty}")
  run_training(--data "${empty}" --epochs 1)
  expect_status(1)
  string(FIND "${run_out}" "${empty}/" at_path)
  string(FIND "${run_out}" "dataset-fashion-mnist" at_package)
  if(at_path EQUAL -1 OR at_package EQUAL -1)
    message(FATAL_ERROR "the error message should name ${empty} and the package dataset-fashion-mnist")
  endif()

elseif(MODE STREQUAL "usage")
  run_training(--epochs 1 --no-such-flag)
  expect_status(2)
  if(NOT run_out MATCHES "unknown option '--no-such-flag'" OR NOT run_out MATCHES "usage: mpiexec")
    message(FATAL_ERROR "an unknown flag should be named, followed by the usage text")
  endif()

elseif(MODE STREQUAL "reproducible")
  # Each entry: a name, then the environment and flags of one run, separated by '|'.
  include(${CMAKE_CURRENT_LIST_DIR}/../run_entry.cmake)
  set(ranks 4)
  set(runs
      "ring|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=ring|"
      "shm_small_buckets|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=shm|--bucket-bytes 4096"
      "hierarchical_buckets|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=hierarchical HERD_SIMULATE_NODE_SIZE=2|--bucket-bytes 2000"
      "hierarchical_optimizer|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=hierarchical HERD_SIMULATE_NODE_SIZE=2|--reduction optimizer"
      "control_ring|HERD_ALLREDUCE_ALGORITHM=ring|"
      "control_shm|HERD_ALLREDUCE_ALGORITHM=shm|")
  foreach(entry IN LISTS runs)
    herd_run_entry("${entry}")
    set(name "${run_name}")
    run_training(--epochs 1 --train-samples 2000 --seed 3 ${run_flags})
    expect_status(0)
    if(NOT run_out MATCHES "parameters digest: ([0-9a-f]+)")
      message(FATAL_ERROR "no 'parameters digest:' line in the output of '${name}'")
    endif()
    set(digest_${name} "${CMAKE_MATCH_1}")
  endforeach()
  foreach(name IN ITEMS shm_small_buckets hierarchical_buckets hierarchical_optimizer)
    if(NOT digest_${name} STREQUAL digest_ring)
      message(FATAL_ERROR "with HERD_REPRODUCIBLE=1, the run '${name}' ended with other parameters than 'ring' "
                          "(digest ${digest_${name}}, not ${digest_ring})")
    endif()
  endforeach()
  if(digest_control_ring STREQUAL digest_control_shm)
    message(FATAL_ERROR "without HERD_REPRODUCIBLE, ring and shared memory gave the same parameters at 4 ranks: "
                        "this comparison would not see a path that ignores the mode")
  endif()
  message(STATUS "identical parameters in the 4 reproducible runs (${digest_ring}); the 2 control runs differ")

else()
  message(FATAL_ERROR "check.cmake: unknown MODE '${MODE}'")
endif()
