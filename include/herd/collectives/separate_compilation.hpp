#ifndef HERD_COLLECTIVES_SEPARATE_COMPILATION_HPP
#define HERD_COLLECTIVES_SEPARATE_COMPILATION_HPP
// Separate compilation, opt-in: the collectives' engine for mpi_communicator compiled once, in one
// file of the program, instead of again in every file that calls a collective.
//
//   every file of the program:   -DHERD_SEPARATE_COMPILATION, then #include <herd/herd.hpp> as usual
//   one file more (herd.cpp):    #define HERD_IMPLEMENTATION
//                                #include <herd/herd.hpp>
//
// Header-only stays the default: without HERD_SEPARATE_COMPILATION nothing here applies. With it,
// a file that calls herd::allreduce(v, comm) on an mpi_communicator compiles the call (adapting
// the tensor, checking its arguments' shape) but not the agreement, the ring, the shared-memory
// path or the reductions behind it: those are declared `extern template` below and the
// implementation file instantiates them, so the linker finds them there (a program that forgets
// that file fails to link, naming run_allreduce and its like). The implementation file must be
// compiled with the same compiler and flags as the others: herd's code lives in a namespace named
// after the build's configuration (host, or the CUDA architectures), and an nvcc file and a g++
// file each need an implementation file of their own kind.
//
// What it covers: the blocking collectives on tensors (allreduce and its grouped form, broadcast,
// allgather(v), reduce_scatter, gather(v), scatter(v), reduce) and barrier, on mpi_communicator;
// the reducing behind distributed_optimizer and the DDP wrappers on it (detail::reducer: buckets,
// fusion, casts, the first check of the gradients); checkpoint's collective save and load on it,
// with the file format code. Not covered (compiled where they are called, as without the option):
// the _async forms, alltoall and the other communicators. Non-template code follows the same
// option where it is defined (HERD_SEPARATE, core/config.hpp): mpi_communicator's and
// local_communicator's members that create them, post, wait, shrink and abort, the queue that
// runs their operations, the node's shared-memory segments, the protocol that settles a failed
// operation with the peers, the timeline's writer, the readers of HERD_* variables, the checks
// of a call's and of every rank's arguments, the reductions' loops over every dtype and
// operation (in rank order and reproducible), the checkpoint's file code, distributed_sampler,
// sgd's and adamw's constructors and steps, the optimizers' loops over pairs of dtypes, and the
// rest of what runs once per call, operation or communicator rather than per element: the words
// of errors and the watchdog's warnings, the checks of options and settings, the MPI
// environment's start, the in-process communicator's world, elastic_state, the bucket plan,
// gradient clipping, the shared-memory and rooted collectives' set-up, sync_batch_norm's and
// loss_scaler's constructors. A file that only includes herd then parses their declarations
// alone (benchmarks/RESULTS.md, compile times).

#include <herd/checkpoint/checkpoint.hpp>
#include <herd/collectives/allgather.hpp>
#include <herd/collectives/allreduce.hpp>
#include <herd/collectives/barrier.hpp>
#include <herd/collectives/broadcast.hpp>
#include <herd/collectives/gather.hpp>
#include <herd/collectives/reduce.hpp>
#include <herd/collectives/reduce_scatter.hpp>
#include <herd/collectives/scatter.hpp>
#include <herd/core/config.hpp>
#include <herd/optim/detail/reducer.hpp>

#if !defined(HERD_NO_MPI) && (defined(HERD_SEPARATE_COMPILATION) || defined(HERD_IMPLEMENTATION))
#include <herd/comm/mpi.hpp>

#if defined(HERD_IMPLEMENTATION)
#define HERD_ENGINE_INSTANCE template  // the definitions, in the implementation file
#else
#define HERD_ENGINE_INSTANCE extern template  // declarations: compiled elsewhere
#endif

namespace herd::detail {
HERD_CONFIG_NAMESPACE_BEGIN
using engine_comm = mpi_communicator;
HERD_ENGINE_INSTANCE void run_collective<engine_comm>(engine_comm&, const op_label&, body_ref);
HERD_ENGINE_INSTANCE allreduce_call prepare_allreduce<engine_comm>(call_check, const_buffer_view, buffer_view, engine_comm&,
                                                                   reduce_op);
HERD_ENGINE_INSTANCE void run_allreduce<engine_comm>(engine_comm&, const allreduce_call&, bool);
HERD_ENGINE_INSTANCE grouped_allreduce_call prepare_grouped_allreduce<engine_comm>(call_check, std::vector<buffer_view>,
                                                                                   engine_comm&, reduce_op);
HERD_ENGINE_INSTANCE void run_grouped_allreduce<engine_comm>(engine_comm&, const grouped_allreduce_call&, bool);
HERD_ENGINE_INSTANCE broadcast_call prepare_broadcast<engine_comm>(call_check, buffer_view, engine_comm&, int);
HERD_ENGINE_INSTANCE void run_broadcast<engine_comm>(engine_comm&, const broadcast_call&, bool);
HERD_ENGINE_INSTANCE allgather_call prepare_allgatherv<engine_comm>(call_check, const_buffer_view, buffer_view,
                                                                    std::span<const std::size_t>, engine_comm&);
HERD_ENGINE_INSTANCE void run_allgatherv<engine_comm>(engine_comm&, const allgather_call&, bool);
HERD_ENGINE_INSTANCE std::vector<std::size_t> allgather_counts<engine_comm>(call_check, std::size_t, engine_comm&);
HERD_ENGINE_INSTANCE void run_reduce_scatter<engine_comm>(engine_comm&, const reduce_scatter_call&, bool);
HERD_ENGINE_INSTANCE gather_call prepare_gatherv<engine_comm>(call_check, const_buffer_view, buffer_view,
                                                              std::span<const std::size_t>, engine_comm&, int);
HERD_ENGINE_INSTANCE void run_gatherv<engine_comm>(engine_comm&, const gather_call&);
HERD_ENGINE_INSTANCE scatter_call prepare_scatterv<engine_comm>(call_check, const_buffer_view, buffer_view,
                                                                std::span<const std::size_t>, engine_comm&, int);
HERD_ENGINE_INSTANCE void run_scatterv<engine_comm>(engine_comm&, const scatter_call&);
HERD_ENGINE_INSTANCE reduce_call prepare_reduce<engine_comm>(call_check, const_buffer_view, buffer_view, engine_comm&,
                                                             reduce_op, int);
HERD_ENGINE_INSTANCE void run_reduce<engine_comm>(engine_comm&, const reduce_call&);
// The gradient reducer of distributed_optimizer and the DDP wrappers: its members that reduce, and
// the checks of the gradients and of the ranks' options.
HERD_ENGINE_INSTANCE class reducer<engine_comm>;
HERD_ENGINE_INSTANCE class gradient_checks<engine_comm>;
HERD_ENGINE_INSTANCE void require_same_tensors<engine_comm>(const std::vector<buffer_view>&, engine_comm&, const char*,
                                                            const char*, const std::string&);
HERD_CONFIG_NAMESPACE_END
}  // namespace herd::detail

namespace herd {
HERD_ENGINE_INSTANCE void barrier<mpi_communicator>(mpi_communicator&);
HERD_CONFIG_NAMESPACE_BEGIN
HERD_ENGINE_INSTANCE void checkpoint::save<mpi_communicator>(const std::filesystem::path&, mpi_communicator&, int) const;
HERD_ENGINE_INSTANCE bool checkpoint::load<mpi_communicator>(const std::filesystem::path&, mpi_communicator&, int);
HERD_CONFIG_NAMESPACE_END
}  // namespace herd

#undef HERD_ENGINE_INSTANCE
#endif

#endif  // HERD_COLLECTIVES_SEPARATE_COMPILATION_HPP
