#pragma once
// Checks the test files share (one definition each, so the unit tests also build as one unity
// translation unit).

#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace herd_test {

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message of the herd::error fn() raises, or "(no herd::error)" when it raises none.
template <class Fn> std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const herd::error& e) {
    return e.what();
  }
  return "(no herd::error)";
}

// Failures gathered on any thread (doctest's checks belong on the main one), reported once.
struct outcome {
  std::vector<std::string> failures;
  void fail(const std::string& what) {
    if (failures.size() < 10) failures.push_back(what);
  }
  void report() const {
    for (const auto& f : failures) FAIL_CHECK(f);
  }
};

// The reduce ops herd supports on dtype t.
inline std::vector<herd::reduce_op> ops_for(herd::dtype t) {
  std::vector<herd::reduce_op> ops;
  for (auto op : herd::all_reduce_ops)
    if (herd::supports(t, op)) ops.push_back(op);
  return ops;
}

}  // namespace herd_test
