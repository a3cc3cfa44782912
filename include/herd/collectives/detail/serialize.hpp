#ifndef HERD_COLLECTIVES_DETAIL_SERIALIZE_HPP
#define HERD_COLLECTIVES_DETAIL_SERIALIZE_HPP
// The bytes of a host value, for allgather_object and broadcast_object: a trivially copyable
// value as it lies in memory; a std::string or std::vector (of any of these) as its length and
// then its elements. Every rank runs the same build, so no byte order or padding is converted.
//
// A fingerprint of the type goes with the bytes (its shape, and for a trivially copyable type its
// name as the compiler spells it), so that ranks passing different types are told so instead of
// reading one another's bytes as their own.

#include <herd/core/config.hpp>
#include <herd/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace herd::detail {

// FNV-1a over a few words.
constexpr std::uint64_t mix(std::uint64_t h, std::uint64_t word) {
  for (int byte = 0; byte < 8; ++byte) {
    h ^= (word >> (8 * byte)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

// The name of T as this compiler spells it in __PRETTY_FUNCTION__ (g++, clang, and nvcc, whose host
// code g++ compiles): it tells apart types of one shape, such as std::array<float, 2> and
// std::array<int, 2>, or two structs of an int and a float in either order.
template <class T> constexpr std::uint64_t type_name_hash() {
  const std::string_view function = __PRETTY_FUNCTION__;
  const std::size_t at = function.find("T = ");
  std::string_view name = at == std::string_view::npos ? function : function.substr(at + 4);
  name = name.substr(0, name.find_first_of(";]"));
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// Reads the bytes back, refusing to read past their end.
class object_reader {
 public:
  object_reader(const std::byte* data, std::size_t bytes) : data_(data), left_(bytes) {}

  // n elements of `element_bytes` each.
  const std::byte* take(std::uint64_t n, std::size_t element_bytes = 1) {
    if (n > left_ / element_bytes) throw error("herd: a serialized object ends early; every rank must run the same build");
    const std::byte* at = data_;
    data_ += n * element_bytes;
    left_ -= n * element_bytes;
    return at;
  }
  std::uint64_t length() {
    std::uint64_t n = 0;
    std::memcpy(&n, take(sizeof n), sizeof n);
    return n;
  }
  bool done() const { return left_ == 0; }

 private:
  const std::byte* data_;
  std::size_t left_;
};

HERD_SEPARATE void write_length(std::vector<std::byte>& out, std::size_t n);

// object_codec<T>::supported says whether T has bytes; the others define fingerprint, write, read.
template <class T> struct object_codec {
  static constexpr bool supported = false;
};

// A pointer is trivially copyable, but means nothing on another rank.
template <class T>
  requires(std::is_trivially_copyable_v<T> && !std::is_pointer_v<T> && !std::is_member_pointer_v<T>)
struct object_codec<T> {
  static constexpr bool supported = true;
  static constexpr std::uint64_t fingerprint =
      mix(mix(mix(mix(1469598103934665603ull, 't'), sizeof(T)),
              alignof(T) | std::uint64_t{std::is_integral_v<T>} << 16 | std::uint64_t{std::is_floating_point_v<T>} << 17 |
                  std::uint64_t{std::is_signed_v<T>} << 18 | std::uint64_t{std::is_enum_v<T>} << 19),
          type_name_hash<std::remove_cv_t<T>>());
  static void write(const T& value, std::vector<std::byte>& out) {
    const auto* bytes = reinterpret_cast<const std::byte*>(&value);
    out.insert(out.end(), bytes, bytes + sizeof(T));
  }
  static void read(object_reader& in, T& value) { std::memcpy(&value, in.take(sizeof(T)), sizeof(T)); }
};

template <class Traits, class Allocator> struct object_codec<std::basic_string<char, Traits, Allocator>> {
  using string = std::basic_string<char, Traits, Allocator>;
  static constexpr bool supported = true;
  static constexpr std::uint64_t fingerprint = mix(1469598103934665603ull, 's');
  static void write(const string& value, std::vector<std::byte>& out) {
    write_length(out, value.size());
    const auto* bytes = reinterpret_cast<const std::byte*>(value.data());
    out.insert(out.end(), bytes, bytes + value.size());
  }
  static void read(object_reader& in, string& value) {
    const std::uint64_t n = in.length();
    const std::byte* at = in.take(n);
    value.assign(reinterpret_cast<const char*>(at), n);
  }
};

template <class U, class Allocator>
  requires object_codec<U>::supported
struct object_codec<std::vector<U, Allocator>> {
  using vector = std::vector<U, Allocator>;
  // Copied whole when its elements are trivially copyable (std::vector<bool> packs its bits: not).
  static constexpr bool whole = std::is_trivially_copyable_v<U> && !std::is_same_v<U, bool>;
  static constexpr bool supported = true;
  static constexpr std::uint64_t fingerprint = mix(mix(1469598103934665603ull, 'v'), object_codec<U>::fingerprint);
  static void write(const vector& value, std::vector<std::byte>& out) {
    write_length(out, value.size());
    if constexpr (whole) {
      const auto* bytes = reinterpret_cast<const std::byte*>(value.data());
      out.insert(out.end(), bytes, bytes + value.size() * sizeof(U));
    } else {
      for (const U& element : value) object_codec<U>::write(element, out);
    }
  }
  static void read(object_reader& in, vector& value) {
    const std::uint64_t n = in.length();
    if constexpr (whole) {
      const std::byte* at = in.take(n, sizeof(U));
      value.resize(n);
      if (n != 0) std::memcpy(value.data(), at, n * sizeof(U));
    } else {
      value.clear();
      for (std::uint64_t i = 0; i < n; ++i) {
        U element{};
        object_codec<U>::read(in, element);
        value.push_back(std::move(element));
      }
    }
  }
};

template <class T> inline constexpr bool serializable = object_codec<T>::supported;

// The fingerprint of T followed by the bytes of `value`.
template <class T> std::vector<std::byte> object_bytes(const T& value) {
  std::vector<std::byte> out;
  write_length(out, object_codec<T>::fingerprint);
  object_codec<T>::write(value, out);
  return out;
}

// The fingerprint at the start of an object's bytes.
inline std::uint64_t fingerprint_of(const std::byte* data, std::size_t bytes) {
  object_reader in(data, bytes);
  return in.length();
}

// `value` from bytes object_bytes<T> made (the fingerprint already checked).
template <class T> void read_object(const std::byte* data, std::size_t bytes, T& value) {
  object_reader in(data, bytes);
  in.length();
  object_codec<T>::read(in, value);
  if (!in.done()) throw error("herd: a serialized object has bytes left over; every rank must run the same build");
}

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE void write_length(std::vector<std::byte>& out, std::size_t n) {
  const auto length = static_cast<std::uint64_t>(n);
  const auto* bytes = reinterpret_cast<const std::byte*>(&length);
  out.insert(out.end(), bytes, bytes + sizeof length);
}

#endif  // HERD_SEPARATE_DEFINITIONS

}  // namespace herd::detail

#endif  // HERD_COLLECTIVES_DETAIL_SERIALIZE_HPP
