#ifndef HERD_CHECKPOINT_DETAIL_MATCH_HPP
#define HERD_CHECKPOINT_DETAIL_MATCH_HPP
// Pairing a file's tensors with a checkpoint's registered entries by name, and saying every way
// the two differ before anything is written.

#include <herd/checkpoint/detail/entry.hpp>
#include <herd/checkpoint/detail/file.hpp>
#include <herd/checkpoint/detail/safetensors.hpp>
#include <herd/core/config.hpp>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace herd::detail::ckpt {

// Pairs of (a tensor of `file`, the entry it fills). Raises naming every difference (up to eight)
// when the two sets of entries are not the same, or (strict off) an entry of both differs;
// records the keys either side lacks.
// `registered`: the entries as a file would describe them; `index`: entry by name.
HERD_SEPARATE std::vector<std::pair<std::size_t, std::size_t>> match(
    const std::filesystem::path& path, const std::vector<st::tensor_info>& file,
    const std::vector<st::tensor_info>& registered, const std::vector<entry>& entries,
    std::map<std::string, std::size_t, std::less<>> index, bool strict, std::vector<std::string>& missing,
    std::vector<std::string>& unexpected, const std::string& subject);

#if defined(HERD_SEPARATE_DEFINITIONS)  // inline, or only in the implementation file (core/config.hpp)

HERD_SEPARATE std::vector<std::pair<std::size_t, std::size_t>> match(
    const std::filesystem::path& path, const std::vector<st::tensor_info>& file,
    const std::vector<st::tensor_info>& registered, const std::vector<entry>& entries,
    std::map<std::string, std::size_t, std::less<>> index, bool strict, std::vector<std::string>& missing,
    std::vector<std::string>& unexpected, const std::string& subject) {
  const auto describe = [](const st::tensor_info& t, bool value) {  // "F32 tensor of 10 elements", "value of 8 bytes"
    const std::string count = std::to_string(st::elements(t.shape).value_or(0));
    return value ? "value of " + count + " bytes" : t.dtype + " tensor of " + count + " elements";
  };
  // `index` keeps the entries not yet found in the file.
  std::vector<std::string> differences;
  std::vector<std::pair<std::size_t, std::size_t>> order;
  bool unsupported = false;
  missing.clear();
  unexpected.clear();
  for (std::size_t f = 0; f < file.size(); ++f) {
    const st::tensor_info& t = file[f];
    const auto it = index.find(t.name);
    if (it == index.end()) {
      if (strict) differences.push_back(st::json_string(t.name) + " is in the file but not registered");
      else unexpected.push_back(t.name);
      continue;
    }
    const st::tensor_info& mine = registered[it->second];
    if (!st::is_herd_dtype(t.dtype)) {
      differences.push_back("unsupported dtype " + t.dtype + " in tensor " + st::json_string(t.name));
      unsupported = true;
    } else if (mine.dtype != t.dtype || st::elements(mine.shape) != st::elements(t.shape)) {
      differences.push_back(st::json_string(t.name) + " differs: " + describe(t, false) + " in the file, " +
                            describe(mine, entries[it->second].value) + " here");
    }
    order.emplace_back(f, it->second);
    index.erase(it);
  }
  for (const auto& [name, i] : index) {
    if (strict) differences.push_back(st::json_string(name) + " is registered but not in the file");
    else missing.push_back(name);
  }
  if (differences.empty()) return order;
  missing.clear();
  unexpected.clear();
  std::string what = path.string() + " does not match " + subject + ": ";
  for (std::size_t i = 0; i < differences.size() && i < 8; ++i) what += (i ? "; " : "") + differences[i];
  if (differences.size() > 8) what += "; and " + std::to_string(differences.size() - 8) + " more";
  std::string todo = "Register the same entries, with the same dtypes and sizes, as the program that saved it, or "
                     "load a checkpoint saved with these entries";
  if (unsupported) {
    todo = "herd's dtypes are F16, BF16, F32, F64, I8, U8, I32 and I64: convert such a tensor to one of them before "
           "saving, or leave it unregistered and load with set_strict(false) to skip it";
  }
  throw failure{what, todo};
}

#endif

}  // namespace herd::detail::ckpt

#endif  // HERD_CHECKPOINT_DETAIL_MATCH_HPP
