# Fails unless the object files compiled with HERD_SEPARATE_COMPILATION leave every entry point of
# the engine that <herd/collectives/separate_compilation.hpp> declares extern to the linker: each
# must appear as undefined (called, not compiled there) and none as defined. A declaration
# missing from that header would let the compiler instantiate the function in these files (and
# inline it, so that it would not even appear as defined): it would then not appear as undefined.
#   cmake -DNM=<nm> -DOBJECTS=<a.o|b.o> -P check_no_engine.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(all "")
foreach(object IN LISTS objects)
  execute_process(COMMAND ${NM} -C ${object} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  string(APPEND all "${symbols}")
endforeach()
set(problems "")
# The symbol `pattern` matches must be referenced (undefined) and never defined in these objects.
function(require_left_to_linker label pattern)
  if(NOT all MATCHES "\n *U [^\n]*${pattern}")
    list(APPEND problems "${label} is not left to the linker (no undefined reference)")
  endif()
  if(all MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*${pattern}")
    list(APPEND problems "${label} is defined in a file that should only call it")
  endif()
  set(problems "${problems}" PARENT_SCOPE)
endfunction()
foreach(entry IN ITEMS run_collective prepare_allreduce run_allreduce prepare_grouped_allreduce run_grouped_allreduce
                       prepare_broadcast run_broadcast prepare_allgatherv run_allgatherv run_reduce_scatter
                       prepare_gatherv run_gatherv prepare_scatterv run_scatterv prepare_reduce run_reduce)
  require_left_to_linker("${entry}<mpi_communicator>" "[:]${entry}<herd::mpi_communicator>")
endforeach()
# mpi_communicator's members that create, connect, post, wait and abort: defined in the
# implementation file only (comm/mpi.hpp, HERD_SEPARATE). The callers create a communicator and
# destroy it, so they reference those two; none of the members may be defined here.
foreach(called IN ITEMS "its constructor=mpi_communicator\\([^)\n]*, herd::comm_options, herd::detail::op_label const\\*\\)"
                        "its destructor=~mpi_communicator\\(\\)")
  string(REPLACE "=" ";" called "${called}")
  list(GET called 0 label)
  list(GET called 1 pattern)
  if(NOT all MATCHES "\n *U herd::mpi_communicator::${pattern}")
    list(APPEND problems "mpi_communicator's ${label} is not left to the linker (no undefined reference)")
  endif()
endforeach()
foreach(member IN ITEMS create join_node post wait abort leave shrink "~mpi_communicator")
  if(all MATCHES "\n[0-9a-f]+ [TtWw] herd::mpi_communicator::${member}\\(")
    list(APPEND problems "mpi_communicator::${member} is defined in a file that should only call it")
  endif()
endforeach()
# The training layer, called from training.cpp and compiled in neither file: the reducer's members
# that reduce (optim/detail/reducer.hpp), the gradients' first check, the checkpoint's collective
# save and load and its file code, the optimizers' loops over pairs of dtypes, sgd's constructor
# and step, and distributed_sampler's members (HERD_SEPARATE: checkpoint/checkpoint.hpp,
# optim/detail/host_ops.hpp, optim/sgd.hpp, data/distributed_sampler.hpp). And the
# queue that runs operations (comm/detail/operation_state.hpp), which collectives.cpp's
# allreduce_async calls. And, of the rest of herd's non-template code, what these files call: the
# MPI environment's start (comm/mpi.hpp) and the words of an error (core/error.hpp).
foreach(entry IN ITEMS "detail::host::reducer<herd::mpi_communicator>::reduce_all"
                       "detail::host::reducer<herd::mpi_communicator>::mark_one"
                       "detail::host::reducer<herd::mpi_communicator>::finish"
                       "detail::host::gradient_checks<herd::mpi_communicator>::check"
                       "host::checkpoint::save<herd::mpi_communicator>"
                       "host::checkpoint::load<herd::mpi_communicator>" "host::checkpoint::insert"
                       "detail::host_accumulate" "detail::host_fold" "sgd::sgd" "sgd::step"
                       "distributed_sampler::distributed_sampler" "distributed_sampler::set_epoch"
                       "distributed_sampler::indices" "detail::operation_state::submit"
                       "detail::operation_state::wait" "mpi::environment::environment" "detail::error_message")
  string(REPLACE "<" "[<]" pattern "${entry}")
  string(REPLACE ">" "[>]" pattern "${pattern}")
  require_left_to_linker("herd::${entry}" "herd::${pattern}(\\[abi:cxx11\\])?\\(")
endforeach()
if(problems)
  list(JOIN problems "\n  " lines)
  message(FATAL_ERROR "files compiled with HERD_SEPARATE_COMPILATION compile the engine themselves:\n  ${lines}")
endif()
message(STATUS "the engine's 16 entry points, mpi_communicator's members, the reducer, the gradients' check, the "
               "checkpoint's collective save and load, the optimizers' dtype loops, sgd, distributed_sampler, the "
               "operation queue, the MPI environment and the error's words are left to the implementation file")
