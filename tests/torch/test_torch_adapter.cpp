// The torch::Tensor adapter: every dtype, the devices, and the tensors it must refuse.
//
// Included through the paths the libtorch headers had before herd/torch/, which forward there:
// programs that still name them build and run as before. Part of torch_mpi_tests (first in its one
// translation unit, so the old paths are included before the new), run by its one-rank run only.

#include <torch/torch.h>

#include <herd/herd.hpp>
#include <herd/optim/torch.hpp>
#include <herd/tensor/torch.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

static_assert(herd::writable_tensor<torch::Tensor>);

TEST_SUITE_BEGIN("one process");

TEST_CASE("every torch dtype herd knows maps to its herd dtype") {
  const std::pair<torch::Dtype, herd::dtype> pairs[] = {
      {torch::kFloat16, herd::dtype::f16}, {torch::kBFloat16, herd::dtype::bf16}, {torch::kFloat32, herd::dtype::f32},
      {torch::kFloat64, herd::dtype::f64}, {torch::kInt8, herd::dtype::i8},       {torch::kUInt8, herd::dtype::u8},
      {torch::kInt32, herd::dtype::i32},   {torch::kInt64, herd::dtype::i64}};
  for (const auto& [torch_type, herd_type] : pairs) {
    torch::Tensor t = torch::zeros({2, 3, 4}, torch::TensorOptions().dtype(torch_type));
    const herd::buffer_view v = herd::view_of(t);
    CHECK(v.type == herd_type);
    CHECK(v.count == 24);
    CHECK(v.data == t.data_ptr());
    CHECK(v.device == herd::device::cpu());
    CHECK(v.bytes() == static_cast<std::size_t>(t.nbytes()));
  }
  torch::Tensor scalar = torch::tensor(3.5);
  CHECK(herd::view_of(scalar).count == 1);
  torch::Tensor empty = torch::zeros({0, 5});
  CHECK(herd::view_of(empty).count == 0);
}

TEST_CASE("undefined, non-contiguous, sparse and unsupported tensors raise herd::error") {
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const herd::error& e) {
      return e.what();
    }
    return "(no error)";
  };
  torch::Tensor undefined;
  CHECK(message([&] { (void)herd::view_of(undefined); }).find("undefined") != std::string::npos);
  torch::Tensor transposed = torch::zeros({3, 4}).t();
  CHECK(message([&] { (void)herd::view_of(transposed); }).find("not contiguous") != std::string::npos);
  torch::Tensor sparse = torch::zeros({4, 4}).to_sparse();
  CHECK(message([&] { (void)herd::view_of(sparse); }).find("not a dense tensor") != std::string::npos);
  for (auto bad : {torch::kBool, torch::kInt16, torch::kComplexFloat}) {
    torch::Tensor t = torch::zeros({2}, torch::TensorOptions().dtype(bad));
    const std::string m = message([&] { (void)herd::view_of(t); });
    INFO(m);
    CHECK(m.find("has no herd dtype") != std::string::npos);
  }
}

TEST_CASE("collectives on torch tensors, and a bad tensor on one rank fails every rank") {
  herd::local::run(3, [](herd::local_communicator& comm) {
    torch::Tensor t = torch::full({5, 7}, static_cast<double>(comm.rank() + 1), torch::kFloat64);
    herd::allreduce(t, comm, herd::reduce_op::avg);
    CHECK(t.allclose(torch::full({5, 7}, 2.0, torch::kFloat64)));
    torch::Tensor b = comm.rank() == 1 ? torch::arange(10, torch::kInt32) : torch::zeros({10}, torch::kInt32);
    herd::broadcast(b, comm, 1);
    CHECK(b.equal(torch::arange(10, torch::kInt32)));
    torch::Tensor bad = comm.rank() == 2 ? torch::zeros({4, 4}).t() : torch::zeros({4, 4});
    std::string m;
    try {
      herd::allreduce(bad, comm);
    } catch (const herd::error& e) {
      m = e.what();
    }
    INFO(m);
    CHECK(m.find(comm.rank() == 2 ? "not contiguous" : "rank 2 passed a tensor its adapter rejected") != std::string::npos);
  });
}

TEST_CASE("torch_gradients reads grad() afresh and gives unused parameters zeros") {
  torch::nn::Linear used(3, 2), unused(3, 2);
  std::vector<torch::Tensor> params = used->parameters();
  for (auto& p : unused->parameters()) params.push_back(p);
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  auto gradients = herd::torch_gradients(sgd);
  used->forward(torch::ones({4, 3})).sum().backward();
  auto views = gradients();
  REQUIRE(views.size() == 4);
  CHECK(views[0].data == used->weight.grad().data_ptr());
  CHECK(unused->weight.grad().defined());
  CHECK(unused->weight.grad().abs().sum().item<float>() == 0.0f);
  sgd.zero_grad();  // libtorch 1.13 keeps the tensors; a later version may drop them (set_to_none)
  used->weight.mutable_grad() = torch::ones({2, 3});  // a replaced gradient tensor
  views = gradients();
  CHECK(views[0].data == used->weight.grad().data_ptr());
}

TEST_SUITE_END();
