// docs/failures.md's training loop and world-change callback, as the page shows them, around a
// step that fails once on every rank: the final weights must be those of a run without the
// failure (each step adds 1, so weights[0] == steps), which a loop that replays a step after the
// rollback (commits before counting the step) misses by one.
//
//   mpiexec -n P failures_loop     prints "rank R: weights[0] = 20 after 20 steps and a rollback" and
//                                  exits 0 on every rank whose weights are right, 1 otherwise

#include <herd/herd.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

struct dataset_stand_in {
  std::size_t size() const { return 64; }
};

}  // namespace

int main(int argc, char** argv) {
  herd::mpi::environment env(argc, argv);
  herd::comm_options o;
  o.stall_check_seconds = 0;
  o.stall_shutdown_seconds = 10;  // a hang fails the test rather than blocking it
  herd::mpi_communicator comm(MPI_COMM_WORLD, o);
  const int rank = comm.rank();

  std::vector<float> weights(8, 0.0f);
  std::vector<float> gradients(weights.size());
  std::int64_t step = 0;
  const std::int64_t steps = 20;
  bool failed_once = false;
  auto compute_gradients = [&](const std::vector<float>&, std::int64_t at) {
    if (at == 15 && !failed_once) {  // every rank, once: a failure the ranks roll back from
      failed_once = true;
      throw herd::error("a failure planted at step 15");
    }
    for (float& g : gradients) g = static_cast<float>(rank + 1);
  };
  auto update = [](std::vector<float>& w, const std::vector<float>& g) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] += g[i] / g[i];  // 1 per step, on every rank
  };
  dataset_stand_in dataset;
  double learning_rate = 0.1;

  // The page names the function's communicator as the caller's, which -Wshadow reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
  // docs/failures.md, "Training that goes on after a failure".
#include "failures_training.inc"
#pragma GCC diagnostic pop

  // docs/failures.md, "A rank that leaves": compiled against the same names (no rank leaves here).
#include "failures_world_change.inc"

  const bool right = weights[0] == static_cast<float>(steps) && step == steps && failed_once;
  std::printf("rank %d: weights[0] = %g after %lld steps and a rollback%s\n", rank, static_cast<double>(weights[0]),
              static_cast<long long>(step), right ? "" : " (expected 20 after 20 steps)");
  return right ? 0 : 1;
}
