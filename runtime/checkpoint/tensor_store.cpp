#include "runtime/checkpoint/tensor_store.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "runtime/checkpoint/file_access.h"
#include "runtime/checkpoint/json_util.h"

namespace genbridge::model {

std::string shard_file_name(int shard, int num_shards) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", shard, num_shards);
}

const TensorStore::Entry* TensorStore::find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

Result<TensorStore> TensorStore::open_dir(const std::filesystem::path& dir, const MapOptions& options) {
  using json = nlohmann::json;
  TensorStore store;
  const std::filesystem::path index_path = dir / kIndexFileName;
  const std::filesystem::path single_path = dir / kSingleFileName;
  // Existence is decided without following symbolic links: a dangling or looping link named like a
  // checkpoint file is that file, broken (opening it says how), never a reason to look for another file.
  GB_ASSIGN_OR_RETURN(const bool has_index, detail::entry_exists(index_path));
  if (!has_index) {
    GB_ASSIGN_OR_RETURN(const bool has_single, detail::entry_exists(single_path));
    if (!has_single) {
      return invalid_argument(
          fmt::format("{}: no {} or {} in the checkpoint directory", dir.string(), kSingleFileName, kIndexFileName));
    }
    GB_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single_path, options));
    store.source_ = file.path();
    store.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
    for (const SafetensorsTensor& t : store.files_[0]->tensors()) {
      store.entries_.emplace(t.name, Entry{store.files_[0].get(), &t});
    }
    return store;
  }

  // Sharded: read and check the index first.
  const std::string ip = index_path.string();
  store.source_ = ip;
  GB_ASSIGN_OR_RETURN(const std::string text, detail::read_regular_file(index_path));
  std::string error;
  std::optional<json> index = detail::parse_json_strict(text, &error);
  if (!index) return invalid_argument(fmt::format("{}: {}", ip, error));
  const auto wm = index->is_object() ? index->find("weight_map") : index->end();
  if (!index->is_object() || wm == index->end() || !wm->is_object()) {
    return invalid_argument(
        fmt::format("{}: must be an object with a \"weight_map\" object mapping tensor names to shard files", ip));
  }
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::map<std::string, size_t> shard_slot;       // shard file name -> index into files_
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string()) {
      return invalid_argument(
          fmt::format("{}: weight_map['{}'] = {}: must be a shard file name", ip, name, detail::json_excerpt(shard)));
    }
    const std::string s = shard.get<std::string>();
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\\') != std::string::npos) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' maps to '{}': shard names must be plain file names in the checkpoint directory",
                      ip, name, s));
    }
    if (s.find('\0') != std::string::npos) {
      // "\u0000" in JSON: the name would be cut at the NUL when opened and could name another file.
      return invalid_argument(fmt::format("{}: tensor '{}' maps to {}: a shard name cannot contain a NUL character", ip,
                                          name, detail::json_excerpt(shard)));
    }
    weight_map.emplace(name, s);
    shard_slot.emplace(s, 0);
  }
  if (weight_map.empty()) return invalid_argument(fmt::format("{}: weight_map lists no tensors", ip));
  for (auto& [shard, slot] : shard_slot) {
    const std::filesystem::path sp = dir / shard;
    GB_ASSIGN_OR_RETURN(const bool shard_exists, detail::entry_exists(sp));
    if (!shard_exists) {
      // Name one tensor that needs the missing shard, so the message points at the index entry.
      std::string tensor;
      for (const auto& [n, s] : weight_map) {
        if (s == shard) {
          tensor = n;
          break;
        }
      }
      return invalid_argument(fmt::format("{}: tensor '{}' maps to shard '{}', which does not exist in {}", ip, tensor,
                                          shard, dir.string()));
    }
    GB_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(sp, options));
    slot = store.files_.size();
    store.files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
  }
  for (const auto& [shard, slot] : shard_slot) {
    const SafetensorsFile* file = store.files_[slot].get();
    for (const SafetensorsTensor& t : file->tensors()) {
      auto [it, inserted] = store.entries_.emplace(t.name, Entry{file, &t});
      if (!inserted) {
        return invalid_argument(fmt::format("{}: tensor '{}' is also in {} (a tensor must be in exactly one shard)",
                                            file->path(), t.name, it->second.file->path()));
      }
      auto listed = weight_map.find(t.name);
      if (listed == weight_map.end()) {
        return invalid_argument(
            fmt::format("{}: tensor '{}' of shard '{}' is not listed in weight_map", ip, t.name, shard));
      }
      if (listed->second != shard) {
        return invalid_argument(fmt::format("{}: tensor '{}' is in shard '{}' but weight_map names '{}'", ip, t.name,
                                            shard, listed->second));
      }
    }
  }
  for (const auto& [name, shard] : weight_map) {
    if (!store.entries_.count(name)) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' maps to shard '{}', which does not contain it", ip, name, shard));
    }
  }
  return store;
}

}  // namespace genbridge::model
