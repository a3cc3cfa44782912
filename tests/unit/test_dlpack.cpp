// The DLPack adapter (herd/tensor/dlpack.hpp): dtype and device mapping, the compactness check,
// byte_offset, element counts, and how a rejected DLTensor on one rank surfaces on every rank.

#include <herd/collectives/allreduce.hpp>
#include <herd/comm/local.hpp>
#include <herd/core/error.hpp>
#include <herd/tensor/buffer_view.hpp>
#include <herd/tensor/dlpack.hpp>
#include <herd/tensor/std.hpp>

#include <doctest/doctest.h>

#include "../support/checks.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using herd_test::error_of;
using herd_test::has;

namespace {

DLDataType dl_type(DLDataTypeCode code, int bits, int lanes = 1) {
  DLDataType t;
  t.code = static_cast<std::uint8_t>(code);
  t.bits = static_cast<std::uint8_t>(bits);
  t.lanes = static_cast<std::uint16_t>(lanes);
  return t;
}

// A CPU float32 DLTensor over `data` with the given shape; strides NULL unless given.
DLTensor dl_tensor(void* data, std::vector<std::int64_t>& shape, std::int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = static_cast<std::int32_t>(shape.size());
  t.dtype = dl_type(kDLFloat, 32);
  t.shape = shape.empty() ? nullptr : shape.data();
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

}  // namespace

static_assert(herd::writable_tensor<DLTensor>);

TEST_CASE("every supported DLPack dtype maps to its herd dtype") {
  struct row {
    DLDataTypeCode code;
    int bits;
    herd::dtype expected;
  };
  const row rows[] = {
      {kDLFloat, 16, herd::dtype::f16}, {kDLFloat, 32, herd::dtype::f32}, {kDLFloat, 64, herd::dtype::f64},
      {kDLBfloat, 16, herd::dtype::bf16}, {kDLInt, 8, herd::dtype::i8},   {kDLInt, 32, herd::dtype::i32},
      {kDLInt, 64, herd::dtype::i64},     {kDLUInt, 8, herd::dtype::u8},
  };
  std::vector<std::int64_t> shape{4};
  std::array<std::int64_t, 4> storage{};
  for (const row& r : rows) {
    CAPTURE(herd::name(r.expected));
    DLTensor t = dl_tensor(storage.data(), shape);
    t.dtype = dl_type(r.code, r.bits);
    CHECK(herd::tensor_traits<DLTensor>::dtype(t) == r.expected);
    const herd::buffer_view v = herd::view_of(t);
    CHECK(v.type == r.expected);
    CHECK(v.count == 4);
    CHECK(v.bytes() == 4 * static_cast<std::size_t>(r.bits) / 8);
    CHECK(herd::const_view_of(t).type == r.expected);
  }
}

TEST_CASE("unsupported DLPack dtypes throw herd::error naming code, bits and lanes") {
  struct row {
    DLDataType type;
    const char* code;
    const char* bits;
    const char* lanes;
  };
  const row rows[] = {
      {dl_type(kDLFloat, 8), "code 2", "bits 8", "lanes 1"},
      {dl_type(kDLInt, 16), "code 0", "bits 16", "lanes 1"},
      {dl_type(kDLUInt, 32), "code 1", "bits 32", "lanes 1"},
      {dl_type(kDLBfloat, 32), "code 4", "bits 32", "lanes 1"},
      {dl_type(kDLComplex, 64), "code 5", "bits 64", "lanes 1"},
      {dl_type(kDLFloat, 32, 4), "code 2", "bits 32", "lanes 4"},
      {dl_type(kDLInt, 8, 0), "code 0", "bits 8", "lanes 0"},
      {dl_type(kDLBool, 8), "code 6", "bits 8", "lanes 1"},
      {dl_type(kDLOpaqueHandle, 64), "code 3", "bits 64", "lanes 1"},
  };
  std::vector<std::int64_t> shape{2};
  std::array<std::int64_t, 8> storage{};
  for (const row& r : rows) {
    CAPTURE(r.code);
    CAPTURE(r.bits);
    CAPTURE(r.lanes);
    DLTensor t = dl_tensor(storage.data(), shape);
    t.dtype = r.type;
    const std::string message = error_of([&] { (void)herd::tensor_traits<DLTensor>::dtype(t); });
    CHECK(has(message, r.code));
    CHECK(has(message, r.bits));
    CHECK(has(message, r.lanes));
    CHECK_THROWS_AS(herd::view_of(t), herd::error);
    CHECK_THROWS_AS(herd::const_view_of(t), herd::error);
  }
}

TEST_CASE("DLPack devices: host kinds are cpu, CUDA kinds are cuda(id), others throw") {
  std::vector<std::int64_t> shape{3};
  float storage[3] = {};
  DLTensor t = dl_tensor(storage, shape);

  t.device = DLDevice{kDLCPU, 0};
  CHECK(herd::tensor_traits<DLTensor>::device(t) == herd::device::cpu());
  t.device = DLDevice{kDLCUDAHost, 0};
  CHECK(herd::tensor_traits<DLTensor>::device(t) == herd::device::cpu());
  CHECK(herd::view_of(t).device == herd::device::cpu());

  t.device = DLDevice{kDLCUDA, 3};
  CHECK(herd::tensor_traits<DLTensor>::device(t) == herd::device::cuda(3));
  CHECK(herd::view_of(t).device == herd::device::cuda(3));
  t.device = DLDevice{kDLCUDA, 0};
  CHECK(herd::tensor_traits<DLTensor>::device(t) == herd::device::cuda(0));
  t.device = DLDevice{kDLCUDAManaged, 1};
  CHECK(herd::tensor_traits<DLTensor>::device(t) == herd::device::cuda(1));
  CHECK(herd::const_view_of(t).device == herd::device::cuda(1));

  for (DLDeviceType other : {kDLOpenCL, kDLVulkan, kDLMetal, kDLROCM, kDLROCMHost, kDLOneAPI}) {
    CAPTURE(static_cast<int>(other));
    t.device = DLDevice{other, 0};
    const std::string message = error_of([&] { (void)herd::tensor_traits<DLTensor>::device(t); });
    CHECK(has(message, "device type " + std::to_string(static_cast<int>(other))));
    CHECK_THROWS_AS(herd::view_of(t), herd::error);
  }
}

TEST_CASE("DLPack strides: NULL, row-major and odd strides of size-1 dimensions are accepted") {
  float storage[24] = {};

  SUBCASE("NULL strides") {
    std::vector<std::int64_t> shape{2, 3, 4};
    DLTensor t = dl_tensor(storage, shape);
    const herd::buffer_view v = herd::view_of(t);
    CHECK(v.data == static_cast<void*>(storage));
    CHECK(v.count == 24);
  }
  SUBCASE("explicit row-major strides") {
    std::vector<std::int64_t> shape{2, 3, 4};
    std::int64_t strides[] = {12, 4, 1};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(herd::view_of(t).data == static_cast<void*>(storage));
    CHECK(herd::view_of(t).count == 24);
    CHECK(herd::const_view_of(t).count == 24);
  }
  SUBCASE("size-1 dimensions with arbitrary strides") {
    std::vector<std::int64_t> shape{1, 6, 1, 4};
    std::int64_t strides[] = {999, 4, -7, 1};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(herd::view_of(t).count == 24);
  }
  SUBCASE("a single element with a zero stride") {
    std::vector<std::int64_t> shape{1};
    std::int64_t strides[] = {0};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(herd::view_of(t).count == 1);
  }
}

TEST_CASE("DLPack strides that are not compact row-major throw herd::error") {
  float storage[24] = {};

  SUBCASE("a transposed 2x3") {
    std::vector<std::int64_t> shape{2, 3};
    std::int64_t strides[] = {1, 2};  // column-major: the transpose of a contiguous 3x2
    DLTensor t = dl_tensor(storage, shape, strides);
    const std::string message = error_of([&] { (void)herd::view_of(t); });
    CHECK(has(message, "not compact"));
    CHECK_THROWS_AS(herd::const_view_of(t), herd::error);
    CHECK_THROWS_AS(herd::tensor_traits<DLTensor>::data(t), herd::error);
  }
  SUBCASE("every other element") {
    std::vector<std::int64_t> shape{4};
    std::int64_t strides[] = {2};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(has(error_of([&] { (void)herd::view_of(t); }), "not compact"));
  }
  SUBCASE("padded rows") {
    std::vector<std::int64_t> shape{2, 3};
    std::int64_t strides[] = {4, 1};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(has(error_of([&] { (void)herd::view_of(t); }), "not compact"));
  }
  SUBCASE("a broadcast dimension (stride 0)") {
    std::vector<std::int64_t> shape{3, 2};
    std::int64_t strides[] = {0, 1};
    DLTensor t = dl_tensor(storage, shape, strides);
    CHECK(has(error_of([&] { (void)herd::view_of(t); }), "not compact"));
  }
}

// PyTorch and NumPy give empty tensors strides computed with max(size, 1): a fresh contiguous
// torch.empty(3, 0) exports shape {3, 0} and strides {1, 1}, and .contiguous() leaves it so.
// It holds no elements, so no layout can be wrong.
TEST_CASE("DLPack empty tensors with max(size, 1) strides are accepted") {
  std::vector<std::int64_t> shape{3, 0};
  std::int64_t strides[] = {1, 1};
  DLTensor t = dl_tensor(nullptr, shape, strides);
  CHECK_NOTHROW((void)herd::view_of(t));
}

TEST_CASE("malformed DLTensors throw herd::error") {
  float storage[4] = {};
  std::vector<std::int64_t> shape{2, 2};
  DLTensor t = dl_tensor(storage, shape);

  SUBCASE("ndim without a shape") {
    t.shape = nullptr;
    CHECK_THROWS_AS(herd::view_of(t), herd::error);
  }
  SUBCASE("a negative dimension") {
    shape[1] = -2;
    CHECK_THROWS_AS(herd::view_of(t), herd::error);
  }
  SUBCASE("a negative ndim") {
    t.ndim = -1;
    CHECK_THROWS_AS(herd::view_of(t), herd::error);
  }
}

TEST_CASE("DLPack byte_offset is added to data") {
  std::array<double, 8> storage{};
  std::vector<std::int64_t> shape{5};
  DLTensor t = dl_tensor(storage.data(), shape);
  t.dtype = dl_type(kDLFloat, 64);
  t.byte_offset = 3 * sizeof(double);
  CHECK(herd::view_of(t).data == static_cast<void*>(storage.data() + 3));
  CHECK(herd::const_view_of(t).data == static_cast<const void*>(storage.data() + 3));
  CHECK(herd::tensor_traits<DLTensor>::data(t) == static_cast<void*>(storage.data() + 3));
  CHECK(herd::view_of(t).count == 5);
  // The DLTensor itself is left as it was.
  CHECK(t.data == static_cast<void*>(storage.data()));
  CHECK(t.byte_offset == 3 * sizeof(double));
}

TEST_CASE("DLPack element counts: 0-dim is a scalar, a 0 in the shape is empty") {
  float scalar = 0;
  std::vector<std::int64_t> none;
  DLTensor s = dl_tensor(&scalar, none);
  CHECK(s.ndim == 0);
  CHECK(herd::tensor_traits<DLTensor>::size(s) == 1);
  CHECK(herd::view_of(s).count == 1);
  CHECK(herd::view_of(s).data == static_cast<void*>(&scalar));

  std::vector<std::int64_t> shape{3, 0, 5};
  DLTensor e = dl_tensor(nullptr, shape);
  CHECK(herd::tensor_traits<DLTensor>::size(e) == 0);
  CHECK(herd::view_of(e).count == 0);
  CHECK(herd::view_of(e).data == nullptr);

  std::vector<std::int64_t> big{2, 3, 4, 5};
  DLTensor b = dl_tensor(nullptr, big);
  CHECK(herd::tensor_traits<DLTensor>::size(b) == 120);
}

TEST_CASE("allreduce on DLTensors over 3 local ranks") {
  std::array<std::vector<float>, 3> in_place;
  std::array<std::vector<std::int64_t>, 3> out_of_place;
  std::array<std::vector<std::int64_t>, 3> inputs_after;
  herd::local::run(3, [&](herd::local_communicator& comm) {
    const int r = comm.rank();
    const auto slot = static_cast<std::size_t>(r);

    // A 2x3 float32 with explicit row-major strides, one float of padding before it.
    std::vector<float> buffer(7, -1.0f);
    for (std::size_t i = 0; i < 6; ++i) buffer[i + 1] = static_cast<float>(r * 10) + static_cast<float>(i);
    std::vector<std::int64_t> shape{2, 3};
    std::int64_t strides[] = {3, 1};
    DLTensor t = dl_tensor(buffer.data(), shape, strides);
    t.byte_offset = sizeof(float);
    herd::allreduce(t, comm);
    in_place[slot] = buffer;

    // int64, out of place, shape 4x1x2.
    std::vector<std::int64_t> source(8);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = (r + 1) * static_cast<std::int64_t>(i + 1);
    std::vector<std::int64_t> target(8, 0);
    std::vector<std::int64_t> shape3{4, 1, 2};
    DLTensor in = dl_tensor(source.data(), shape3);
    in.dtype = dl_type(kDLInt, 64);
    DLTensor out = dl_tensor(target.data(), shape3);
    out.dtype = dl_type(kDLInt, 64);
    herd::allreduce(in, out, comm);
    out_of_place[slot] = target;
    inputs_after[slot] = source;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(in_place[r].size() == 7);
    CHECK(in_place[r][0] == -1.0f);  // before byte_offset: untouched
    for (std::size_t i = 0; i < 6; ++i) CHECK(in_place[r][i + 1] == 30.0f + 3.0f * static_cast<float>(i));
    REQUIRE(out_of_place[r].size() == 8);
    for (std::size_t i = 0; i < 8; ++i) {
      CHECK(out_of_place[r][i] == 6 * static_cast<std::int64_t>(i + 1));
      CHECK(inputs_after[r][i] == static_cast<std::int64_t>(r + 1) * static_cast<std::int64_t>(i + 1));
    }
  }
}

TEST_CASE("a non-compact DLTensor on rank 1 raises herd::error on every rank, and nobody hangs") {
  constexpr int ranks = 3;
  std::array<std::string, ranks> messages;
  std::array<int, ranks> error_ranks{-1, -1, -1};
  std::array<std::vector<float>, ranks> after;
  std::array<bool, ranks> untouched{};
  herd::local::run(ranks, [&](herd::local_communicator& comm) {
    const int r = comm.rank();
    const auto slot = static_cast<std::size_t>(r);
    std::vector<float> buffer(6, static_cast<float>(r + 1));
    std::vector<std::int64_t> shape{2, 3};
    std::int64_t row_major[] = {3, 1};
    std::int64_t transposed[] = {1, 2};
    DLTensor t = dl_tensor(buffer.data(), shape, r == 1 ? transposed : row_major);
    try {
      herd::allreduce(t, comm);
    } catch (const herd::error& e) {
      messages[slot] = e.what();
      error_ranks[slot] = e.rank();
    }
    untouched[slot] = buffer == std::vector<float>(6, static_cast<float>(r + 1));
    // Every rank took part in the exchange before raising, so the next collective still works.
    std::vector<float> next(4, static_cast<float>(r));
    herd::allreduce(next, comm);
    after[slot] = next;
  });
  for (std::size_t r = 0; r < static_cast<std::size_t>(ranks); ++r) {
    CAPTURE(r);
    CAPTURE(messages[r]);
    CHECK_FALSE(messages[r].empty());
    CHECK(error_ranks[r] == static_cast<int>(r));
    CHECK(has(messages[r], "allreduce on rank " + std::to_string(r) + " of 3"));
    if (r == 1) {
      CHECK(has(messages[r], "adapter"));
      CHECK(has(messages[r], "rejected"));
      CHECK(has(messages[r], "not compact"));
    } else {
      CHECK(has(messages[r], "rank 1 passed"));
      CHECK(has(messages[r], "adapter rejected"));
    }
    CHECK(untouched[r]);  // no data moved
    CHECK(after[r] == std::vector<float>(4, 3.0f));  // 0 + 1 + 2
  }
}
