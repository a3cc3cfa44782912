# Smoke tests of the fashion_mnist example, run by ctest as
#   cmake -DMODE=<mode> -DMPIEXEC=<mpiexec> -DNP_FLAG=<-n> -DPROGRAM=<fashion_mnist> -DWORK_DIR=<dir> -P check.cmake
# MODE:
#   smoke         1 epoch on 3000 samples, 2 ranks: exit 0 and a "final test accuracy" line
#   missing_data  --data at an empty directory: exit 1, a message naming the path and the package
#   resume        2 epochs straight == 1 epoch, then --resume for the 2nd (same loss and accuracy)
#   overlap       --overlap (buckets reduced during backward) == without, loss and accuracy alike
# A script rather than PASS_REGULAR_EXPRESSION because ctest ignores the exit status when a
# regular expression decides, and these tests care about both.
cmake_minimum_required(VERSION 3.21)

foreach(var MODE MPIEXEC NP_FLAG PROGRAM WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is missing")
  endif()
endforeach()

# Runs the program on 2 ranks with the given arguments; sets <prefix>_rc and <prefix>_out.
function(run_training prefix)
  execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} 2 ${PROGRAM} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
  list(JOIN ARGN " " shown)
  message(STATUS "fashion_mnist ${shown} -> exit status ${rc}\n${out}")
  set(${prefix}_rc "${rc}" PARENT_SCOPE)
  set(${prefix}_out "${out}" PARENT_SCOPE)
endfunction()

function(expect_success prefix)
  if(NOT "${${prefix}_rc}" STREQUAL "0")
    message(FATAL_ERROR "expected exit status 0, got '${${prefix}_rc}'")
  endif()
  if(NOT "${${prefix}_out}" MATCHES "final test accuracy: [0-9.]+")
    message(FATAL_ERROR "no 'final test accuracy' line in the output")
  endif()
endfunction()

# The lines a resumed run must reproduce exactly: the last epoch's loss and accuracy, and the final accuracy.
function(result_lines prefix out_var)
  string(REGEX MATCH "epoch 2/2: train loss [0-9.]+  test accuracy [0-9.]+" epoch_line "${${prefix}_out}")
  string(REGEX MATCH "final test accuracy: [0-9.]+" final_line "${${prefix}_out}")
  if(epoch_line STREQUAL "" OR final_line STREQUAL "")
    message(FATAL_ERROR "the output lacks the epoch 2 line or the final accuracy line")
  endif()
  set(${out_var} "${epoch_line} / ${final_line}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

if(MODE STREQUAL "smoke")
  run_training(run --epochs 1 --train-samples 3000)
  expect_success(run)

elseif(MODE STREQUAL "missing_data")
  set(empty "${WORK_DIR}/empty")
  file(MAKE_DIRECTORY "${empty}")
  run_training(run --data "${empty}" --epochs 1)
  if(NOT "${run_rc}" STREQUAL "1")
    message(FATAL_ERROR "expected exit status 1 for missing data, got '${run_rc}'")
  endif()
  string(FIND "${run_out}" "${empty}/" at_path)
  string(FIND "${run_out}" "dataset-fashion-mnist" at_package)
  if(at_path EQUAL -1 OR at_package EQUAL -1)
    message(FATAL_ERROR "the error message should name ${empty} and the package dataset-fashion-mnist")
  endif()

elseif(MODE STREQUAL "resume")
  set(common --train-samples 2000 --seed 7)
  set(ckpt "${WORK_DIR}/state.herd")
  run_training(straight --epochs 2 ${common})
  expect_success(straight)
  run_training(first --epochs 1 ${common} --checkpoint "${ckpt}")
  expect_success(first)
  if(NOT EXISTS "${ckpt}")
    message(FATAL_ERROR "--checkpoint ${ckpt} wrote no file")
  endif()
  run_training(resumed --epochs 2 ${common} --checkpoint "${ckpt}" --resume)
  expect_success(resumed)
  if(NOT "${resumed_out}" MATCHES "resumed from .* after epoch 1")
    message(FATAL_ERROR "the resumed run did not report loading the checkpoint after epoch 1")
  endif()
  if(resumed_out MATCHES "epoch 1/2:")
    message(FATAL_ERROR "the resumed run trained epoch 1 again")
  endif()
  result_lines(straight expected)
  result_lines(resumed got)
  if(NOT expected STREQUAL got)
    message(FATAL_ERROR "resumed run differs from the straight run:\n  straight: ${expected}\n  resumed:  ${got}")
  endif()
  message(STATUS "identical: ${got}")

elseif(MODE STREQUAL "overlap")
  set(common --epochs 2 --train-samples 2000 --seed 3)
  run_training(blocking ${common})
  expect_success(blocking)
  run_training(overlapped ${common} --overlap)
  expect_success(overlapped)
  if(NOT "${overlapped_out}" MATCHES "overlap: ([0-9]+) bucket\\(s\\), ([0-9]+) steps")
    message(FATAL_ERROR "--overlap printed no 'overlap:' line")
  endif()
  if(CMAKE_MATCH_1 LESS 2 OR CMAKE_MATCH_2 EQUAL 0)
    message(FATAL_ERROR "--overlap should reduce in at least 2 buckets at every step: ${CMAKE_MATCH_0}")
  endif()
  # Two ranks: each element is the sum of two values, exact in any grouping, so the same bits.
  result_lines(blocking expected)
  result_lines(overlapped got)
  if(NOT expected STREQUAL got)
    message(FATAL_ERROR "--overlap trained differently:\n  blocking:   ${expected}\n  overlapped: ${got}")
  endif()
  message(STATUS "identical: ${got}")

else()
  message(FATAL_ERROR "check.cmake: unknown MODE '${MODE}'")
endif()
