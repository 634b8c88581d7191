#pragma once
// The BPE model of tokenizer.json: a vocabulary and ranked merges applied to one pre-token ("word") at a
// time. Merging keeps the word as a linked list of symbols and a min-heap of candidate merges ordered by
// (rank, position), so a word of n symbols costs O(n log n) rather than the O(n^2) of rescanning for the
// best pair after each merge. Results are cached per word; the cache is sharded and bounded.

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::text {

class BpeModel {
 public:
  struct Options {
    std::optional<std::string> unk_token;
    bool fuse_unk = false;
    bool ignore_merges = false;
    size_t cache_words = 1 << 16;  // words cached in total (0 disables the cache)
  };
  // `vocab` maps token -> id; `merges` are (left, right) pairs in rank order. `where` prefixes errors
  // (e.g. "tokenizer.json: $.model"): a merge naming a token outside the vocabulary is InvalidArgument.
  static Result<std::unique_ptr<BpeModel>> create(std::unordered_map<std::string, int32_t> vocab,
                                                  const std::vector<std::pair<std::string, std::string>>& merges,
                                                  Options options, std::string_view where);

  // Appends the ids of `word` (UTF-8 in the model's alphabet) to `out`. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  size_t num_merges() const { return merges_.size(); }
  void clear_cache() const;

 private:
  BpeModel() = default;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  struct PairHash {
    size_t operator()(uint64_t k) const { return static_cast<size_t>(k * 0x9E3779B97F4A7C15ull >> 16); }
  };
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge, PairHash> merges_;  // (left id << 32 | right id) -> merge
  std::optional<int32_t> unk_id_;
  Options options_;

  static constexpr size_t kShards = 16;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<Shard, kShards> cache_;
};

}  // namespace genbridge::text
