// The types of herd's errors are public: a caller can tell a refused operation (the communicator
// still usable) from a failure, and an uncaught one names a type the reader can look up.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

// The name std::terminate prints for an uncaught exception of this dynamic type.
std::string type_name(const std::exception& e) {
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                                    std::free);
  return status == 0 ? std::string(name.get()) : typeid(e).name();
}

}  // namespace

TEST_CASE("arguments refused in the agreement raise herd::argument_error, and the communicator goes on") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> v(comm.rank() == 0 ? 8 : 7, 1.0f);
    std::string name;
    try {
      herd::allreduce(v, comm);
    } catch (const herd::argument_error& e) {
      name = type_name(e);
    }
    CHECK(name == "herd::argument_error");
    std::vector<int> one{1};
    herd::allreduce(one, comm);
    CHECK(one[0] == 2);
  });
}
