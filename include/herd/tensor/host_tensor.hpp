#ifndef HERD_TENSOR_HOST_TENSOR_HPP
#define HERD_TENSOR_HOST_TENSOR_HPP
// herd::host_tensor: a small owning buffer of host memory with a dtype. herd uses it for
// optimizer state and staging; users may too.

#include <herd/tensor/buffer_view.hpp>

#include <cstddef>
#include <cstring>
#include <memory>

namespace herd {

class host_tensor {
 public:
  host_tensor() = default;
  host_tensor(herd::dtype type, std::size_t count)
      : bytes_(count * size_of(type) == 0 ? nullptr : new std::byte[count * size_of(type)]()), count_(count), type_(type) {}

  host_tensor(host_tensor&&) noexcept = default;
  host_tensor& operator=(host_tensor&&) noexcept = default;
  host_tensor(const host_tensor& other) : host_tensor(other.type_, other.count_) {
    if (count_ != 0) std::memcpy(bytes_.get(), other.bytes_.get(), bytes());
  }
  host_tensor& operator=(const host_tensor& other) {
    if (this != &other) *this = host_tensor(other);
    return *this;
  }

  void* data() noexcept { return bytes_.get(); }
  const void* data() const noexcept { return bytes_.get(); }
  std::size_t count() const noexcept { return count_; }
  herd::dtype type() const noexcept { return type_; }
  std::size_t bytes() const noexcept { return count_ * size_of(type_); }
  buffer_view view() noexcept { return {data(), count_, type_, device::cpu()}; }

  // Grows (never shrinks) to hold at least `count` elements of `type`; the contents are lost.
  void reserve(herd::dtype type, std::size_t count) {
    if (count * size_of(type) > capacity_bytes()) *this = host_tensor(type, count);
    type_ = type;
    count_ = count;
  }

 private:
  std::size_t capacity_bytes() const noexcept { return bytes_ ? capacity_ : 0; }

  std::unique_ptr<std::byte[]> bytes_;
  std::size_t count_ = 0;
  herd::dtype type_ = herd::dtype::f32;
  std::size_t capacity_ = count_ * size_of(type_);
};

template <> struct tensor_traits<host_tensor> {
  static void* data(host_tensor& t) noexcept { return t.data(); }
  static const void* data(const host_tensor& t) noexcept { return t.data(); }
  static std::size_t size(const host_tensor& t) noexcept { return t.count(); }
  static herd::dtype dtype(const host_tensor& t) noexcept { return t.type(); }
  static herd::device device(const host_tensor&) noexcept { return herd::device::cpu(); }
};

}  // namespace herd

#endif  // HERD_TENSOR_HOST_TENSOR_HPP
