#ifndef HERD_CHECKPOINT_DETAIL_SAFETENSORS_HPP
#define HERD_CHECKPOINT_DETAIL_SAFETENSORS_HPP
// The safetensors file format (huggingface/safetensors), which herd::checkpoint writes and reads:
//   u64 N (little-endian) | N bytes of a JSON object, padded with spaces | the data section
// Each member of the object but "__metadata__" (an object of strings) describes a tensor,
//   "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// whose bytes (little-endian, row-major) are [begin, end) of the data section. The tensors tile
// the data section from its first byte to its last, as the reference reader demands.

#include <herd/core/config.hpp>
#include <herd/core/dtype.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace herd::detail::safetensors {

static_assert(std::endian::native == std::endian::little,
              "herd: checkpoints are safetensors files, whose data is little-endian, and herd writes memory as it is");

struct tensor_info {
  std::string name;
  std::string dtype;  // as the file spells it: "F32", "BF16", ...
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // [begin, end): its bytes in the data section
  std::uint64_t end = 0;
};

struct header {
  std::map<std::string, std::string, std::less<>> metadata;
  std::vector<tensor_info> tensors;  // by offset
  std::uint64_t data_bytes = 0;      // where the last tensor ends
};

// What is wrong with a header; the caller names the file.
struct malformed {
  std::string what;
};

constexpr std::string_view dtype_name(dtype t) noexcept {
  constexpr std::string_view names[] = {"F16", "BF16", "F32", "F64", "I8", "U8", "I32", "I64"};  // herd::dtype's order
  return names[static_cast<std::size_t>(t)];
}

// Whether `name` is the safetensors name of one of herd's dtypes.
HERD_SEPARATE bool is_herd_dtype(std::string_view name) noexcept;

// Bits per element of a safetensors dtype, herd's or not (4 and 6 for the sub-byte floats); 0 for
// a name the format does not know.
HERD_SEPARATE std::uint64_t element_bits(std::string_view name);

// The product of `shape`; nullopt if it overflows.
HERD_SEPARATE std::optional<std::uint64_t> elements(const std::vector<std::uint64_t>& shape);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
HERD_SEPARATE bool is_utf8(std::string_view text);

// `text` as a JSON string: quotes, backslashes and control bytes escaped (also how names appear in
// messages, since a damaged file can hold any bytes where a name should be).
HERD_SEPARATE std::string json_string(std::string_view text);

// The header of a file of `tensors` (offsets set, in data order), padded with spaces to a multiple
// of 8 bytes so that the data section starts aligned.
HERD_SEPARATE std::string format_header(const std::vector<std::pair<std::string, std::string>>& metadata,
                                        const std::vector<tensor_info>& tensors);

// Parses and checks a header: well-formed JSON, each name once, known dtypes, data offsets that
// fit each tensor's shape and dtype and tile the data section from its start.
HERD_SEPARATE header parse_header(std::string_view text);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE bool is_herd_dtype(std::string_view name) noexcept {
  for (int i = 0; is_valid(static_cast<dtype>(i)); ++i) {
    if (dtype_name(static_cast<dtype>(i)) == name) return true;
  }
  return false;
}

HERD_SEPARATE std::uint64_t element_bits(std::string_view name) {
  constexpr std::pair<std::string_view, std::uint64_t> sizes[] = {
      {"BOOL", 8},         {"U8", 8},          {"I8", 8},       {"F8_E5M2", 8},  {"F8_E4M3", 8},  {"F8_E8M0", 8},
      {"F8_E4M3FNUZ", 8},  {"F8_E5M2FNUZ", 8}, {"F4", 4},       {"F6_E2M3", 6},  {"F6_E3M2", 6},  {"U16", 16},
      {"I16", 16},         {"F16", 16},        {"BF16", 16},    {"U32", 32},     {"I32", 32},     {"F32", 32},
      {"U64", 64},         {"I64", 64},        {"F64", 64},     {"C64", 64}};
  const auto* it = std::find_if(std::begin(sizes), std::end(sizes), [&](const auto& s) { return s.first == name; });
  return it == std::end(sizes) ? 0 : it->second;
}

HERD_SEPARATE std::optional<std::uint64_t> elements(const std::vector<std::uint64_t>& shape) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

HERD_SEPARATE bool is_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0;
    if (n == 0 || n > text.size() - i) return false;
    const auto second = static_cast<unsigned char>(n > 1 ? text[i + 1] : 0x80);
    if ((c == 0xe0 && second < 0xa0) || (c == 0xed && second > 0x9f) || (c == 0xf0 && second < 0x90) ||
        (c == 0xf4 && second > 0x8f)) {
      return false;
    }
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    i += n;
  }
  return true;
}

HERD_SEPARATE std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    char escaped[7] = {'\\', c, '\0'};
    const bool control = static_cast<unsigned char>(c) < 0x20;
    if (control) std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
    out += control || c == '"' || c == '\\' ? escaped : std::string(1, c);
  }
  return out + "\"";
}

HERD_SEPARATE std::string format_header(const std::vector<std::pair<std::string, std::string>>& metadata,
                                        const std::vector<tensor_info>& tensors) {
  std::string out = "{\"__metadata__\":{";
  for (const auto& [key, value] : metadata) {
    out += (out.back() == '{' ? "" : ",") + json_string(key) + ":" + json_string(value);
  }
  out += "}";
  for (const tensor_info& t : tensors) {
    out += "," + json_string(t.name) + ":{\"dtype\":" + json_string(t.dtype) + ",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) out += (i ? "," : "") + std::to_string(t.shape[i]);
    out += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  out += "}";
  out.resize((out.size() + 7) / 8 * 8, ' ');
  return out;
}

// A reader of the JSON that safetensors headers hold: objects, arrays, strings and non-negative
// integers. true, false, null and other numbers have no place in the format and are refused.
class json_reader {
 public:
  explicit json_reader(std::string_view text) : text_(text) {}

  // Calls member(key) for each member of an object, element() for each element of an array;
  // they read the value.
  template <class F> void object(F&& member) {
    sequence('{', '}', [&] {
      std::string key = string();
      expect(':');
      member(std::move(key));
    });
  }
  template <class F> void array(F&& element) { sequence('[', ']', element); }

  std::string string() {
    expect('"');
    std::string out;
    constexpr std::string_view escapes = "\"\"\\\\//b\bf\fn\nr\rt\t";  // pairs: escape, character
    while (at_ < text_.size() && text_[at_] != '"') {
      const char c = text_[at_++];
      const std::size_t k = c == '\\' && at_ < text_.size() ? escapes.find(text_[at_++]) : std::string_view::npos;
      if (static_cast<unsigned char>(c) < 0x20) fail("a string holds a control character");
      if (c != '\\') out += c;
      else if (text_[at_ - 1] == 'u') out += code_point();
      else if (k % 2 == 0) out += escapes[k + 1];
      else fail("a string holds an invalid escape");
    }
    if (!next_is('"')) fail("a string is not closed");
    return out;
  }

  std::uint64_t integer() {
    skip_space();
    std::uint64_t value = 0;
    const char *first = text_.data() + at_, *end = text_.data() + text_.size();
    const auto [last, error] = std::from_chars(first, end, value);
    if (error == std::errc::result_out_of_range) fail("an integer is too large");
    if (error != std::errc() || (*first == '0' && last - first > 1) ||
        (last != end && (*last == '.' || (*last | 0x20) == 'e'))) {
      fail("expected a non-negative integer (without leading zeros)");
    }
    at_ += static_cast<std::size_t>(last - first);
    return value;
  }

  // Only white space may follow.
  void end() {
    skip_space();
    if (at_ != text_.size()) fail("unexpected text after the object");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw malformed{"its header is not valid JSON: " + what + " (at byte " + std::to_string(at_) + " of the header)"};
  }

  template <class F> void sequence(char open, char close, F&& each) {
    expect(open);
    if (next_is(close)) return;
    do each();
    while (next_is(','));
    expect(close);
  }

  void skip_space() {
    while (at_ < text_.size() && std::string_view(" \t\n\r").find(text_[at_]) != std::string_view::npos) ++at_;
  }

  bool next_is(char c) {
    skip_space();
    return at_ < text_.size() && text_[at_] == c && ++at_;
  }

  void expect(char c) {
    if (!next_is(c)) fail(std::string("expected '") + c + "'");
  }

  // After "\u": one code point (two escapes for one past U+FFFF), in UTF-8.
  std::string code_point() {
    const auto unit = [&] {
      std::uint32_t value = 0;
      const char* first = text_.data() + std::min(at_, text_.size());
      const char* last = text_.data() + std::min(at_ + 4, text_.size());
      if (std::from_chars(first, last, value, 16).ptr != first + 4) fail("a \\u escape needs four hex digits");
      at_ += 4;
      return value;
    };
    std::uint32_t code = unit();
    if (code >= 0xd800 && code <= 0xdbff && text_.substr(at_, 2) == "\\u") {
      at_ += 2;
      const std::uint32_t low = unit();
      if (low >= 0xdc00 && low <= 0xdfff) code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
    }
    if (code >= 0xd800 && code <= 0xdfff) fail("a \\u escape is a lone surrogate");
    const int n = code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
    constexpr std::uint32_t lead[] = {0, 0, 0xc0, 0xe0, 0xf0};
    std::string out(1, static_cast<char>(lead[n] | (code >> (6 * (n - 1)))));
    for (int i = n - 2; i >= 0; --i) out += static_cast<char>(0x80 | ((code >> (6 * i)) & 0x3f));
    return out;
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

HERD_SEPARATE header parse_header(std::string_view text) {
  if (!is_utf8(text)) throw malformed{"its header is not valid UTF-8"};
  header h;
  json_reader json(text);
  std::set<std::string, std::less<>> names;
  json.object([&](std::string name) {
    if (!names.insert(name).second) throw malformed{"its header names " + json_string(name) + " twice"};
    if (name == "__metadata__") {
      return json.object([&](std::string key) {
        if (!h.metadata.emplace(key, json.string()).second) throw malformed{"its metadata repeats " + json_string(key)};
      });
    }
    const std::string which = "the tensor " + json_string(name);
    tensor_info& t = h.tensors.emplace_back(tensor_info{std::move(name), {}, {}, 0, 0});
    std::vector<std::uint64_t> offsets;
    std::set<std::string, std::less<>> fields;
    json.object([&](std::string field) {
      if (field == "dtype") t.dtype = json.string();
      else if (field == "shape") json.array([&] { t.shape.push_back(json.integer()); });
      else if (field == "data_offsets") json.array([&] { offsets.push_back(json.integer()); });
      else throw malformed{which + " has the unknown field " + json_string(field)};
      if (!fields.insert(field).second) throw malformed{which + " repeats the field " + json_string(field)};
    });
    if (fields.size() != 3 || offsets.size() != 2) {
      throw malformed{which + " needs \"dtype\", \"shape\" and \"data_offsets\" (two numbers)"};
    }
    t.begin = offsets[0];
    t.end = offsets[1];
    const std::uint64_t bits = element_bits(t.dtype);
    const auto count = elements(t.shape);
    if (bits == 0) throw malformed{which + " has the dtype " + json_string(t.dtype) + ", unknown to herd"};
    // Sub-byte dtypes pack their elements: the bytes are count * bits / 8, a whole number of them.
    if (!count || *count > std::numeric_limits<std::uint64_t>::max() / bits || (*count * bits) % 8 != 0 ||
        t.end < t.begin || t.end - t.begin != *count * bits / 8) {
      throw malformed{which + " has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "], which do not hold " + (count ? std::to_string(*count) : "too many") + " elements of " +
                      t.dtype};
    }
  });
  json.end();
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  for (const tensor_info& t : h.tensors) {
    if (t.begin != h.data_bytes) {
      throw malformed{"the tensor " + json_string(t.name) + " starts at byte " + std::to_string(t.begin) +
                      " of the data section, but the tensors before it end at byte " + std::to_string(h.data_bytes) +
                      (t.begin < h.data_bytes ? " (they overlap)" : " (a gap)")};
    }
    h.data_bytes = t.end;
  }
  return h;
}

#endif

}  // namespace herd::detail::safetensors

#endif  // HERD_CHECKPOINT_DETAIL_SAFETENSORS_HPP
