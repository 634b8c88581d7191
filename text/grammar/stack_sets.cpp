#include "text/grammar/stack_sets.h"

#include <algorithm>
#include <cstring>

namespace genbridge::text::grammar {

StackSets::StackSets(const Grammar& g, const std::vector<int32_t>* cost) : g_(g), state_cost_(cost) {
  parent_.push_back(-1);
  state_.push_back(-1);
  depth_.push_back(0);
  cost_.push_back(0);
  std::vector<int32_t> none;
  intern_set(none, false);  // kDeadSet
}

int32_t StackSets::push(int32_t parent, int32_t state) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(state);
  auto [it, fresh] = stack_ids_.emplace(key, static_cast<int32_t>(state_.size()));
  if (fresh) {
    parent_.push_back(parent);
    state_.push_back(state);
    depth_.push_back(depth_[parent] + 1);
    const int32_t c = state_cost_ ? (*state_cost_)[state] : g_.min_bytes(state);
    cost_.push_back(c == Grammar::kUnreachable ? kInfinite : std::min(kInfinite, cost_[parent] + c));
  }
  return it->second;
}

int32_t StackSets::intern_set(std::vector<int32_t>& stacks, bool complete) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  std::string key(stacks.size() * sizeof(int32_t) + 1, '\0');
  if (!stacks.empty()) std::memcpy(key.data(), stacks.data(), stacks.size() * sizeof(int32_t));
  key.back() = complete ? 1 : 0;
  auto [it, fresh] = set_ids_.emplace(std::move(key), static_cast<int32_t>(set_complete_.size()));
  if (fresh) {
    set_stacks_.insert(set_stacks_.end(), stacks.begin(), stacks.end());
    set_begin_.push_back(static_cast<int32_t>(set_stacks_.size()));
    set_complete_.push_back(complete ? 1 : 0);
    int64_t best = complete ? 0 : kInfinite;
    for (int32_t s : stacks) best = std::min(best, cost_[s]);
    set_cost_.push_back(best);
    next_.resize(next_.size() + 256, -1);
  }
  return it->second;
}

int32_t StackSets::raw_set(std::span<const int32_t> stacks) {
  std::vector<int32_t> v(stacks.begin(), stacks.end());
  return intern_set(v, false);
}

void StackSets::closure_into(int32_t stack, std::vector<int32_t>* out, bool* complete, std::vector<int32_t>* seen) {
  // Depth-first over calls (push) and completions (pop); `seen` keeps a stack from being expanded twice.
  std::vector<int32_t> todo{stack};
  while (!todo.empty()) {
    const int32_t x = todo.back();
    todo.pop_back();
    if (std::find(seen->begin(), seen->end(), x) != seen->end()) continue;
    seen->push_back(x);
    const int32_t s = state_[x];
    if (!g_.byte_edges(s).empty()) out->push_back(x);
    for (const Grammar::CallEdge& c : g_.call_edges(s)) {
      if (depth_[x] + 1 > kMaxDepth) continue;
      todo.push_back(push(push(parent_[x], c.to), g_.rule_start(c.rule)));
    }
    if (g_.is_final(s)) {
      if (parent_[x] == kEmptyStack) {
        *complete = true;
      } else {
        todo.push_back(parent_[x]);
      }
    }
  }
}

int32_t StackSets::closure_set(std::span<const int32_t> stacks) {
  std::vector<int32_t> out, seen;
  bool complete = false;
  for (int32_t s : stacks) closure_into(s, &out, &complete, &seen);
  if (out.empty() && !complete) return kDeadSet;
  return intern_set(out, complete);
}

int32_t StackSets::compute_next(int32_t set, uint8_t b) {
  const size_t slot = static_cast<size_t>(set) * 256 + b;
  scratch_out_.clear();
  scratch_seen_.clear();
  bool complete = false;
  for (int32_t st : stacks(set)) {
    const int32_t to = g_.next(state_[st], b);
    if (to >= 0) closure_into(push(parent_[st], to), &scratch_out_, &complete, &scratch_seen_);
  }
  const int32_t r = scratch_out_.empty() && !complete ? kDeadSet : intern_set(scratch_out_, complete);
  next_[slot] = r;  // next_ may have grown: index again
  return r;
}

int32_t StackSets::next(int32_t set, std::string_view bytes) {
  for (unsigned char c : bytes) {
    set = next(set, c);
    if (set == kDeadSet) return kDeadSet;
  }
  return set;
}

int32_t StackSets::import_set(const StackSets& from, int32_t set) {
  std::vector<int32_t> mine;
  for (int32_t st : from.stacks(set)) {
    std::vector<int32_t> frames;
    for (int32_t x = st; x != kEmptyStack; x = from.parent_[x]) frames.push_back(from.state_[x]);
    int32_t y = kEmptyStack;
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) y = push(y, *it);
    mine.push_back(y);
  }
  if (mine.empty() && !from.complete(set)) return kDeadSet;
  return intern_set(mine, from.complete(set));
}

}  // namespace genbridge::text::grammar
