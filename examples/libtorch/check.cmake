# Smoke tests of libtorch_mnist, run by ctest as
#   cmake -DMODE=<mode> -DMPIEXEC=<mpiexec> -DNP_FLAG=<-n> -DPROGRAM=<libtorch_mnist> -DWORK_DIR=<dir> -P check.cmake
# MODE:
#   smoke         2 ranks, 1 epoch on 2000 samples, with --checkpoint: exit 0, the final accuracy
#                 and summary lines, and the checkpoint file
#   missing_data  --data at an empty directory: exit 1, a message naming the path and the package
#   usage         an unknown flag: exit 2 and the usage text
# A script rather than PASS_REGULAR_EXPRESSION, which would make ctest ignore the exit status.
cmake_minimum_required(VERSION 3.21)

foreach(var MODE MPIEXEC NP_FLAG PROGRAM WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is missing")
  endif()
endforeach()

# Runs the program on 2 ranks with the given arguments; sets run_rc and run_out.
function(run_training)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 2 ${PROGRAM} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 50)
  list(JOIN ARGN " " shown)
  message(STATUS "libtorch_mnist ${shown} -> exit status ${rc}\n${out}")
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

else()
  message(FATAL_ERROR "check.cmake: unknown MODE '${MODE}'")
endif()
