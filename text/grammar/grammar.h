#pragma once
// Grammars for constrained decoding (docs/text.md, "Constrained decoding"): a set of rules over bytes, each
// rule a deterministic automaton whose edges read a byte range or call another rule (a recursive transition
// network, what a context-free grammar becomes once every right-hand side is determinized). Rules are written as
// expressions (literals, byte and code-point ranges, sequences, alternatives, bounded or unbounded repetition,
// calls), compiled once by GrammarBuilder::build into a Grammar, which is immutable and shared by every request
// that uses it.
//
// A Grammar knows, for every state, the fewest bytes that finish its rule (min_bytes): a matcher uses it to
// keep a generation completable within its token budget.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::text::grammar {

using RuleId = int32_t;

// What one build may produce (a schema or a regex can ask for an automaton of any size).
struct BuildLimits {
  int64_t max_nfa_states = 2'000'000;  // all rules' expression automata together, before determinization
  int64_t max_states = 200'000;        // all rules' deterministic states together
};

// An immutable grammar: states numbered 0..num_states()-1 across all rules, each rule's states contiguous.
class Grammar {
 public:
  struct ByteEdge {
    uint8_t lo = 0, hi = 0;  // the bytes [lo, hi] lead to `to`
    int32_t to = 0;
  };
  struct CallEdge {
    RuleId rule = 0;  // the rule called; once it completes, matching goes on at `to`
    int32_t to = 0;
  };
  static constexpr int32_t kUnreachable = INT32_MAX;  // min_bytes of a state that cannot finish its rule

  int32_t num_states() const { return static_cast<int32_t>(final_.size()); }
  int32_t num_rules() const { return static_cast<int32_t>(rule_start_.size()); }
  RuleId root() const { return root_; }
  int32_t rule_start(RuleId r) const { return rule_start_[r]; }
  RuleId rule_of(int32_t state) const { return state_rule_[state]; }
  const std::string& rule_name(RuleId r) const { return rule_name_[r]; }
  // Byte edges sorted by `lo`, disjoint (the rule is deterministic).
  std::span<const ByteEdge> byte_edges(int32_t s) const {
    return {byte_edges_.data() + byte_begin_[s], byte_edges_.data() + byte_begin_[s + 1]};
  }
  std::span<const CallEdge> call_edges(int32_t s) const {
    return {call_edges_.data() + call_begin_[s], call_edges_.data() + call_begin_[s + 1]};
  }
  bool is_final(int32_t s) const { return final_[s] != 0; }
  // The fewest bytes from `s` to the end of its rule (calls count their rule's fewest bytes).
  int32_t min_bytes(int32_t s) const { return min_bytes_[s]; }
  // The state reached from `s` on byte `b`, or -1.
  int32_t next(int32_t s, uint8_t b) const;
  // "N rules, M states" for logs and errors.
  std::string describe() const;

 private:
  friend class GrammarBuilder;
  RuleId root_ = 0;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_name_;
  std::vector<RuleId> state_rule_;
  std::vector<uint8_t> final_;
  std::vector<int32_t> byte_begin_, call_begin_;  // CSR offsets, num_states + 1 each
  std::vector<ByteEdge> byte_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<int32_t> min_bytes_;
};

// Builds a Grammar from rule expressions. An Expr is a handle into this builder (valid for it only).
class GrammarBuilder {
 public:
  using Expr = int32_t;
  static constexpr int kUnbounded = -1;

  Expr empty();                          // matches the empty string
  Expr nothing();                        // matches no string
  Expr bytes(uint8_t lo, uint8_t hi);    // one byte in [lo, hi]
  Expr literal(std::string_view bytes);  // exactly these bytes
  // One code point in [lo, hi] (within 0..0x10FFFF, surrogates D800-DFFF never), UTF-8 encoded.
  Expr codepoints(char32_t lo, char32_t hi);
  Expr seq(std::vector<Expr> parts);
  Expr alt(std::vector<Expr> options);
  // `e` repeated min..max times (max kUnbounded: no upper limit).
  Expr repeat(Expr e, int min, int max);
  Expr optional(Expr e) { return repeat(e, 0, 1); }
  Expr star(Expr e) { return repeat(e, 0, kUnbounded); }
  Expr call(RuleId rule);

  // A rule to be defined later (rules may call each other, recursion included).
  RuleId declare(std::string name);
  void define(RuleId rule, Expr body);
  RuleId rule(std::string name, Expr body) {
    const RuleId r = declare(std::move(name));
    define(r, body);
    return r;
  }
  bool defined(RuleId rule) const { return rules_[rule].body >= 0; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }

  // Determinizes and minimizes every rule. InvalidArgument naming the rule when a rule is declared but not
  // defined or can never complete (e.g. `a ::= "x" a`), or when a rule calls itself before reading a byte
  // (left recursion); ResourceExhausted naming the limit when the automata exceed `limits`.
  Result<Grammar> build(RuleId root, const BuildLimits& limits = {}) const;

 private:
  enum class Kind : uint8_t { kEmpty, kNothing, kBytes, kSeq, kAlt, kRepeat, kCall };
  struct Node {
    Kind kind = Kind::kEmpty;
    uint8_t lo = 0, hi = 0;
    int32_t a = 0, b = 0;  // kRepeat: min, max; kCall: rule
    std::vector<Expr> children;
  };
  struct RuleDef {
    std::string name;
    Expr body = -1;
  };
  Expr add(Node n);
  std::vector<Node> nodes_;
  std::vector<RuleDef> rules_;
};

}  // namespace genbridge::text::grammar
