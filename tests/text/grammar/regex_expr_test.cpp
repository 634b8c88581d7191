// text/grammar/regex_expr: a pattern's full matches are exactly std::regex's (ECMAScript) on a few thousand random
// strings per pattern, and each unsupported construct is refused naming itself and its offset.
#include "text/grammar/regex_expr.h"

#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "text/grammar/matcher.h"

namespace genbridge::text::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> compile_pattern(const std::string& pattern) {
  GrammarBuilder b;
  auto e = regex_expr(b, pattern);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  auto g = b.build(b.rule("re", *e));
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  std::vector<std::string> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(std::string(1, static_cast<char>(i)));
  return CompiledGrammar::compile(std::move(g).value(), Vocabulary::from_bytes(bytes, 256)).value();
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& cg, const std::string& s) {
  Matcher m(cg, {});
  return m.accept_bytes(s).ok() && m.complete();
}

std::string error_of(const std::string& pattern) {
  GrammarBuilder b;
  auto e = regex_expr(b, pattern);
  return e.ok() ? "ok" : e.status().message();
}

TEST(RegexExpr, full_matches_equal_std_regex_on_random_ascii_strings) {
  const char* patterns[] = {
      "a|bc|d*",
      "[a-c]+x?",
      "(ab|c){2,3}",
      "\\d{1,3}(\\.\\d+)?",
      "[^abc]{2}",
      "x.y",
      "(a|)b{0,2}c?",
      "\\w+@\\w+\\.com",
      "[\\d\\s-]+",
      "^(?:ab)+$",
      "a{3}|b{2,}",
      "[a\\-z]*",
      "(?:x|y)z*?",
      "\\x41\\u0042C",
      "[.]\\.\\*\\+",
      "(a(b(c)?)?)+",
      "[A-Za-z_][A-Za-z0-9_]*",
  };
  std::mt19937 rng(3);
  const std::string alphabet = "abcdxyz019. -@*+ABC_\n";
  for (const char* p : patterns) {
    SCOPED_TRACE(p);
    const auto cg = compile_pattern(p);
    const std::regex re(p, std::regex::ECMAScript);
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 9);
      for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(full_match(cg, s), std::regex_match(s, re)) << "string '" << s << "'";
    }
  }
}

TEST(RegexExpr, dot_and_negated_classes_match_multibyte_characters_whole) {
  const auto cg = compile_pattern("[^a].");
  EXPECT_TRUE(full_match(cg, "\xc3\xa9\xf0\x9f\x99\x82"));  // é🙂
  EXPECT_FALSE(full_match(cg, "\xc3\xa9\xf0\x9f\x99"));     // a cut character
  EXPECT_FALSE(full_match(cg, "b\n"));                      // . is not \n
  EXPECT_FALSE(full_match(cg, "\xed\xa0\x80x"));            // a surrogate's encoding is not a character
}

TEST(RegexExpr, named_groups_group_without_capturing) {
  const auto cg = compile_pattern("(?<year>\\d{4})-(?P<m>\\d\\d)");
  EXPECT_TRUE(full_match(cg, "2024-05"));
  EXPECT_FALSE(full_match(cg, "2024-5"));
}

TEST(RegexExpr, unsupported_constructs_are_refused_with_their_offset) {
  EXPECT_EQ(error_of("(a)\\1"), "pattern \"(a)\\1\": a backreference is not supported at offset 5");
  EXPECT_EQ(error_of("a(?=b)"), "pattern \"a(?=b)\": lookahead is not supported at offset 3");
  EXPECT_EQ(error_of("a(?<!b)"), "pattern \"a(?<!b)\": lookbehind is not supported at offset 3");
  EXPECT_EQ(error_of("\\bword"), "pattern \"\\bword\": \\b (a word boundary) is not supported at offset 2");
  EXPECT_EQ(error_of("a^b"), "pattern \"a^b\": '^' is supported at the start of the pattern only at offset 1");
  EXPECT_EQ(error_of("(?i)a"), "pattern \"(?i)a\": this group syntax (inline flags?) is not supported at offset 2");
  EXPECT_EQ(error_of("a{5,2}"), "pattern \"a{5,2}\": {5,2} counts down at offset 6");
  EXPECT_EQ(error_of("a{1001}"), "pattern \"a{1001}\": a repetition count exceeds 1000 at offset 5");
  EXPECT_EQ(error_of("(ab"), "pattern \"(ab\": '(' without its closing ')' at offset 3");
  EXPECT_EQ(error_of("[z-a]"), "pattern \"[z-a]\": a class range runs backwards at offset 4");
  EXPECT_EQ(error_of("*a"), "pattern \"*a\": '*' repeats nothing at offset 0");
  EXPECT_EQ(error_of("a++"), "pattern \"a++\": a possessive quantifier is not supported at offset 2");
}

}  // namespace
}  // namespace genbridge::text::grammar
