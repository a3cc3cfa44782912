// ZeRO-1's optimizer state per rank beside the unsharded optimizer's, and the time of a step of
// each (gradient reduction and update), for models of real shapes, under mpiexec:
//
//   mpiexec -n 4 build/benchmarks/zero_memory [--steps 20]
//
// Models: the Fashion-MNIST MLP of examples/fashion_mnist (784-256-128-10, 235,146 parameters)
// and an MLP of 784-2048-2048-10 (5.8 M parameters), f32, with AdamW (two moments per parameter)
// and SGD with momentum (one). State bytes are what each optimizer's visit_state reaches on rank
// 0 (ZeRO's includes its 24-byte layout record). Step times: the slowest rank's median.

#include <herd/herd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct model {
  std::vector<std::vector<float>> params, grads;
  explicit model(const std::vector<std::size_t>& sizes) {
    for (std::size_t n : sizes) {
      params.emplace_back(n, 0.01f);
      grads.emplace_back(n, 0.001f);
    }
  }
  std::vector<herd::buffer_view> views(std::vector<std::vector<float>>& of) {
    std::vector<herd::buffer_view> v;
    for (auto& t : of) v.push_back(herd::view_of(t));
    return v;
  }
  std::size_t count() const {
    std::size_t n = 0;
    for (const auto& p : params) n += p.size();
    return n;
  }
};

std::size_t state_bytes(auto& opt) {
  std::size_t bytes = 0;
  herd::visit_optimizer_state(opt, [&](const auto&, herd::buffer_view v) { bytes += v.bytes(); });
  return bytes;
}

template <class Step> double median_ms(herd::mpi_communicator& comm, int steps, Step step) {
  step();
  std::vector<double> samples;
  for (int i = 0; i < steps; ++i) {
    herd::barrier(comm);
    const auto start = std::chrono::steady_clock::now();
    step();
    samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(samples.begin(), samples.end());
  double worst = samples[samples.size() / 2];
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, comm.native());
  return worst;
}

template <class Make>
void compare(herd::mpi_communicator& comm, const char* name, const std::vector<std::size_t>& sizes, const char* optimizer,
             Make make, int steps) {
  model sharded(sizes), plain(sizes);
  herd::zero_optimizer zero(sharded.views(sharded.params), sharded.views(sharded.grads), comm, make);
  auto inner = make(plain.views(plain.params), plain.views(plain.grads));
  herd::distributed_optimizer whole(inner, plain.views(plain.grads), comm);
  const std::size_t zero_bytes = state_bytes(zero), whole_bytes = state_bytes(inner);
  const double zero_ms = median_ms(comm, steps, [&] { zero.step(); });
  const double whole_ms = median_ms(comm, steps, [&] { whole.step(); });
  if (comm.rank() == 0) {
    std::printf("%-24s %-8s %5d %12zu %14zu %14zu %8.3f %10.2f %10.2f\n", name, optimizer, comm.size(), sharded.count(),
                whole_bytes, zero_bytes, static_cast<double>(zero_bytes) / static_cast<double>(whole_bytes), whole_ms,
                zero_ms);
  }
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  int steps = 20;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--steps") steps = std::stoi(argv[i + 1]);
  auto adamw = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::adamw(std::move(p), std::move(g));
  };
  auto sgd = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::sgd(std::move(p), std::move(g), {.lr = 0.01, .momentum = 0.9});
  };
  const std::vector<std::size_t> fashion = {256 * 784, 256, 128 * 256, 128, 10 * 128, 10};
  const std::vector<std::size_t> wide = {2048 * 784, 2048, 2048 * 2048, 2048, 10 * 2048, 10};
  if (comm.rank() == 0) {
    std::printf("%-24s %-8s %5s %12s %14s %14s %8s %10s %10s\n", "model", "optim", "ranks", "parameters",
                "state B/rank", "zero B/rank", "ratio", "step ms", "zero ms");
  }
  compare(comm, "fashion_mnist MLP", fashion, "adamw", adamw, steps);
  compare(comm, "fashion_mnist MLP", fashion, "sgd", sgd, steps);
  compare(comm, "MLP 784-2048-2048-10", wide, "adamw", adamw, steps);
  compare(comm, "MLP 784-2048-2048-10", wide, "sgd", sgd, steps);
  return 0;
}
