// The README's libtorch program: herd::torch::DistributedDataParallel, as PyTorch's DDP.
//   mpiexec -n 2 build/examples/ddp_quickstart
#include <torch/torch.h>
#include <herd/herd.hpp>
#include <herd/optim/torch_ddp.hpp>

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::mpi_communicator comm;
  auto model = torch::nn::Sequential(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 10));
  herd::torch::DistributedDataParallel ddp(model, comm);  // checks shapes, broadcasts rank 0's values
  torch::optim::SGD sgd(model->parameters(), 0.01 * comm.size());
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = std::pair(torch::randn({64, 784}), torch::randint(10, {64}));  // your batch here
    sgd.zero_grad();
    torch::nll_loss(torch::log_softmax(ddp.forward(x), 1), y).backward();  // buckets reduce during backward
    sgd.step();                                                            // gradients already averaged
  }
  std::printf("rank %d: %zu steps reduced in %zu bucket(s)\n", comm.rank(), ddp.overlap().steps, ddp.buckets().size());
}
