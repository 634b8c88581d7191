#pragma once
// TensorStore: every tensor of a checkpoint directory by name, from one model.safetensors or from the
// shards (model-0000x-of-0000y.safetensors) listed by model.safetensors.index.json. Files stay mapped for
// the store's lifetime; lookups never copy.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/safetensors.h"

namespace genbridge::model {

inline constexpr std::string_view kSingleFileName = "model.safetensors";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

// "model-00002-of-00003.safetensors" for shard 2 of 3 (1-based, the Hugging Face naming).
std::string shard_file_name(int shard, int num_shards);

class TensorStore {
 public:
  // Where one tensor lives.
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const SafetensorsTensor* tensor = nullptr;
  };

  // Opens `dir`: the index and its shards when model.safetensors.index.json exists, else model.safetensors.
  // Validates every file (SafetensorsFile::open) and the index: shard names are plain file names that exist,
  // every weight_map entry is in the shard it names, no tensor is in two shards and every tensor of a shard
  // is listed. InvalidArgument names the file, the tensor and the rule. Blocking file I/O.
  static Result<TensorStore> open_dir(const std::filesystem::path& dir, const MapOptions& options = {});

  // The file that names the checkpoint's tensor set (the index, or the single file): used in messages.
  const std::string& source() const { return source_; }
  // The entry for `name`, or nullptr.
  const Entry* find(std::string_view name) const;
  // Every tensor name, sorted.
  std::vector<std::string> names() const;
  size_t num_tensors() const { return entries_.size(); }
  // The opened files (one, or every shard in name order).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace genbridge::model
