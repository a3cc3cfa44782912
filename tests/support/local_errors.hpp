#pragma once
// Errors of operations on threads (local_communicator), gathered per rank: shared by the unit
// tests of bad arguments, of the operations engine and of the rooted collectives.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include "checks.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

namespace herd_test {

// Runs fn on p ranks; returns each rank's herd::error message ("" for none).
template <class Fn> std::vector<std::string> errors_per_rank(int p, Fn fn, herd::comm_options options = {}) {
  std::vector<std::string> messages(static_cast<std::size_t>(p));
  herd::local::run(
      p,
      [&](herd::local_communicator& comm) {
        try {
          fn(comm);
        } catch (const herd::error& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      options);
  return messages;
}

struct agreed_checks {
  bool names_the_rank = true;  // each error's rank() is the rank that raised it
  bool then_usable = false;    // afterwards the communicator still reduces
};

// Runs fn on p ranks, whose errors an agreement raises: within 5 s, with the checks asked for;
// returns each rank's herd::error message ("" for none).
template <class Fn> std::vector<std::string> agreed_errors_per_rank(int p, Fn fn, agreed_checks checks = {}) {
  std::vector<std::string> messages(static_cast<std::size_t>(p));
  const auto start = std::chrono::steady_clock::now();
  herd::local::run(p, [&](herd::local_communicator& comm) {
    try {
      fn(comm);
    } catch (const herd::error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
      if (checks.names_the_rank) CHECK(e.rank() == comm.rank());
    }
    if (checks.then_usable) {
      std::vector<int> one{1};
      herd::allreduce(one, comm);
      CHECK(one[0] == comm.size());
    }
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  return messages;
}

// Every rank's message names that rank and holds each of `parts`.
inline void check_all(const std::vector<std::string>& messages, const std::vector<std::string>& parts) {
  for (std::size_t r = 0; r < messages.size(); ++r) {
    INFO("rank ", r, ": ", messages[r]);
    CHECK(has(messages[r], "on rank " + std::to_string(r)));
    for (const auto& part : parts) CHECK(has(messages[r], part));
  }
}

}  // namespace herd_test
