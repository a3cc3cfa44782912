# Smoke tests of the fashion_mnist example, run by ctest as
#   cmake -DMODE=<mode> -DMPIEXEC=<mpiexec> -DNP_FLAG=<-n> -DPROGRAM=<fashion_mnist> -DWORK_DIR=<dir> -P check.cmake
# MODE:
#   smoke         1 epoch on 3000 samples, 2 ranks: exit 0 and a "final test accuracy" line
#   missing_data  --data at an empty directory: exit 1, a message naming the path and the package
#   resume        2 epochs straight == 1 epoch, then --resume for the 2nd (same loss and accuracy)
#   overlap       --overlap (buckets reduced during backward) == without, loss and accuracy alike
#   timeline      HERD_TIMELINE: both ranks' files are complete trace-event JSON holding every collective
#                 (with and without --overlap; -DPYTHON=<python3> -DCHECKER=<check_timeline.py>)
#   precision     --precision bf16 learns (accuracy >= 0.70 after 1 epoch on 12000 samples) and says
#                 what the loss scaler did; --precision f16 resumed from its checkpoint (masters,
#                 momentum, loss scale) == straight
#   reproducible  4 ranks, HERD_REPRODUCIBLE=1: the checkpoint (weights, momentum) has the same bytes
#                 whatever the algorithm (ring, shared memory, hierarchical over 2 simulated nodes),
#                 the fusion and the buckets; without the mode, ring and shared memory differ (so the
#                 comparison can see a difference)
# A script rather than PASS_REGULAR_EXPRESSION because ctest ignores the exit status when a
# regular expression decides, and these tests care about both.
cmake_minimum_required(VERSION 3.21)

foreach(var MODE MPIEXEC NP_FLAG PROGRAM WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is missing")
  endif()
endforeach()

# Runs the program on ${ranks} ranks (2 unless a mode says otherwise) with the given arguments and
# the environment variables in ${run_env} (NAME=value ...); sets <prefix>_rc and <prefix>_out.
set(ranks 2)
set(run_env)
function(run_training prefix)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${run_env} ${MPIEXEC} ${NP_FLAG} ${ranks} ${PROGRAM} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT 120)
  list(JOIN ARGN " " shown)
  list(JOIN run_env " " shown_env)
  message(STATUS "${shown_env} fashion_mnist ${shown} (${ranks} ranks) -> exit status ${rc}\n${out}")
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
  set(ckpt "${WORK_DIR}/state.safetensors")
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

elseif(MODE STREQUAL "precision")
  run_training(brain --precision bf16 --epochs 1 --train-samples 12000)
  expect_success(brain)
  if(NOT "${brain_out}" MATCHES "mixed precision: bf16 parameters and gradients, loss scale [0-9.e+]+, [0-9]+ step")
    message(FATAL_ERROR "--precision bf16 printed no 'mixed precision:' line")
  endif()
  string(REGEX MATCH "final test accuracy: ([0-9.]+)" final "${brain_out}")
  if(CMAKE_MATCH_1 LESS 0.70)
    message(FATAL_ERROR "--precision bf16 reached only ${CMAKE_MATCH_1} (expected >= 0.70)")
  endif()
  set(common --precision f16 --train-samples 2000 --seed 5)
  set(ckpt "${WORK_DIR}/f16.safetensors")
  run_training(straight --epochs 2 ${common})
  expect_success(straight)
  run_training(first --epochs 1 ${common} --checkpoint "${ckpt}")
  expect_success(first)
  run_training(resumed --epochs 2 ${common} --checkpoint "${ckpt}" --resume)
  expect_success(resumed)
  result_lines(straight expected)
  result_lines(resumed got)
  if(NOT expected STREQUAL got)
    message(FATAL_ERROR "--precision f16 resumed differs from straight:\n  straight: ${expected}\n  resumed:  ${got}")
  endif()
  message(STATUS "identical: ${got}")

elseif(MODE STREQUAL "reproducible")
  # Each entry: a name, then the environment and flags of one run, separated by '|'.
  include(${CMAKE_CURRENT_LIST_DIR}/../run_entry.cmake)
  set(ranks 4)
  set(runs
      "ring|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=ring|"
      "shm|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=shm|"
      "hierarchical|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=hierarchical HERD_SIMULATE_NODE_SIZE=2|"
      "ring_unfused|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=ring HERD_FUSION_THRESHOLD=0|"
      "shm_small_buckets|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=shm HERD_BUCKET_BYTES=1|--overlap"
      "hierarchical_buckets|HERD_REPRODUCIBLE=1 HERD_ALLREDUCE_ALGORITHM=hierarchical HERD_SIMULATE_NODE_SIZE=2|--overlap"
      "control_ring|HERD_ALLREDUCE_ALGORITHM=ring|"
      "control_shm|HERD_ALLREDUCE_ALGORITHM=shm|")
  foreach(entry IN LISTS runs)
    herd_run_entry("${entry}")
    set(name "${run_name}")
    set(ckpt "${WORK_DIR}/${name}.safetensors")
    run_training(run --epochs 1 --train-samples 2000 --seed 3 --checkpoint "${ckpt}" ${run_flags})
    expect_success(run)
    file(SHA256 "${ckpt}" digest_${name})
    message(STATUS "${name}: checkpoint sha256 ${digest_${name}}")
  endforeach()
  foreach(name IN ITEMS shm hierarchical ring_unfused shm_small_buckets hierarchical_buckets)
    if(NOT digest_${name} STREQUAL digest_ring)
      message(FATAL_ERROR "with HERD_REPRODUCIBLE=1, the run '${name}' ended with other weights than 'ring'")
    endif()
  endforeach()
  if(digest_control_ring STREQUAL digest_control_shm)
    message(FATAL_ERROR "without HERD_REPRODUCIBLE, ring and shared memory gave the same weights at 4 ranks: "
                        "this comparison would not see a path that ignores the mode")
  endif()
  message(STATUS "identical weights in the 6 reproducible runs; the 2 control runs differ")

elseif(MODE STREQUAL "timeline")
  # HERD_TIMELINE on 2 ranks, reducing in step() and in buckets during backward (--overlap): each
  # rank's file is complete JSON with every collective (tests/support/check_timeline.py).
  foreach(variant IN ITEMS step overlap)
    set(ENV{HERD_TIMELINE} "${WORK_DIR}/${variant}.json")
    set(flags)
    if(variant STREQUAL "overlap")
      set(flags --overlap)
      set(expect --expect-buckets)
    endif()
    run_training(run --epochs 1 --train-samples 1000 ${flags})
    expect_success(run)
    execute_process(COMMAND ${PYTHON} ${CHECKER} "${WORK_DIR}/${variant}.rank0.json" "${WORK_DIR}/${variant}.rank1.json" ${expect}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    message(STATUS "check_timeline.py (${variant}) -> exit status ${rc}\n${out}")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "the timeline of the ${variant} run is not what it should be")
    endif()
  endforeach()
  unset(ENV{HERD_TIMELINE})

else()
  message(FATAL_ERROR "check.cmake: unknown MODE '${MODE}'")
endif()
