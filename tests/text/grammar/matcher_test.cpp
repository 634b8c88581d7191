// text/grammar: token masks against brute force (every token tried from the same prefix), the budget (an output
// started with at least min_tokens + 1 tokens always completes, stop token included), stop tokens only once the
// output is complete, and the vocabulary trie. Synthetic vocabularies: every byte is a token, plus multi-byte
// tokens chosen to cross rule boundaries ("\",", "}]", "12,") where masks depend on the stack.
#include "text/grammar/matcher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "text/grammar/json_schema.h"
#include "text/grammar/regex_expr.h"

namespace genbridge::text::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::vector<std::string> vocabulary_tokens() {
  std::vector<std::string> t;
  for (int i = 0; i < 256; ++i) t.push_back(std::string(1, static_cast<char>(i)));
  for (const char* s :
       {"{\"",  "\":",    "\",",   "\"}", "\"]",  "}]",   "}}",   "]}",       "12",    "12,", "0.",    "e+",
        "true", "tru",    "null,", "  ",  "\n  ", " \"",  "\"a",  "ab",       "abc\"", "\\n", "\\u00", "é",
        "\xc3", "\xa9\"", "[{",    "[]",  "{}",   ", \"", "name", "\"name\"", "age",   "-1",  "99",    "\t"}) {
    t.push_back(s);
  }
  t.push_back("");  // the stop token: no bytes
  return t;
}

struct Fixture {
  std::vector<std::string> tokens = vocabulary_tokens();
  std::shared_ptr<const Vocabulary> vocab = Vocabulary::from_bytes(tokens, static_cast<int64_t>(tokens.size()) + 5);
  int32_t stop = static_cast<int32_t>(tokens.size()) - 1;
};

std::shared_ptr<const CompiledGrammar> compiled(const Fixture& f, Result<Grammar> g) {
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  auto cg = CompiledGrammar::compile(std::move(g).value(), f.vocab);
  EXPECT_TRUE(cg.ok()) << cg.status().to_string();
  return *cg;
}

bool bit(const std::vector<uint32_t>& m, int32_t i) { return (m[i >> 5] >> (i & 31)) & 1; }

// Random walks: at every step the mask equals brute force, and the walk ends complete within its budget.
void check_walks(const Fixture& f, const std::shared_ptr<const CompiledGrammar>& cg, int walks, int extra_budget) {
  std::mt19937 rng(5);
  const int64_t size = f.vocab->size();
  for (int w = 0; w < walks; ++w) {
    const int64_t budget = cg->min_tokens() + 1 + (w % (extra_budget + 1));
    Matcher m(cg, {f.stop});
    std::string prefix;
    std::vector<uint32_t> mask(static_cast<size_t>(f.vocab->num_words()));
    bool done = false;
    for (int64_t step = 0; step < budget && !done; ++step) {
      const int64_t remaining = budget - step;
      const int64_t n = m.fill_mask(mask, remaining);
      ASSERT_GT(n, 0) << "walk " << w << " step " << step << ": no token allowed after '" << prefix << "'";
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < size; ++t) {
        bool want = false;
        if (t == f.stop) {
          want = m.complete();
        } else if (t < static_cast<int32_t>(f.tokens.size()) && !f.tokens[t].empty()) {
          Matcher probe(cg, {f.stop});
          ASSERT_TRUE(probe.accept_bytes(prefix).ok());
          want = probe.accept_bytes(f.tokens[t]).ok() && probe.min_tokens_to_complete() + 1 <= remaining - 1;
        }
        ASSERT_EQ(bit(mask, t), want) << "walk " << w << " after '" << prefix << "' token " << t << " '"
                                      << (t < static_cast<int32_t>(f.tokens.size()) ? f.tokens[t] : "") << "'";
        if (want) allowed.push_back(t);
      }
      ASSERT_EQ(n, static_cast<int64_t>(allowed.size()));
      const int32_t t = allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept(t).ok());
      if (t == f.stop) {
        done = true;
      } else {
        prefix += f.tokens[t];
      }
    }
    EXPECT_TRUE(done) << "walk " << w << " did not complete within " << budget << " tokens: '" << prefix << "'";
    EXPECT_TRUE(m.finished());
  }
}

TEST(Matcher, json_object_masks_equal_brute_force_and_walks_complete_within_the_budget) {
  Fixture f;
  check_walks(f, compiled(f, json_object_grammar()), 40, 30);
}

TEST(Matcher, schema_masks_equal_brute_force_and_walks_complete_within_the_budget) {
  Fixture f;
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 4}, "age": {"type": "integer", "minimum": -5, "maximum": 120},
      "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
      "score": {"type": "number"}, "ok": {"type": ["boolean", "null"]}},
      "required": ["name", "age"], "additionalProperties": false})");
  check_walks(f, compiled(f, json_schema_grammar(schema)), 40, 20);
}

TEST(Matcher, stop_token_before_the_output_is_complete_is_refused) {
  Fixture f;
  Matcher m(compiled(f, json_object_grammar()), {f.stop});
  EXPECT_EQ(m.accept(f.stop).message(), fmt::format("grammar: stop token {} before the output is complete", f.stop));
  ASSERT_TRUE(m.accept_bytes("{}").ok());
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.accept(f.stop).ok());
  EXPECT_TRUE(m.finished());
}

TEST(Matcher, complete_output_with_no_stop_token_allows_nothing) {
  Fixture f;
  GrammarBuilder b;
  Matcher m(compiled(f, b.build(b.rule("r", b.literal("ab")))), {});
  std::vector<uint32_t> mask(static_cast<size_t>(f.vocab->num_words()));
  ASSERT_TRUE(m.accept_bytes("ab").ok());
  EXPECT_EQ(m.fill_mask(mask, 10), 0);
}

TEST(Matcher, bytes_off_the_grammar_name_their_offset) {
  Fixture f;
  Matcher m(compiled(f, json_object_grammar()), {f.stop});
  EXPECT_EQ(m.accept_bytes("{\"a\" x").message(), "grammar: byte 5 (0x78) does not continue the grammar");
}

TEST(Matcher, special_token_without_bytes_is_never_allowed) {
  Fixture f;
  Matcher m(compiled(f, json_object_grammar()), {f.stop});
  EXPECT_EQ(m.accept(static_cast<int32_t>(f.tokens.size()) + 2).message(),
            fmt::format("grammar: token {} is never allowed (a special token)", f.tokens.size() + 2));
}

TEST(Vocabulary, trie_lists_each_token_once_in_byte_order) {
  auto v = Vocabulary::from_bytes({"b", "ab", "a", "", "abc", "ab"}, 8);
  EXPECT_EQ(v->size(), 8);
  EXPECT_EQ(v->num_tokens(), 5);  // the empty one is not in the trie
  std::vector<std::string> seen;
  for (int32_t k = 0; k < static_cast<int32_t>(v->num_tokens()); ++k) seen.push_back(v->bytes(v->sorted_token(k)));
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "ab", "ab", "abc", "b"}));
  EXPECT_EQ(v->num_trie_nodes(), 5);  // root, a, ab, abc, b
  EXPECT_FALSE(v->every_byte_is_a_token());
  EXPECT_TRUE(Fixture().vocab->every_byte_is_a_token());
}

}  // namespace
}  // namespace genbridge::text::grammar
