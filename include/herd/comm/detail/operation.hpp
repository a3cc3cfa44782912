#ifndef HERD_COMM_DETAIL_OPERATION_HPP
#define HERD_COMM_DETAIL_OPERATION_HPP
// An operation of a communicator, from start to end: it takes the communicator's next sequence
// number (in the order operations were issued on this rank, which must be the order on every
// rank), refuses to start on an aborted communicator, runs, and if it fails after its agreement
// aborts the communicator: the transport settles every request still in flight and tells the
// peers before the error reaches the caller.

#include <herd/comm/detail/agreement.hpp>
#include <herd/comm/detail/failure.hpp>
#include <herd/comm/detail/operation_state.hpp>
#include <herd/core/detail/function_ref.hpp>
#include <herd/core/error.hpp>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail {

// An operation's arguments in the timeline.
inline trace::fields trace_fields(const op_label& label) noexcept {
  trace::fields f;
  f.seq = label.seq;
  if (label.typed) {
    f.count = label.count;
    f.type = label.type;
    f.typed = true;
  }
  return f;
}

// Runs body() as operation `label` (its seq already assigned) of comm, on this thread. The body
// is passed without its type: this function, with its error handling, is compiled once per
// communicator type, not once per kind of operation.
template <class C> void run_now(C& comm, const op_label& label, function_ref<void()> body) {
  operation_state& ops = comm.operations();
  if (ops.aborted()) ops.raise_aborted(name(label.kind), comm.rank(), comm.size());
  if (trace::on() && !ops.track_named()) {
    ops.set_track_named();
    trace::name_track(ops.track(), "communicator #" + std::to_string(ops.track()) + ": rank " + std::to_string(comm.rank()) +
                                       " of " + std::to_string(comm.size()));
  }
  const trace::span slice(ops.track(), name(label.kind), trace_fields(label));
  ops.begin(label);
  try {
    if (ops.intruded()) ops.raise_intruded({name(label.kind), comm.rank(), comm.size()});
    body();
    if (ops.intruded()) ops.raise_intruded({name(label.kind), comm.rank(), comm.size()});
  } catch (const agreed_error&) {
    ops.end();
    throw;
  } catch (const error& e) {
    comm.abort(e.what());  // nothing here may fail before the abort: it settles what MPI still uses
    ops.end();
    if (ops.nested()) throw;  // the outer operation's abort says what follows
    throw error(std::string(e.what()) +
                    " The communicator is now aborted: create a new one on every rank (comm.renew()) to go on." +
                    ops.take_abort_note(),
                e.rank());
  } catch (const std::exception& e) {
    comm.abort(e.what());
    ops.end();
    throw;
  } catch (...) {
    comm.abort("an exception that is not a std::exception");
    ops.end();
    throw;
  }
  ops.completed(label);
  ops.end();
}

// Runs body() as the next operation of comm, after every operation issued before it.
template <class C, class Body> void run_operation(C& comm, op_label label, Body&& body) {
  label.name_ = thread_op_name();
  comm.operations().run_blocking(
      [&](std::uint64_t seq) {
        label.seq = seq;
        run_now(comm, label, body);
      },
      {name(label.kind), comm.rank(), comm.size()});
}

// Queues body() as the next operation of comm; body must own (copy) what it uses.
// In the timeline it also spans from submission to completion; both ends are recorded by the
// thread that runs it, so that the file holds them in order.
template <class C, class Body>
std::shared_ptr<queued_operation> submit_operation(C& comm, op_label label, Body body) {
  label.name_ = thread_op_name();  // the submitting thread's, taken now
  const bool traced = trace::on();
  const std::int64_t submitted = traced ? trace::now_ns() : 0;
  return comm.operations().submit([&comm, label, traced, submitted, body = std::move(body)](std::uint64_t seq) mutable {
    op_label numbered = label;
    numbered.seq = seq;
    const std::uint32_t track = comm.operations().track();
    if (traced) trace::async_begin(track, name(label.kind), trace::async_id(track, seq), submitted, trace_fields(numbered));
    struct completion {
      bool traced;
      std::uint32_t track;
      const char* what;
      std::uint64_t seq;
      ~completion() {
        if (traced) trace::async_end(track, what, trace::async_id(track, seq));
      }
    } end{traced, track, name(label.kind), seq};
    run_now(comm, numbered, body);
  }, {name(label.kind), comm.rank(), comm.size()});
}

// The agreement of an operation without tensor arguments (barrier, split, creation): every
// rank's signature and payload, after checking that all ranks are in the same operation.
template <class C> exchanged agree_identity(C& comm, const void* payload = nullptr, std::size_t payload_bytes = 0) {
  const operation_state& ops = comm.operations();
  const trace::span phase(ops.track(), "agreement");
  const error_site site{name(ops.current().kind), comm.rank(), comm.size()};
  if (comm.size() == 1) {
    exchanged alone;
    std::vector<signature>& own = signature_buffer(1);
    own.assign(1, signature_of(ops));
    alone.signatures = own;
    std::byte* slot = exchange_buffer(payload_max_bytes, 0);
    if (payload_bytes != 0) std::memcpy(slot, payload, payload_bytes);
    payload_pointers().assign(1, slot);
    alone.payloads = payload_pointers();
    return alone;
  }
  exchanged all = exchange(control_of(comm), signature_of(ops), payload, payload_bytes);
  verify_identity(site, all.signatures);
  return all;
}

// A new communicator's first operation (#0): all ranks check that they run the same wire
// protocol, that none has a malformed HERD_* variable (runtime::settings::problem) or option
// (options_problem), which is raised on every rank, naming it, and, when they renew a
// communicator (`renewed`: this rank's last completed operation of it), that they all completed
// the same operations of the old one.
template <class C> void agree_creation(C& comm, const std::string& env_problem, const op_label* renewed = nullptr) {
  trace::start_from_environment(trace::launcher_rank());
  op_label label{op_kind::create, 0};
  auto body = [&] {
    const error_site site{"communicator", comm.rank(), comm.size()};
    const std::string problem = env_problem.empty() ? options_problem(comm.options()) : env_problem;
    const creation_report mine(problem.substr(0, sizeof creation_report::problem - 1), renewed);
    exchanged all = comm.size() == 1 ? exchanged{} : exchange(comm, signature_of(comm.operations()), &mine, mine.bytes());
    if (!problem.empty()) raise_agreed(site, problem, "Every rank stops so that none waits forever");
    std::vector<creation_report> reports;
    reports.reserve(all.signatures.size());
    for (int r = 0; r < static_cast<int>(all.signatures.size()); ++r) {
      reports.emplace_back(all.payload(r), all.signatures[static_cast<std::size_t>(r)].payload_bytes);
      if (reports.back().problem[0] != '\0') {
        raise_agreed(site, "rank " + std::to_string(r) + " has a malformed setting: " + reports.back().problem,
                     "Fix it on that rank; every rank stops so that none waits forever");
      }
    }
    if (!all.signatures.empty()) verify_identity(site, all.signatures);
    verify_renewal(site, reports);
  };
  run_now(comm, label, body);
}

}  // namespace herd::detail

#endif  // HERD_COMM_DETAIL_OPERATION_HPP
