// The training layer from a file compiled with HERD_SEPARATE_COMPILATION: distributed_optimizer's
// reducer (both of its paths: everything at step(), and buckets started by mark_ready) and the
// checkpoint's collective save and load come from the implementation file.
#include <herd/herd.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

std::string check_training(herd::mpi_communicator& comm) {
  const int p = comm.size();
  const int r = comm.rank();
  std::string wrong;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) wrong += std::string(what) + " ";
  };
  // Two parameters; each rank's gradient is rank + 1, so the average is (p + 1) / 2.
  std::vector<float> w(3000, 1.0f), b(7, 1.0f), gw(w.size()), gb(b.size());
  const auto fill_gradients = [&] {
    std::fill(gw.begin(), gw.end(), static_cast<float>(r + 1));
    std::fill(gb.begin(), gb.end(), static_cast<float>(r + 1));
  };
  herd::sgd sgd(herd::views(w, b), herd::views(gw, gb), {.lr = 0.5});
  herd::distributed_optimizer opt(sgd, herd::views(gw, gb), comm, {.first_bucket_bytes = 64});
  const float step = 0.5f * static_cast<float>(p + 1) / 2;
  fill_gradients();
  opt.step();  // everything at once
  expect(w.front() == 1 - step && w.back() == 1 - step && b[6] == 1 - step, "distributed_optimizer step");
  fill_gradients();
  opt.mark_ready(1);  // buckets, as a backward pass would start them
  opt.mark_ready(0);
  opt.step();
  expect(w[1234] == 1 - 2 * step && b[0] == 1 - 2 * step, "distributed_optimizer buckets");

  const std::filesystem::path file = "separate_compilation_checkpoint.safetensors";
  herd::checkpoint state;
  int epoch = 3 + r;  // rank 0's value is what every rank loads
  state.add("w", w).add("b", b).add_value("epoch", epoch);
  state.save(file, comm);
  std::fill(w.begin(), w.end(), 0.0f);
  epoch = -1;
  expect(state.load(file, comm) && w[2999] == 1 - 2 * step && epoch == 3, "checkpoint save and load");
  herd::barrier(comm);
  if (r == 0) std::filesystem::remove(file);

  // Ten samples over the ranks: each rank gets ceil(10 / p), and the first p of them cover every
  // rank's first sample once.
  herd::distributed_sampler sampler(10, comm, {.shuffle = false});
  sampler.set_epoch(1);
  const std::vector<std::size_t> mine = sampler.indices();
  expect(mine.size() == (10 + static_cast<std::size_t>(p) - 1) / static_cast<std::size_t>(p) &&
             mine.front() == static_cast<std::size_t>(r),
         "distributed_sampler");
  return wrong;
}
