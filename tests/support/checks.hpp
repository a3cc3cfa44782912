#pragma once
// Checks the test files share (one definition each, so the unit tests also build as one unity
// translation unit).

#include <herd/core/dtype.hpp>
#include <herd/core/error.hpp>
#include <herd/core/reduce_op.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

// What fn() writes to this process's stderr (file descriptor 2), which still goes there too
// afterwards; an exception fn() raises passes through.
template <class Fn> std::string stderr_of(Fn&& fn) {
  std::fflush(stderr);
  char path[] = "/tmp/herd-stderr-XXXXXX";
  const int capture = ::mkstemp(path);
  REQUIRE(capture >= 0);
  ::unlink(path);
  const int saved = ::dup(2);
  ::dup2(capture, 2);
  struct restore {  // stderr back, and the capture closed, however fn() ends
    int capture, saved;
    std::string& text;
    ~restore() {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
      char buffer[4096];
      for (off_t at = 0;;) {
        const ssize_t got = ::pread(capture, buffer, sizeof buffer, at);
        if (got <= 0) break;
        text.append(buffer, static_cast<std::size_t>(got));
        at += got;
      }
      ::close(capture);
      if (::write(2, text.data(), text.size()) < 0) text += "(could not pass it on)";
    }
  };
  std::string text;
  {
    restore r{capture, saved, text};
    fn();
  }
  return text;
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
