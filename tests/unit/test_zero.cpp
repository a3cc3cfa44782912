// ZeRO-1 (zero_optimizer) against the unsharded distributed optimizer wrapping the same optimizer:
// the same parameters after several steps (within 1e-6), at 1-4 ranks, with parameter counts
// that W does not divide and shards that are empty; each rank keeping only its shard's state.
// With a loss scaler: an overflow that one rank's gradients carry skips the step on every rank and
// backs every scale off alike, growth is alike too, and finite scaled gradients step exactly as
// the unscaled ones do without a scaler. Its checkpoint is one file of the whole state, the
// unsharded optimizer's byte for byte, that resumes at any world size bit for bit.

#include <herd/herd.hpp>

#include "../support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Three parameter tensors of the given sizes, seeded alike on every rank.
struct model {
  std::vector<std::vector<float>> params, grads;
  explicit model(const std::vector<std::size_t>& sizes) {
    herd_test::rng g(42);
    for (std::size_t n : sizes) {
      params.emplace_back(n);
      grads.emplace_back(n);
      for (auto& x : params.back()) x = static_cast<float>(g.unit() - 0.5);
    }
  }
  std::vector<herd::buffer_view> param_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : params) v.push_back(herd::view_of(p));
    return v;
  }
  std::vector<herd::buffer_view> grad_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : grads) v.push_back(herd::view_of(p));
    return v;
  }
  // Gradients of step s on rank r: different on every rank and step; times `scale`, as backward
  // from a scaled loss gives them.
  void fill_grads(int rank, int step, double scale = 1.0) {
    herd_test::rng g(1000 * static_cast<std::uint64_t>(rank) + static_cast<std::uint64_t>(step));
    for (auto& t : grads)
      for (auto& x : t) x = static_cast<float>(g.unit() - 0.5) * static_cast<float>(scale);
  }
};

double largest_difference(const model& a, const model& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    for (std::size_t j = 0; j < a.params[i].size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(a.params[i][j]) - b.params[i][j]));
  return worst;
}

std::size_t state_bytes(auto& opt) {
  std::size_t bytes = 0;
  herd::visit_optimizer_state(opt, [&](const auto&, herd::buffer_view v) { bytes += v.bytes(); });
  return bytes;
}

// The wrapped optimizer's state, as bytes.
std::vector<std::byte> state_of(auto& opt) {
  std::vector<std::byte> bytes;
  herd::visit_optimizer_state(opt, [&](const auto&, herd::buffer_view v) {
    const auto* p = static_cast<const std::byte*>(v.data);
    bytes.insert(bytes.end(), p, p + v.bytes());
  });
  return bytes;
}

// Whether rank 0's scale is this rank's, bit for bit.
bool same_scale_everywhere(double scale, herd::local_communicator& comm) {
  std::vector<double> first{scale};
  herd::broadcast(first, comm, 0);
  return std::memcmp(&first[0], &scale, sizeof scale) == 0;
}

auto make_momentum_sgd = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
  return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
};

template <class MakeInner> void compare_with_unsharded(int ranks, const std::vector<std::size_t>& sizes, MakeInner make_inner,
                                                        herd::compression wire = herd::compression::none) {
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    model sharded(sizes), plain(sizes);
    herd::zero_optimizer zero(sharded.param_views(), sharded.grad_views(), comm, make_inner, {.wire = wire});
    auto inner = make_inner(plain.param_views(), plain.grad_views());
    herd::distributed_optimizer reference(inner, plain.grad_views(), comm, {.compression = wire});
    for (int step = 0; step < 5; ++step) {
      sharded.fill_grads(comm.rank(), step);
      plain.fill_grads(comm.rank(), step);
      zero.step();
      reference.step();
    }
    const double tolerance = wire == herd::compression::none ? 1e-6 : 1e-3;
    INFO("rank ", comm.rank(), " of ", ranks, " shard [", zero.shard().begin, ", ", zero.shard().end, ")");
    CHECK(largest_difference(sharded, plain) <= tolerance);
    // Every rank ends with the same parameters, bit for bit.
    std::vector<float> mine;
    for (auto& p : sharded.params) mine.insert(mine.end(), p.begin(), p.end());
    std::vector<float> first = mine;
    herd::broadcast(first, comm, 0);
    CHECK(first == mine);
  });
}

}  // namespace

TEST_CASE("zero_optimizer with SGD and momentum equals the unsharded optimizer at 1-4 ranks") {
  auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  };
  for (int ranks = 1; ranks <= 4; ++ranks) {
    compare_with_unsharded(ranks, {37, 1, 251}, make);  // 289 elements: no W of 2-4 divides it
    compare_with_unsharded(ranks, {5, 3}, make);        // 8 elements; at 3 ranks shards of 3, 3, 2
    compare_with_unsharded(ranks, {2}, make);           // fewer elements than ranks: empty shards
  }
}

TEST_CASE("zero_optimizer with AdamW equals the unsharded optimizer, also with fp16 on the wire") {
  auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::adamw(std::move(p), std::move(g), {.lr = 0.01, .weight_decay = 0.1});
  };
  for (int ranks = 1; ranks <= 4; ++ranks) compare_with_unsharded(ranks, {101, 7, 33}, make);
  compare_with_unsharded(3, {101, 7, 33}, make, herd::compression::fp16);
}

TEST_CASE("zero_optimizer keeps only its shard's state, and refuses state written into it for another layout") {
  const std::vector<std::size_t> sizes = {1000, 24};  // 1024 elements
  herd::local::run(4, [&](herd::local_communicator& comm) {
    model m(sizes);
    auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g));
    };
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make);
    auto whole = make(m.param_views(), m.grad_views());
    // adamw: two f32 moments per element and a step count; the shard adds its layout (3 x i64).
    CHECK(zero.shard().count() == 256);
    CHECK(state_bytes(zero) == 256 * 8 + 8 + 24);
    CHECK(state_bytes(whole) == 1024 * 8 + 8);

    m.fill_grads(comm.rank(), 0);
    CHECK_NOTHROW(zero.step());
    // Rank 2's shard layout written into rank 1 (as copying shards between ranks by hand would)
    // makes the next step raise on every rank.
    if (comm.rank() == 1) {
      herd::visit_optimizer_state(zero, [](const auto& name, herd::buffer_view v) {
        if (std::string(name) == "zero.layout") static_cast<std::int64_t*>(v.data)[1] = 2;
      });
    }
    herd::barrier(comm);
    const char* expected = comm.rank() == 1 ? "loaded from a shard of rank 2 of 4 ranks" : "rank 1 passed optimizer state of another shard layout";
    CHECK_THROWS_WITH_AS(zero.step(), doctest::Contains(expected), herd::error);
  });
}

namespace {

// Gradients of step s on rank 0, zeros elsewhere, summed: every world size reduces them to rank
// 0's exactly, so runs at different world sizes can be compared bit for bit.
void rank0_grads(model& m, int rank, int step) {
  if (rank == 0) m.fill_grads(0, step);
  else
    for (auto& g : m.grads) std::fill(g.begin(), g.end(), 0.0f);
}

// The parameters and the optimizer's state of a run, as one checkpoint.
herd::checkpoint run_state(model& m, auto& opt) {
  herd::checkpoint state;
  for (std::size_t i = 0; i < m.params.size(); ++i) state.add("param." + std::to_string(i), m.params[i]);
  state.add_optimizer_state("opt.", opt);
  return state;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Saves at 2 ranks after `k` steps, loads at 1, 3 and 4 ranks and takes `more` steps: the
// parameters and the whole state (the final checkpoint file, byte for byte) equal those of `k +
// more` uninterrupted steps at that world size. The file is the unsharded optimizer's, byte for
// byte, and each loads the other's.
template <class Make> void resume_at_other_world_sizes(Make make) {
  const std::vector<std::size_t> sizes = {37, 1, 251};  // shards cut through parameters at 2-4 ranks
  const int k = 3, more = 4;
  const herd::zero_options sum{.op = herd::reduce_op::sum};
  const auto dir = std::filesystem::temp_directory_path() / ("herd_zero_resume_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto train = [](model& m, auto& opt, int rank, int from, int to) {
    for (int step = from; step < to; ++step) {
      rank0_grads(m, rank, step);
      opt.step();
    }
  };
  herd::local::run(2, [&](herd::local_communicator& comm) {
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make, sum);
    train(m, zero, comm.rank(), 0, k);
    run_state(m, zero).save(dir / "zero_at_2", comm);
  });
  {  // The unsharded optimizer after the same steps writes the same file.
    model m(sizes);
    auto plain = make(m.param_views(), m.grad_views());
    train(m, plain, 0, 0, k);
    run_state(m, plain).save(dir / "plain");
    CHECK(file_bytes(dir / "plain") == file_bytes(dir / "zero_at_2"));
  }
  std::vector<float> final_params;  // of the uninterrupted run at one rank
  for (int world : {1, 3, 4}) {
    const auto reference_file = dir / ("reference_at_" + std::to_string(world));
    const auto resumed_file = dir / ("resumed_at_" + std::to_string(world));
    herd::local::run(world, [&](herd::local_communicator& comm) {
      model reference(sizes);
      herd::zero_optimizer uninterrupted(reference.param_views(), reference.grad_views(), comm, make, sum);
      train(reference, uninterrupted, comm.rank(), 0, k + more);
      run_state(reference, uninterrupted).save(reference_file, comm);

      model resumed(sizes);
      for (auto& p : resumed.params) std::fill(p.begin(), p.end(), 7.0f);  // all of it comes from the file
      herd::zero_optimizer zero(resumed.param_views(), resumed.grad_views(), comm, make, sum);
      herd::checkpoint state = run_state(resumed, zero);
      REQUIRE(state.load(dir / "zero_at_2", comm));
      train(resumed, zero, comm.rank(), k, k + more);
      state.save(resumed_file, comm);
      INFO("rank ", comm.rank(), " of ", world);
      CHECK(resumed.params == reference.params);
      if (world == 1) {
        for (auto& p : reference.params) final_params.insert(final_params.end(), p.begin(), p.end());
      }
    });
    INFO("world size ", world);
    CHECK(file_bytes(resumed_file) == file_bytes(reference_file));
  }
  {  // The unsharded optimizer resumes from the file zero_optimizer wrote...
    model m(sizes);
    auto plain = make(m.param_views(), m.grad_views());
    REQUIRE(run_state(m, plain).load(dir / "zero_at_2"));
    train(m, plain, 0, k, k + more);
    std::vector<float> mine;
    for (auto& p : m.params) mine.insert(mine.end(), p.begin(), p.end());
    CHECK(mine == final_params);
  }
  herd::local::run(3, [&](herd::local_communicator& comm) {  // ...and zero_optimizer from its file
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make, sum);
    REQUIRE(run_state(m, zero).load(dir / "plain", comm));
    train(m, zero, comm.rank(), k, k + more);
    std::vector<float> mine;
    for (auto& p : m.params) mine.insert(mine.end(), p.begin(), p.end());
    CHECK(mine == final_params);
  });
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("zero_optimizer's checkpoint is one file of the whole state: saved at 2 ranks, it resumes at 1, 3 and 4 ranks bit for bit") {
  SUBCASE("SGD with momentum") { resume_at_other_world_sizes(make_momentum_sgd); }
  SUBCASE("AdamW") {
    resume_at_other_world_sizes([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = 0.01, .weight_decay = 0.1});
    });
  }
}

namespace {
// A local_communicator that counts the bytes its rank sends: how much a collective moved.
struct counting_communicator {
  using request = herd::local_communicator::request;
  herd::local_communicator inner;
  std::atomic<std::size_t>* sent;

  int rank() const noexcept { return inner.rank(); }
  int size() const noexcept { return inner.size(); }
  const herd::comm_options& options() const { return inner.options(); }
  bool supports(herd::device d) const noexcept { return inner.supports(d); }
  herd::detail::operation_state& operations() { return inner.operations(); }
  request isend(const void* data, std::size_t bytes, int peer, int tag) {
    *sent += bytes;
    return inner.isend(data, bytes, peer, tag);
  }
  request irecv(void* data, std::size_t bytes, int peer, int tag) { return inner.irecv(data, bytes, peer, tag); }
  bool test(request& r) { return inner.test(r); }
  void wait(request& r) { inner.wait(r); }
  void sendrecv(const void* send, std::size_t send_bytes, int destination, void* receive, std::size_t receive_bytes,
                int source, int tag) {
    *sent += send_bytes;
    inner.sendrecv(send, send_bytes, destination, receive, receive_bytes, source, tag);
  }
  counting_communicator split(int color, int key) const { return {inner.split(color, key), sent}; }
  void abort(std::string_view reason) noexcept { inner.abort(reason); }
};
static_assert(herd::communicator<counting_communicator>);

std::vector<std::string> state_bytes_of(auto& opt) {
  std::vector<std::string> out;
  opt.visit_state([&](const auto&, herd::buffer_view v) { out.emplace_back(static_cast<const char*>(v.data), v.bytes()); });
  return out;
}
}  // namespace

// Loading hands each rank its shard of each split tensor: the ranks together send less than one
// copy of the state, where sending every rank the whole of it moves it size - 1 times or more.
TEST_CASE("zero_optimizer's checkpoint loads each rank only its own shard of the state") {
  const std::vector<std::size_t> sizes = {30011, 20011};
  const std::size_t state_bytes = (30011 + 20011) * sizeof(float);  // the momentum buffers, whole
  const auto file = std::filesystem::temp_directory_path() / ("herd_zero_load_" + std::to_string(::getpid()));
  herd::local::run(4, [&](herd::local_communicator& comm) {
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make_momentum_sgd);
    m.fill_grads(comm.rank(), 0);
    zero.step();
    herd::checkpoint state;
    state.add_optimizer_state("opt.", zero);
    state.save(file, comm);
  });
  std::atomic<std::size_t> sent{0};
  herd::local::run(4, [&](herd::local_communicator& comm) {
    model twin(sizes);  // the state the file holds, made again
    herd::zero_optimizer expected(twin.param_views(), twin.grad_views(), comm, make_momentum_sgd);
    twin.fill_grads(comm.rank(), 0);
    expected.step();
    counting_communicator counted{comm.split(0, comm.rank()), &sent};
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), counted, make_momentum_sgd);
    herd::checkpoint state;
    state.add_optimizer_state("opt.", zero);
    REQUIRE(state.load(file, counted));
    INFO("rank ", comm.rank());
    CHECK(state_bytes_of(zero) == state_bytes_of(expected));
  });
  INFO(sent.load(), " bytes sent to load ", state_bytes, " bytes of state");
  CHECK(sent.load() < state_bytes);
  std::filesystem::remove(file);
}

TEST_CASE("zero_optimizer's state saved without a communicator is refused where it is split, and loads part by part") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  const auto file = std::filesystem::temp_directory_path() / ("herd_zero_alone_" + std::to_string(::getpid()));
  herd::local::run(2, [&](herd::local_communicator& comm) {
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make_momentum_sgd);
    m.fill_grads(comm.rank(), 0);
    zero.step();
    herd::checkpoint state = run_state(m, zero);
    CHECK_THROWS_WITH_AS(state.save(file), doctest::Contains("is split over the ranks, and this rank holds"), herd::error);
    state.save(file, comm);
    std::vector<std::byte> before = state_of(zero);
    m.fill_grads(comm.rank(), 1);
    zero.step();
    CHECK(state_of(zero) != before);
    CHECK(state.load(file));  // each rank reads the file itself and keeps its part
    CHECK(state_of(zero) == before);
    // A second optimizer's state registered on rank 1 alone: every rank refuses to save, none
    // waits in a gather the others skip.
    model other(sizes);
    herd::zero_optimizer extra(other.param_views(), other.grad_views(), comm, make_momentum_sgd);
    if (comm.rank() == 1) state.add_optimizer_state("extra.", extra);
    CHECK_THROWS_WITH_AS(state.save(file, comm), doctest::Contains("the ranks registered different state split over the ranks"),
                         herd::error);
    herd::barrier(comm);
    if (comm.rank() == 0) std::filesystem::remove(file);
  });
}

TEST_CASE("zero_optimizer with fp16 on the wire divides before the sum: two ranks averaging 40000 get 40000, not inf") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<float> param(4, 0.0f), grad(4, 40000.0f);  // the f16 sum, 80000, is past f16's 65504
    herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); },
                              {.wire = herd::compression::fp16});
    zero.step();
    INFO("rank ", comm.rank());
    for (float p : param) CHECK(p == -40000.0f);
  });
}

TEST_CASE("zero_optimizer with max_grad_norm clips by the norm of the whole, as the unsharded optimizer after clip_grad_norm") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  for (int ranks : {1, 3}) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
        return herd::sgd(std::move(p), std::move(g), {.lr = 0.1, .momentum = 0.9});
      };
      model sharded(sizes), plain(sizes);
      herd::zero_optimizer zero(sharded.param_views(), sharded.grad_views(), comm, make, {.max_grad_norm = 0.5});
      auto inner = make(plain.param_views(), plain.grad_views());
      herd::distributed_optimizer reference(inner, plain.grad_views(), comm);
      for (int step = 0; step < 4; ++step) {
        sharded.fill_grads(comm.rank(), step);
        plain.fill_grads(comm.rank(), step);
        zero.step();
        reference.synchronize();
        const double norm = herd::clip_grad_norm(plain.grad_views(), 0.5);
        reference.step();
        INFO("rank ", comm.rank(), " of ", ranks, ", step ", step);
        CHECK(zero.grad_norm() == doctest::Approx(norm).epsilon(1e-6));
        CHECK(norm > 0.5);  // the clipping acts
      }
      CHECK(largest_difference(sharded, plain) <= 1e-6);
    });
  }
}

TEST_CASE("zero_optimizer with a loss scaler: an inf or NaN in one rank's gradients skips the step on every rank and halves every scale") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  for (double clip : {0.0, 1.0}) {  // the overflow agreed alone, and in the norm's allreduce
    for (int ranks = 1; ranks <= 3; ++ranks) {
      herd::local::run(ranks, [&](herd::local_communicator& comm) {
        herd::loss_scaler scaler({.initial_scale = 1024.0, .growth_interval = 1000});
        model m(sizes);
        herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make_momentum_sgd, {.max_grad_norm = clip, .scaler = &scaler});
        m.fill_grads(comm.rank(), 0, scaler.scale());
        zero.step();  // a clean step first, so that there is momentum to keep
        REQUIRE_FALSE(zero.last_step_skipped());
        int step = 1;
        for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
          const auto params_before = m.params;
          const auto state_before = state_of(zero.inner());
          const double scale_before = scaler.scale();
          m.fill_grads(comm.rank(), step++, scaler.scale());
          // Element 0 lies in rank 0's shard: the last rank's overflow reaches only rank 0's reduced shard.
          if (comm.rank() == ranks - 1) m.grads[0][0] = bad;
          zero.step();
          INFO("rank ", comm.rank(), " of ", ranks, ", max_grad_norm ", clip, ", gradient ", bad);
          CHECK(zero.last_step_skipped());
          CHECK(m.params == params_before);
          CHECK(state_of(zero.inner()) == state_before);
          CHECK(scaler.scale() == scale_before / 2);
          CHECK(same_scale_everywhere(scaler.scale(), comm));
        }
        CHECK(scaler.skipped_steps() == 2);
        const auto params_before = m.params;
        m.fill_grads(comm.rank(), step, scaler.scale());
        zero.step();  // clean again: it steps
        CHECK_FALSE(zero.last_step_skipped());
        CHECK(m.params != params_before);
        CHECK(scaler.scale() == 256.0);
      });
    }
  }
}

// A checkpoint of a zero_optimizer with a loss scaler holds the scaler's state: a scaler that
// backed off and counted its steps comes back from the file as it was, on every rank.
TEST_CASE("zero_optimizer with a loss scaler: a checkpoint restores the scale and its counters") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  herd::local::run(2, [&](herd::local_communicator& comm) {
    herd::loss_scaler scaler({.initial_scale = 1024.0, .growth_interval = 1000});
    model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make_momentum_sgd, {.scaler = &scaler});
    m.fill_grads(comm.rank(), 0, scaler.scale());
    zero.step();
    m.fill_grads(comm.rank(), 1, scaler.scale());
    if (comm.rank() == 1) m.grads[0][0] = std::numeric_limits<float>::infinity();
    zero.step();  // skipped: 512, one clean step then one skipped
    REQUIRE(scaler.scale() == 512.0);
    const auto file = std::filesystem::temp_directory_path() / ("herd_zero_scaler_" + std::to_string(::getpid()));
    herd::checkpoint saved;
    saved.add_optimizer_state("opt.", zero);
    saved.save(file, comm);
    // Steps that move the scaler on, then the checkpoint back.
    for (int step = 2; step < 5; ++step) {
      m.fill_grads(comm.rank(), step, scaler.scale());
      if (comm.rank() == 0 && step == 3) m.grads[1][0] = std::numeric_limits<float>::quiet_NaN();
      zero.step();
    }
    REQUIRE(scaler.scale() == 256.0);
    herd::checkpoint restored;
    restored.add_optimizer_state("opt.", zero);
    herd::barrier(comm);
    CHECK(restored.load(file, comm));
    INFO("rank ", comm.rank());
    CHECK(scaler.scale() == 512.0);
    CHECK(scaler.skipped_steps() == 1);
    herd::barrier(comm);
    if (comm.rank() == 0) std::filesystem::remove(file);
  });
}

TEST_CASE("zero_optimizer with a loss scaler grows the scale after growth_interval clean steps, alike on every rank, up to max_scale") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  for (int ranks = 1; ranks <= 3; ++ranks) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      herd::loss_scaler scaler({.initial_scale = 256.0, .growth_interval = 3, .max_scale = 2048.0});
      model m(sizes);
      herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make_momentum_sgd, {.scaler = &scaler});
      // Two clean steps, an overflow on the last rank only (the count starts again), then clean
      // steps: x2 after each third, until the cap.
      const std::vector<double> expected = {256, 256, 128, 128, 128, 256, 256, 256, 512, 512, 512, 1024, 1024, 1024, 2048, 2048, 2048, 2048};
      std::vector<double> scales;
      for (int step = 0; step < static_cast<int>(expected.size()); ++step) {
        m.fill_grads(comm.rank(), step, scaler.scale());
        if (step == 2 && comm.rank() == ranks - 1) m.grads[0][0] = std::numeric_limits<float>::infinity();
        zero.step();
        scales.push_back(scaler.scale());
        INFO("rank ", comm.rank(), " of ", ranks, ", step ", step);
        CHECK(same_scale_everywhere(scaler.scale(), comm));
      }
      INFO("rank ", comm.rank(), " of ", ranks);
      CHECK(scales == expected);
      CHECK(scaler.skipped_steps() == 1);
    });
  }
}

TEST_CASE("zero_optimizer with a loss scaler and finite gradients equals zero_optimizer without one on the unscaled gradients, bit for bit") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  auto make_adamw = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::adamw(std::move(p), std::move(g), {.lr = 0.01, .weight_decay = 0.1});
  };
  auto compare = [&](auto make, double clip) {
    for (int ranks = 1; ranks <= 4; ++ranks) {
      herd::local::run(ranks, [&](herd::local_communicator& comm) {
        // Powers of two, growing during the run: scaling and unscaling are exact.
        herd::loss_scaler scaler({.initial_scale = 1024.0, .growth_interval = 2});
        model scaled(sizes), plain(sizes);
        herd::zero_optimizer with(scaled.param_views(), scaled.grad_views(), comm, make, {.max_grad_norm = clip, .scaler = &scaler});
        herd::zero_optimizer without(plain.param_views(), plain.grad_views(), comm, make, {.max_grad_norm = clip});
        for (int step = 0; step < 6; ++step) {
          scaled.fill_grads(comm.rank(), step, scaler.scale());
          plain.fill_grads(comm.rank(), step);
          with.step();
          without.step();
          CHECK_FALSE(with.last_step_skipped());
        }
        INFO("rank ", comm.rank(), " of ", ranks, ", max_grad_norm ", clip);
        CHECK(scaler.scale() == 8192.0);
        CHECK(scaled.params == plain.params);
        CHECK(state_of(with.inner()) == state_of(without.inner()));
        CHECK(with.grad_norm() == without.grad_norm());
      });
    }
  };
  compare(make_momentum_sgd, 0.0);
  compare(make_adamw, 0.0);
  compare(make_adamw, 0.5);
}

TEST_CASE("zero_optimizer with a loss scaler and fp16 on the wire: a scaled sum past f16's range skips, the smaller scale steps unscaled") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    herd::loss_scaler scaler({.initial_scale = 4.0});
    std::vector<float> param(4, 0.0f), grad(4);
    herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); },
                              {.wire = herd::compression::fp16, .scaler = &scaler});
    // 30000 scaled by 4, halved before the sum: 60000 + 60000 is past f16's 65504.
    std::fill(grad.begin(), grad.end(), 30000.0f * static_cast<float>(scaler.scale()));
    zero.step();
    INFO("rank ", comm.rank());
    CHECK(zero.last_step_skipped());
    CHECK(scaler.scale() == 2.0);
    for (float p : param) CHECK(p == 0.0f);
    std::fill(grad.begin(), grad.end(), 30000.0f * static_cast<float>(scaler.scale()));  // 30000 + 30000 fits
    zero.step();
    CHECK_FALSE(zero.last_step_skipped());
    for (float p : param) CHECK(p == -30000.0f);
  });
}

TEST_CASE("zero_optimizer on f16 gradients divides before the sum: two ranks averaging 40000 get 40000, as distributed_optimizer") {
  herd::local::run(2, [](herd::local_communicator& comm) {
    std::vector<herd::half> param(4, herd::half(0.0f)), grad(4, herd::half(40000.0f));  // their f16 sum is past 65504
    herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                              [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); });
    zero.step();
    INFO("rank ", comm.rank());
    for (herd::half p : param) CHECK(static_cast<float>(p) == -40000.0f);
  });
}

TEST_CASE("zero_optimizer at one rank leaves the caller's gradients as given when it unscales and clips, as at two") {
  for (int ranks : {1, 2}) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      herd::loss_scaler scaler({.initial_scale = 4.0});
      std::vector<float> param(3, 0.0f), grad = {12.0f, 16.0f, 0.0f};  // scaled by 4: unscaled 3, 4, 0 (norm 5)
      herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                                [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 1.0}); },
                                {.max_grad_norm = 1.0, .scaler = &scaler});
      zero.step();
      INFO(ranks, " rank(s)");
      CHECK(grad == std::vector<float>{12.0f, 16.0f, 0.0f});
      CHECK(zero.grad_norm() == doctest::Approx(5.0));
      CHECK(param[0] == doctest::Approx(-0.6f));  // clipped to norm 1: 3/5 and 4/5
      CHECK(param[1] == doctest::Approx(-0.8f));
    });
  }
}

// fp16 ZeRO, as DeepSpeed's: f16 parameters with f32 master weights of each rank's shard.
namespace {

// 16-bit parameters of the given sizes, of magnitudes in [1, 2), where an f16 step is 2^-10
// (2^-11 just below 1; bf16's are 2^-7 and 2^-8): an update of about 1e-4 (1e-3 in bf16) is less
// than half of one, and rounds away in 16 bits.
template <class T> struct low_model {
  std::vector<std::vector<T>> params, grads;
  explicit low_model(const std::vector<std::size_t>& sizes) {
    std::size_t at = 0;
    for (std::size_t n : sizes) {
      params.emplace_back(n);
      grads.emplace_back(n);
      for (auto& x : params.back()) {
        x = T(static_cast<float>((1.0 + 0.125 * static_cast<double>(at % 8)) * (at % 3 == 0 ? -1.0 : 1.0)));
        ++at;
      }
    }
  }
  std::vector<herd::buffer_view> param_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : params) v.push_back(herd::view_of(p));
    return v;
  }
  std::vector<herd::buffer_view> grad_views() {
    std::vector<herd::buffer_view> v;
    for (auto& p : grads) v.push_back(herd::view_of(p));
    return v;
  }
  std::vector<T> flat() const {
    std::vector<T> out;
    for (const auto& p : params) out.insert(out.end(), p.begin(), p.end());
    return out;
  }
};
using half_model = low_model<herd::half>;

template <class T> bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; }
template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The gradient of flat element j on rank r at step s, before the loss scale: 6k 2^-16, k in 1..5,
// the same sign everywhere. Times a power-of-two scale, divided by 1, 2 or 3 ranks before the sum,
// summed over up to 3 ranks in f16 or bf16 and unscaled, every value stays exact: the 16-bit
// reduction yields the f32 average of the ranks' gradients exactly.
double half_grad(int rank, int step, std::size_t j) {
  const std::size_t k = 1 + (static_cast<std::size_t>(rank + step) + j) % 5;
  return 6.0 * static_cast<double>(k) / 65536.0;
}

std::vector<herd::buffer_view> float_views(std::vector<std::vector<float>>& ts) {
  std::vector<herd::buffer_view> v;
  for (auto& t : ts) v.push_back(herd::view_of(t));
  return v;
}

// At 1-3 ranks, with and without a loss scaler: zero_optimizer over f16 (or bf16) parameters
// with masters against what one process computes by hand, the wrapped optimizer over f32 copies
// of the parameters stepped with the f32 average of every rank's gradients, rounded to 16 bits;
// beside it the same zero_optimizer without masters, whose 16-bit parameters never move.
template <class T, class Make> void masters_against_f32_by_hand(Make make, int steps) {
  const std::vector<std::size_t> sizes = {5, 3, 9};  // 17 elements: shards cut through parameters at 2 and 3 ranks
  for (bool scaled : {false, true}) {
    for (int ranks = 1; ranks <= 3; ++ranks) {
      herd::local::run(ranks, [&](herd::local_communicator& comm) {
        const double scale = scaled ? 1024.0 : 1.0;
        herd::loss_scaler scaler({.initial_scale = scale, .growth_interval = 1000}),
            plain_scaler({.initial_scale = scale, .growth_interval = 1000});
        low_model<T> m(sizes), plain(sizes);
        const std::vector<T> initial = m.flat();
        herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make, {.scaler = scaled ? &scaler : nullptr});
        herd::zero_optimizer unmastered(plain.param_views(), plain.grad_views(), comm, make,
                                        {.scaler = scaled ? &plain_scaler : nullptr, .master_weights = false});
        // By hand: f32 copies of the parameters, the f32 average of all ranks' gradients.
        std::vector<std::vector<float>> reference, reference_grads;
        for (const auto& p : m.params) {
          reference.emplace_back(p.begin(), p.end());
          reference_grads.emplace_back(p.size());
        }
        auto by_hand = make(float_views(reference), float_views(reference_grads));
        for (int step = 0; step < steps; ++step) {
          std::size_t at = 0;
          for (std::size_t i = 0; i < sizes.size(); ++i) {
            for (std::size_t j = 0; j < sizes[i]; ++j, ++at) {
              m.grads[i][j] = plain.grads[i][j] = T(static_cast<float>(half_grad(comm.rank(), step, at) * scale));
              double sum = 0;
              for (int r = 0; r < ranks; ++r) sum += half_grad(r, step, at);
              reference_grads[i][j] = static_cast<float>(sum / ranks);
            }
          }
          zero.step();
          unmastered.step();
          by_hand.step();
          REQUIRE_FALSE(zero.last_step_skipped());
        }
        INFO("rank ", comm.rank(), " of ", ranks, std::string(scaled ? ", loss scale 1024" : ", no loss scaler"));
        // The parameters: the f32 result rounded to 16 bits, bit for bit, on every rank.
        std::vector<float> expected_masters;
        std::vector<T> expected;
        for (const auto& p : reference) {
          expected_masters.insert(expected_masters.end(), p.begin(), p.end());
          for (float x : p) expected.push_back(T(x));
        }
        CHECK(same_bits(m.flat(), expected));
        std::size_t moved = 0;
        for (std::size_t j = 0; j < expected.size(); ++j) moved += same_bits(expected[j], initial[j]) ? 0u : 1u;
        CHECK(moved * 2 > expected.size());  // most moved, by updates 16 bits alone round away...
        CHECK(same_bits(plain.flat(), initial));  // ...as the 16-bit parameters stepped themselves show
        // The masters: this rank's shard of the f32 result, bit for bit; the wrapped optimizer's state f32.
        const herd::buffer_view masters = zero.master_shard();
        CHECK(masters.count == zero.shard().count());
        CHECK(masters.type == herd::dtype::f32);
        if (masters.count == zero.shard().count() && masters.type == herd::dtype::f32) {
          CHECK(std::memcmp(masters.data, expected_masters.data() + zero.shard().begin, masters.bytes()) == 0);
        }
        herd::visit_optimizer_state(zero.inner(), [&](const auto& name, herd::buffer_view v) {
          INFO(std::string(name));
          if (v.type != herd::dtype::i64) CHECK(v.type == herd::dtype::f32);
        });
      });
    }
  }
}

}  // namespace

TEST_CASE("zero_optimizer with f16 parameters keeps f32 masters of its shard: at 1-3 ranks, bit for bit the f32 optimizer on the averaged gradients, rounded") {
  SUBCASE("AdamW") {
    masters_against_f32_by_hand<herd::half>([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = 1e-4, .weight_decay = 0.01});
    }, 12);
  }
  SUBCASE("SGD with momentum") {
    masters_against_f32_by_hand<herd::half>([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = 0.03, .momentum = 0.9});
    }, 16);
  }
  SUBCASE("AdamW on bf16 parameters") {  // bf16's steps are 8 times f16's: so is the learning rate
    masters_against_f32_by_hand<herd::bfloat16>([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = 1e-3, .weight_decay = 0.01});
    }, 12);
  }
}

TEST_CASE("zero_optimizer's masters follow broadcast_parameters after construction: every rank steps from rank 0's weights") {
  for (int ranks : {2, 4}) {  // at 4 ranks, 9 elements make shards of 3, 3, 3 and 0
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      // Each rank starts from its own weights, as each would from its own random initialization.
      std::vector<herd::half> param(9, herd::half(0.5f * static_cast<float>(comm.rank() + 1))), grad(9, herd::half(64.0f));
      herd::loss_scaler scaler({.initial_scale = 256});
      herd::zero_optimizer zero(herd::views(param), herd::views(grad), comm,
                                [](auto p, auto g) { return herd::sgd(std::move(p), std::move(g), {.lr = 0.5}); },
                                {.scaler = &scaler});
      herd::broadcast_parameters(herd::views(param), comm, 0);
      zero.step();
      INFO("rank ", comm.rank(), " of ", ranks);
      // 0.5 - 0.5 * 64 / 256 everywhere: no rank's construction-time master is stepped.
      for (const herd::half& p : param) CHECK(static_cast<float>(p) == 0.375f);
    });
  }
}

TEST_CASE("zero_optimizer with f16 parameters and masters: an inf in one rank's gradients skips the step on every rank, masters untouched") {
  for (int ranks = 1; ranks <= 3; ++ranks) {
    herd::local::run(ranks, [&](herd::local_communicator& comm) {
      herd::loss_scaler scaler({.initial_scale = 1024, .growth_interval = 1000});
      half_model m({37, 1, 251});
      herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, [](auto p, auto g) {
        return herd::adamw(std::move(p), std::move(g), {.lr = 1e-4});
      }, {.scaler = &scaler});
      const auto fill = [&](int step) {
        std::size_t at = 0;
        for (auto& t : m.grads)
          for (auto& x : t) x = herd::half(static_cast<float>(half_grad(comm.rank(), step, at++) * scaler.scale()));
      };
      fill(0);
      zero.step();
      REQUIRE_FALSE(zero.last_step_skipped());
      const herd::buffer_view masters = zero.master_shard();
      const std::vector<std::byte> masters_before(static_cast<const std::byte*>(masters.data),
                                                  static_cast<const std::byte*>(masters.data) + masters.bytes());
      const auto params_before = m.flat();
      const auto state_before = state_of(zero.inner());
      fill(1);
      if (comm.rank() == ranks - 1) m.grads[0][0] = herd::half(std::numeric_limits<float>::infinity());  // rank 0's shard
      zero.step();
      INFO("rank ", comm.rank(), " of ", ranks);
      CHECK(zero.last_step_skipped());
      CHECK(scaler.scale() == 512.0);
      CHECK(same_bits(m.flat(), params_before));
      CHECK(state_of(zero.inner()) == state_before);
      CHECK(std::memcmp(masters.data, masters_before.data(), masters.bytes()) == 0);
    });
  }
}

namespace {

// Gradients of step s on rank 0 (random, times `scale`, in f16), zeros elsewhere, summed: every
// world size reduces them to rank 0's exactly.
void rank0_half_grads(half_model& m, int rank, int step, double scale) {
  herd_test::rng g(static_cast<std::uint64_t>(step) + 77);
  for (auto& t : m.grads)
    for (auto& x : t) x = herd::half(rank == 0 ? static_cast<float>((g.unit() - 0.5) * 1e-2 * scale) : 0.0f);
}

herd::checkpoint half_run_state(half_model& m, auto& opt) {
  herd::checkpoint state;
  for (std::size_t i = 0; i < m.params.size(); ++i) state.add("param." + std::to_string(i), m.params[i]);
  state.add_optimizer_state("opt.", opt);
  return state;
}

// Saved at 2 ranks after `k` steps, loaded at 1, 3 and 4 ranks, `more` steps: the parameters and
// the final file, bit for bit, of `k + more` uninterrupted steps at that world size. The file
// holds each parameter's whole master, "opt.master.i", whose extra bits the parameters lack.
template <class Make> void resume_half_at_other_world_sizes(Make make) {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  const int k = 3, more = 4;
  const auto dir = std::filesystem::temp_directory_path() / ("herd_zero_masters_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto train = [](half_model& m, auto& opt, herd::loss_scaler& scaler, int rank, int from, int to) {
    for (int step = from; step < to; ++step) {
      rank0_half_grads(m, rank, step, scaler.scale());
      opt.step();
      REQUIRE_FALSE(opt.last_step_skipped());
    }
  };
  const auto options = [](herd::loss_scaler& scaler) {
    return herd::zero_options{.op = herd::reduce_op::sum, .scaler = &scaler};
  };
  herd::local::run(2, [&](herd::local_communicator& comm) {
    herd::loss_scaler scaler({.initial_scale = 1024, .growth_interval = 2});  // it grows during the run
    half_model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make, options(scaler));
    train(m, zero, scaler, comm.rank(), 0, k);
    half_run_state(m, zero).save(dir / "zero_at_2", comm);
    // The file's masters: whole, f32, rounding to the parameters, with bits the parameters lack.
    std::vector<float> master(251);
    herd::checkpoint read;
    read.set_strict(false).add("opt.master.2", master);
    REQUIRE(read.load(dir / "zero_at_2"));
    std::size_t finer = 0;
    for (std::size_t j = 0; j < master.size(); ++j) {
      CHECK(same_bits(herd::half(master[j]), m.params[2][j]));
      finer += master[j] != static_cast<float>(m.params[2][j]) ? 1u : 0u;
    }
    CHECK(finer > 0);
  });
  for (int world : {1, 3, 4}) {
    const auto reference_file = dir / ("reference_at_" + std::to_string(world));
    const auto resumed_file = dir / ("resumed_at_" + std::to_string(world));
    herd::local::run(world, [&](herd::local_communicator& comm) {
      herd::loss_scaler reference_scaler({.initial_scale = 1024, .growth_interval = 2});
      half_model reference(sizes);
      herd::zero_optimizer uninterrupted(reference.param_views(), reference.grad_views(), comm, make, options(reference_scaler));
      train(reference, uninterrupted, reference_scaler, comm.rank(), 0, k + more);
      half_run_state(reference, uninterrupted).save(reference_file, comm);

      herd::loss_scaler scaler({.initial_scale = 1024, .growth_interval = 2});
      half_model resumed(sizes);
      for (auto& p : resumed.params) std::fill(p.begin(), p.end(), herd::half(7.0f));  // all of it comes from the file
      herd::zero_optimizer zero(resumed.param_views(), resumed.grad_views(), comm, make, options(scaler));
      herd::checkpoint state = half_run_state(resumed, zero);
      REQUIRE(state.load(dir / "zero_at_2", comm));
      train(resumed, zero, scaler, comm.rank(), k, k + more);
      state.save(resumed_file, comm);
      INFO("rank ", comm.rank(), " of ", world);
      CHECK(same_bits(resumed.flat(), reference.flat()));
      CHECK(scaler.scale() == reference_scaler.scale());
    });
    INFO("world size ", world);
    CHECK(file_bytes(resumed_file) == file_bytes(reference_file));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("zero_optimizer with f16 parameters and masters: saved at 2 ranks, it resumes at 1, 3 and 4 ranks bit for bit") {
  SUBCASE("AdamW") {
    resume_half_at_other_world_sizes([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::adamw(std::move(p), std::move(g), {.lr = 1e-4, .weight_decay = 0.1});
    });
  }
  SUBCASE("SGD with momentum") {
    resume_half_at_other_world_sizes([](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
      return herd::sgd(std::move(p), std::move(g), {.lr = 0.01, .momentum = 0.9});
    });
  }
}

TEST_CASE("zero_optimizer with masters loads a file without them (strict off): the masters are read from the loaded parameters") {
  const std::vector<std::size_t> sizes = {37, 1, 251};
  const auto file = std::filesystem::temp_directory_path() / ("herd_zero_no_masters_" + std::to_string(::getpid()));
  auto make = [](std::vector<herd::buffer_view> p, std::vector<herd::buffer_view> g) {
    return herd::adamw(std::move(p), std::move(g), {.lr = 1e-3});
  };
  const herd::zero_options sum{.op = herd::reduce_op::sum};
  herd::local::run(2, [&](herd::local_communicator& comm) {  // f16 stepped itself: a file without masters
    half_model m(sizes);
    herd::zero_optimizer zero(m.param_views(), m.grad_views(), comm, make,
                              {.op = herd::reduce_op::sum, .master_weights = false});
    for (int step = 0; step < 3; ++step) {
      rank0_half_grads(m, comm.rank(), step, 1.0);
      zero.step();
    }
    half_run_state(m, zero).save(file, comm);
  });
  herd::local::run(3, [&](herd::local_communicator& comm) {
    // Loaded into an optimizer built over other weights, and into one built over the file's weights.
    half_model resumed(sizes), expected(sizes);
    for (auto& p : resumed.params) std::fill(p.begin(), p.end(), herd::half(7.0f));
    herd::zero_optimizer zero(resumed.param_views(), resumed.grad_views(), comm, make, sum);
    herd::checkpoint state = half_run_state(resumed, zero);
    state.set_strict(false);
    REQUIRE(state.load(file, comm));
    CHECK(state.missing_keys().size() == sizes.size());  // opt.master.0, 1 and 2
    herd::checkpoint weights;
    for (std::size_t i = 0; i < sizes.size(); ++i) weights.add("param." + std::to_string(i), expected.params[i]);
    REQUIRE(weights.set_strict(false).load(file, comm));
    herd::zero_optimizer fresh(expected.param_views(), expected.grad_views(), comm, make, sum);  // masters read at construction
    herd::checkpoint fresh_state = half_run_state(expected, fresh);
    REQUIRE(fresh_state.set_strict(false).load(file, comm));
    for (int step = 3; step < 6; ++step) {
      rank0_half_grads(resumed, comm.rank(), step, 1.0);
      rank0_half_grads(expected, comm.rank(), step, 1.0);
      zero.step();
      fresh.step();
    }
    INFO("rank ", comm.rank());
    CHECK(same_bits(resumed.flat(), expected.flat()));
    CHECK(static_cast<float>(resumed.params[0][0]) < 2.0f);  // far from 7
    herd::barrier(comm);
    if (comm.rank() == 0) std::filesystem::remove(file);
  });
}
