// text/grammar/grammar: the builder's determinized rules read exactly their expressions' languages (code-point
// ranges byte for byte, bounded repetition), and every refusal names the rule or the limit.
#include "text/grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>

namespace genbridge::text::grammar {
namespace {

// Whether `g` reads `s` whole, following byte edges from the root rule's start (no calls).
bool reads(const Grammar& g, const std::string& s) {
  int32_t st = g.rule_start(g.root());
  for (unsigned char c : s) {
    st = g.next(st, c);
    if (st < 0) return false;
  }
  return g.is_final(st);
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

TEST(Grammar, code_point_ranges_read_exactly_their_characters) {
  const std::pair<char32_t, char32_t> ranges[] = {
      {0x41, 0x5A}, {0x7F, 0x801}, {0xD7F0, 0xE010}, {0xFFFE, 0x10010}, {0x3000, 0x10FFFF}};
  std::mt19937 rng(9);
  for (auto [lo, hi] : ranges) {
    GrammarBuilder b;
    const Grammar g = b.build(b.rule("r", b.codepoints(lo, hi))).value();
    for (int i = 0; i < 4000; ++i) {
      const char32_t c = static_cast<char32_t>(rng() % 0x110000);
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      ASSERT_EQ(reads(g, utf8(c)), c >= lo && c <= hi) << std::hex << static_cast<uint32_t>(c);
    }
    for (char32_t c : {lo, hi}) EXPECT_EQ(reads(g, utf8(c)), !(c >= 0xD800 && c <= 0xDFFF));
    EXPECT_FALSE(reads(g, "\xed\xa0\x80"));  // a surrogate's encoding
  }
}

TEST(Grammar, bounded_repetition_counts_exactly_and_minimizes) {
  GrammarBuilder b;
  const Grammar g = b.build(b.rule("r", b.repeat(b.alt({b.literal("ab"), b.literal("c")}), 2, 3))).value();
  EXPECT_FALSE(reads(g, "ab"));
  EXPECT_TRUE(reads(g, "abc"));
  EXPECT_TRUE(reads(g, "cabab"));
  EXPECT_FALSE(reads(g, "cccc"));
  EXPECT_EQ(g.min_bytes(g.rule_start(0)), 2);
  EXPECT_EQ(g.num_states(), 7);  // 0, 1, 2 or 3 items read, and inside "ab" after 0, 1 or 2 items
}

TEST(Grammar, refusals_name_the_rule_or_the_limit) {
  {
    GrammarBuilder b;
    const RuleId a = b.declare("a");
    b.define(a, b.seq({b.literal("x"), b.call(a)}));
    const auto r = b.build(a);
    EXPECT_EQ(r.status().message(), "grammar: rule 'a' can never complete (every way through it goes on forever)");
  }
  {
    GrammarBuilder b;
    b.declare("lonely");
    const auto r = b.build(0);
    EXPECT_EQ(r.status().message(), "grammar: rule 'lonely' is declared but never defined");
  }
  {
    GrammarBuilder b;
    const auto r = b.build(b.rule("big", b.repeat(b.bytes('a', 'z'), 0, 5000)), {.max_nfa_states = 1000});
    EXPECT_EQ(r.status().message(),
              "grammar: the rules' automata exceed 1000 states (rule 'big'; BuildLimits::max_nfa_states): the schema "
              "or pattern repeats too much (lower maxLength, maxItems or a {n,m} count)");
  }
}

}  // namespace
}  // namespace genbridge::text::grammar
