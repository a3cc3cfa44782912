// libtorch's DistributedDataParallel (herd's wrapper) training across simulated nodes: a small
// net with a BatchNorm (its running statistics broadcast from rank 0 at each forward), SGD with
// momentum, each rank on batches of its own, in two settings (default buckets; small buckets
// with gradient_as_bucket_view). Every rank must hold the same parameters at the end (buffers
// differ, as in DDP: each rank's last forward updates its own running statistics), and rank 0
// prints a digest of its parameters and buffers per setting: check_training.sh compares them with
// a run of as many ranks on one node. The ring is chosen on both sides, whose order of additions
// depends on the ranks only, not on where they are (the hierarchical path adds in another order).
// The program also checks that the communicator sees the nodes the harness made
// (HERD_MULTINODE_LAYOUT). Exit status 0 when every check held on every rank.

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/torch/distributed_data_parallel.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

// FNV-1a over the bytes of every parameter (and buffer), in the module's order.
std::uint64_t digest(torch::nn::Module& m, bool with_buffers) {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](const torch::Tensor& t) {
    const torch::Tensor c = t.detach().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (std::size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  for (const auto& p : m.parameters()) add(p);
  if (with_buffers)
    for (const auto& b : m.buffers()) add(b);
  return h;
}

// The ranks the harness put on this rank's node, from HERD_MULTINODE_LAYOUT ("2,2"); 0 if unset.
int ranks_on_my_node(int rank) {
  const char* layout = std::getenv("HERD_MULTINODE_LAYOUT");
  if (layout == nullptr) return 0;
  std::stringstream in(layout);
  int first = 0;
  for (std::string n; std::getline(in, n, ',');) {
    const int count = std::stoi(n);
    if (rank < first + count) return count;
    first += count;
  }
  return 0;
}

// The digests of the parameters, and of the parameters and buffers, after training.
std::pair<std::uint64_t, std::uint64_t> train(herd::mpi_communicator& comm, const herd::optimizer_options& options) {
  torch::manual_seed(7);  // every rank builds the same net; the wrapper broadcasts rank 0's anyway
  auto net = torch::nn::Sequential(torch::nn::Linear(48, 96), torch::nn::BatchNorm1d(96), torch::nn::ReLU(),
                                   torch::nn::Linear(96, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  herd::torch::DistributedDataParallel ddp(net, comm, options);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < 6; ++step) {
    torch::manual_seed(1000 + 31 * step + comm.rank());  // each rank's own batch
    const torch::Tensor x = torch::randn({16, 48});
    const torch::Tensor y = torch::randint(10, {16});
    sgd.zero_grad();
    torch::nll_loss(torch::log_softmax(ddp(x), 1), y).backward();
    sgd.step();
  }
  return {digest(*net, false), digest(*net, true)};
}

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  torch::set_num_threads(1);  // several ranks share each core here
  herd::comm_options ring;
  ring.allreduce_algorithm = herd::algorithm::ring;
  herd::mpi_communicator comm(MPI_COMM_WORLD, ring);
  int failures = 0;

  const int expected_local = ranks_on_my_node(comm.rank());
  const int local = herd::mpi::local_size();
  if (expected_local != 0 && local != expected_local) {
    std::printf("rank %d: FAIL: %d ranks on this node, the harness put %d\n", comm.rank(), local, expected_local);
    ++failures;
  }

  herd::optimizer_options defaults;
  herd::optimizer_options small;
  small.bucket_bytes = 16 << 10;
  small.first_bucket_bytes = 4 << 10;
  small.gradient_as_bucket_view = true;
  const std::pair<const char*, herd::optimizer_options> settings[] = {{"default buckets", defaults},
                                                                      {"16 KiB buckets, gradient_as_bucket_view", small}};
  for (const auto& [name, options] : settings) {
    const auto [h, with_buffers] = train(comm, options);
    // Every rank holds the same parameters.
    const unsigned long long both[2] = {h, ~h};
    unsigned long long most[2] = {};
    MPI_Allreduce(both, most, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (most[0] != ~most[1]) {
      std::printf("rank %d: FAIL (%s): the ranks' parameters differ\n", comm.rank(), name);
      ++failures;
    }
    if (comm.rank() == 0) std::printf("training digest (libtorch DDP, %s): %016llx\n", name, static_cast<unsigned long long>(with_buffers));
  }
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (comm.rank() == 0) std::printf("%s\n", failures == 0 ? "every check held on every rank" : "FAILED");
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}
