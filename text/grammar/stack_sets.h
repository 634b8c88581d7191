#pragma once
// The matching state of a Grammar (text/grammar/grammar.h): sets of parse stacks, built on demand and
// interned, so that a byte moves from one set to the next by one table lookup once seen (a lazily built
// deterministic automaton over stack sets). Used by CompiledGrammar's per-state token walks and by each
// request's Matcher; one object serves one thread.
//
// A stack is a chain of frames, interned: stack 0 is the empty stack; stack k is (parent, state), where
// `state` is where matching stands in the innermost rule and each parent frame's state is where its rule
// goes on once the rule above it completes. A set holds stacks that can read a byte now (their state has
// byte edges), plus a flag saying whether some stack completed all the way down (popped the bottom frame):
// for a request's matcher that is "the output is complete"; for a walk that starts at one state it is "the
// rule of that state was left", after which what may follow depends on the stack below it.

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/grammar/grammar.h"

namespace genbridge::text::grammar {

class StackSets {
 public:
  static constexpr int32_t kEmptyStack = 0;
  static constexpr int32_t kDeadSet = 0;      // no stack, not complete
  static constexpr int32_t kMaxDepth = 4096;  // frames; deeper stacks are dropped (no JSON nests that deep)
  static constexpr int64_t kInfinite = INT64_MAX / 4;

  // `cost`: per state, what finishing its rule from there costs (Grammar::min_bytes when null; a
  // CompiledGrammar's token costs); Grammar::kUnreachable for never.
  explicit StackSets(const Grammar& g, const std::vector<int32_t>* cost = nullptr);

  // Interns the stack `parent` + `state`.
  int32_t push(int32_t parent, int32_t state);
  int32_t parent(int32_t stack) const { return parent_[stack]; }
  int32_t state(int32_t stack) const { return state_[stack]; }
  int32_t depth(int32_t stack) const { return depth_[stack]; }
  // What completing every frame of `stack` costs (the states' costs summed).
  int64_t cost(int32_t stack) const { return cost_[stack]; }

  // The set of `stacks` as they are (each must be able to read a byte now), not complete.
  int32_t raw_set(std::span<const int32_t> stacks);
  // The set reached from `stacks` by following calls and returns until each can read a byte (the closure).
  int32_t closure_set(std::span<const int32_t> stacks);
  // The set after reading byte `b` in `set` (closure included); kDeadSet when no stack can read it. One table
  // lookup once computed.
  int32_t next(int32_t set, uint8_t b) {
    const int32_t r = next_[static_cast<size_t>(set) * 256 + b];
    return r >= 0 ? r : compute_next(set, b);
  }
  // The set after reading `bytes`; kDeadSet as soon as one cannot be read.
  int32_t next(int32_t set, std::string_view bytes);

  std::span<const int32_t> stacks(int32_t set) const {
    return {set_stacks_.data() + set_begin_[set], set_stacks_.data() + set_begin_[set + 1]};
  }
  bool complete(int32_t set) const { return set_complete_[set] != 0; }
  bool dead(int32_t set) const { return set == kDeadSet; }
  // What completion from `set` costs: 0 when complete, else the least over its stacks.
  int64_t cost_set(int32_t set) const { return set_cost_[set]; }
  int64_t num_sets() const { return static_cast<int64_t>(set_complete_.size()); }
  int64_t num_stacks() const { return static_cast<int64_t>(state_.size()); }
  // The stacks of `set` in `from`, re-interned here; returns the set's id here.
  int32_t import_set(const StackSets& from, int32_t set);

 private:
  int32_t compute_next(int32_t set, uint8_t b);
  int32_t intern_set(std::vector<int32_t>& stacks, bool complete);
  void closure_into(int32_t stack, std::vector<int32_t>* out, bool* complete, std::vector<int32_t>* seen);

  const Grammar& g_;
  const std::vector<int32_t>* state_cost_;
  std::vector<int32_t> parent_, state_, depth_;
  std::vector<int64_t> cost_;
  std::unordered_map<uint64_t, int32_t> stack_ids_;
  std::vector<int32_t> set_begin_{0}, set_stacks_;
  std::vector<uint8_t> set_complete_;
  std::vector<int64_t> set_cost_;
  std::unordered_map<std::string, int32_t> set_ids_;
  std::vector<int32_t> next_;  // num_sets x 256, -1: not computed yet
  std::vector<int32_t> scratch_raw_, scratch_out_, scratch_seen_;
};

}  // namespace genbridge::text::grammar
