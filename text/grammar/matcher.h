#pragma once
// Token masks from a grammar (docs/text.md, "Constrained decoding"): which tokens of the vocabulary may come
// next so that the output stays a prefix of the grammar's language, and can still be completed within the
// tokens left.
//
//   Vocabulary       the tokenizer's tokens as byte strings in a trie (one per model, shared);
//   CompiledGrammar  a Grammar plus, for every grammar state that reads bytes, the tokens it accepts whatever
//                    the stack below it (computed once, by one walk of the trie per state), and the few
//                    tokens that leave the state's rule and so depend on that stack (immutable, shared by the
//                    requests that use the same grammar);
//   Matcher          one request's position: fill_mask() before each token, accept() after it.
//
// A mask is a bitset of (size + 31) / 32 words, bit i of word i / 32 standing for token i.
//
// The budget: fill_mask() is told how many tokens may still be generated and allows only tokens after which
// the output can still be completed, stop token included, in the tokens left. What completing costs is
// counted in tokens of this vocabulary: per grammar state, the cheapest way to the end of its rule by tokens
// that stay in it (a stack costs the sum of its frames). Since every step along that way lowers the cost by one,
// an output always completes within the budget it started with, if that budget was at least min_tokens() + 1.
// (With every byte a token, as in byte-level BPE vocabularies, no cost exceeds Grammar::min_bytes.)

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "text/grammar/grammar.h"
#include "text/tokenizer.h"

namespace genbridge::text::grammar {

class StackSets;

class Vocabulary {
 public:
  // The tokens of `tokenizer` below `size` (the model's vocabulary rows, the mask's length). Special added
  // tokens and ids without bytes are never allowed by a grammar (stop tokens are allowed apart, at the end).
  static std::shared_ptr<const Vocabulary> build(const Tokenizer& tokenizer, int64_t size);
  // Token i has bytes `tokens[i]` (empty: never allowed); `size` >= tokens.size().
  static std::shared_ptr<const Vocabulary> from_bytes(std::vector<std::string> tokens, int64_t size);

  int64_t size() const { return size_; }
  int64_t num_words() const { return (size_ + 31) / 32; }
  const std::string& bytes(int32_t id) const;
  // Every byte value is the whole of some token (what the budget guarantee needs).
  bool every_byte_is_a_token() const { return every_byte_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_trie_nodes() const { return static_cast<int64_t>(node_byte_.size()); }

  // The trie in depth-first preorder: node 0 is the root; node i reads node_byte(i) after its parent and its
  // subtree is [i, subtree_end(i)). Tokens sorted by bytes: those ending at node i are
  // sorted_token(k) for k in [token_begin(i), token_begin(i + 1)), those of its subtree end at
  // token_begin(subtree_end(i)).
  uint8_t node_byte(int32_t i) const { return node_byte_[i]; }
  int32_t subtree_end(int32_t i) const { return node_end_[i]; }
  int32_t token_begin(int32_t i) const { return node_tok_[i]; }
  int32_t sorted_token(int32_t k) const { return tokens_[k]; }

 private:
  int64_t size_ = 0;
  bool every_byte_ = false;
  std::vector<std::string> bytes_;  // by id
  std::vector<uint8_t> node_byte_;
  std::vector<int32_t> node_end_, node_tok_;
  std::vector<int32_t> tokens_;  // ids sorted by their bytes
};

// Bounds of one compilation (the server's request deadline; its client going away).
struct CompileOptions {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;  // may be empty
};

class CompiledGrammar {
 public:
  // DeadlineExceeded / Unavailable when `options` stop it; the trie walks are the cost (see docs/bench/serve.md).
  static Result<std::shared_ptr<const CompiledGrammar>> compile(Grammar grammar,
                                                                std::shared_ptr<const Vocabulary> vocabulary,
                                                                const CompileOptions& options = {});
  ~CompiledGrammar();

  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocab_; }
  // Tokens of the cheapest complete output (the stop token not counted); Grammar::kUnreachable when no token
  // path completes it.
  int64_t min_tokens() const;

  struct Stats {
    int32_t nodes = 0;             // grammar states with a token walk
    int32_t bitmask_groups = 0;    // groups of accepted tokens kept as a bitmask (many tokens)
    int64_t accepted_entries = 0;  // accepted tokens kept as id lists, over all nodes
    int64_t uncertain_tokens = 0;  // tokens that depend on the stack, over all nodes
    int64_t memory_bytes = 0;      // of the per-state tables
    double seconds = 0;            // the compilation's wall time
  };
  const Stats& stats() const { return stats_; }

  // Per grammar state (internal to the matcher): the tokens it accepts whatever the stack below, in groups by
  // what they leave to finish the frames they are in or opened (least first); the tokens that leave its rule.
  struct Node {
    int32_t group_begin = 0, group_end = 0;    // into groups_
    int32_t suffix_begin = 0, suffix_end = 0;  // into suffixes_
  };
  struct Group {
    int32_t cost = 0;
    int32_t list_begin = 0, list_end = 0;  // into acc_ids_
    int32_t bits = -1;                     // word offset into acc_bits_, or -1 (list form)
  };
  // Tokens that leave a state's rule with the same bytes still to read (their suffix).
  struct Suffix {
    int32_t bytes_begin = 0, bytes_len = 0;  // into suffix_bytes_
    int32_t tok_begin = 0, tok_end = 0;      // into unc_ids_
  };

 private:
  friend class Matcher;
  CompiledGrammar(Grammar g, std::shared_ptr<const Vocabulary> v) : grammar_(std::move(g)), vocab_(std::move(v)) {}
  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<Node> nodes_;  // by grammar state; states without byte edges have an empty node
  std::vector<Group> groups_;
  std::vector<int32_t> acc_ids_, unc_ids_;
  std::vector<uint32_t> acc_bits_;
  std::vector<Suffix> suffixes_;
  std::string suffix_bytes_;
  std::vector<int32_t> costs_;  // per state: tokens to finish its rule
  Stats stats_;
};

class Matcher {
 public:
  // `stop_tokens`: allowed once the output is complete (they end it); may be empty.
  Matcher(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> stop_tokens);
  ~Matcher();
  Matcher(Matcher&&) noexcept;

  // Fills `allowed` (vocabulary().num_words() words) with the tokens that may come next when `remaining` >= 1
  // tokens may still be generated (this one included). Returns how many are allowed (0: none can, the output
  // is complete or cannot be completed in time).
  int64_t fill_mask(std::span<uint32_t> allowed, int64_t remaining);
  // Moves past `token`. InvalidArgument naming the token when it does not continue the grammar (or is a stop
  // token before the output is complete).
  Status accept(int32_t token);
  // Moves past `bytes` (tests, prefixes). InvalidArgument naming the offset where they leave the grammar.
  Status accept_bytes(std::string_view bytes);
  // The bytes so far are a whole output of the grammar (a stop token may follow).
  bool complete() const;
  // A stop token was accepted.
  bool finished() const { return finished_; }
  // The fewest tokens that complete the output from here by the grammar's costs (0 when complete).
  int64_t min_tokens_to_complete() const;

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<int32_t> stops_;
  std::unique_ptr<StackSets> sets_;
  int32_t cur_ = 0;
  bool finished_ = false;
};

}  // namespace genbridge::text::grammar
