#include "text/bpe.h"

#include <functional>
#include <queue>

#include "text/utf8.h"

namespace genbridge::text {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Words longer than this are merged every time rather than cached (as Hugging Face does): they are rare
// and would crowd out the short words that repeat.
constexpr size_t kMaxCachedWordBytes = 256;

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::create(std::unordered_map<std::string, int32_t> vocab,
                                                   const std::vector<std::pair<std::string, std::string>>& merges,
                                                   Options options, std::string_view where) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->vocab_ = std::move(vocab);
  m->options_ = std::move(options);
  if (m->options_.unk_token) {
    const auto it = m->vocab_.find(*m->options_.unk_token);
    if (it == m->vocab_.end()) {
      return invalid_argument(std::string(where) + ".unk_token: '" + *m->options_.unk_token +
                              "' is not in the vocabulary");
    }
    m->unk_id_ = it->second;
  }
  m->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), iab = m->vocab_.find(a + b);
    const std::string* missing = ia == m->vocab_.end() ? &a : ib == m->vocab_.end() ? &b : nullptr;
    std::string merged;
    if (!missing && iab == m->vocab_.end()) missing = &(merged = a + b);
    if (missing) {
      return invalid_argument(std::string(where) + ".merges[" + std::to_string(rank) + "]: merge '" + a + " " + b +
                              "' needs token '" + *missing + "', which is not in the vocabulary");
    }
    // A repeated merge keeps its first (best) rank.
    m->merges_.try_emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), iab->second});
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::clear_cache() const {
  for (Shard& s : cache_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.words.clear();
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = options_.cache_words > 0 && word.size() <= kMaxCachedWordBytes;
  if (!cacheable) return merge_word(word, out);
  const size_t h = std::hash<std::string_view>{}(word);
  Shard& shard = cache_[h % kShards];
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (const auto it = shard.words.find(key); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  // Bounded: a full shard starts over rather than tracking recency (cheap, and repeated words return).
  if (shard.words.size() >= options_.cache_words / kShards) shard.words.clear();
  shard.words.emplace(std::move(key), std::vector<int32_t>(out.begin() + first, out.end()));
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  std::string ch;
  bool last_was_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    next_code_point(word, pos);
    ch.assign(word.substr(start, pos - start));
    const auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      sym.push_back({it->second, 0, 0, true});
      last_was_unk = false;
    } else if (unk_id_) {
      if (!(options_.fuse_unk && last_was_unk)) sym.push_back({*unk_id_, 0, 0, true});
      last_was_unk = true;
    }
    // Without an unknown token a character outside the vocabulary is dropped (Hugging Face does the same).
  }
  const int32_t n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t left) {
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end()) heap.push({it->second.rank, left, it->second.new_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale when either side changed since the candidate was pushed.
    const auto it = merges_.find(pair_key(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.new_id != c.new_id) continue;
    Symbol& right = sym[left.next];
    left.id = c.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

}  // namespace genbridge::text
