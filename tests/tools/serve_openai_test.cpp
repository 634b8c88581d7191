// tools/serve/openai: stop strings across token boundaries (TextStream) and request parsing (defaults, limits,
// extensions) without HTTP. The HTTP endpoints, the exact error messages and real clients are tested on
// loopback by tests/serve/.
#include <gtest/gtest.h>

#include "runtime/text/synthetic_tokenizer.h"
#include "support/temp_dir.h"
#include "tools/serve/openai.h"

namespace genbridge::serve {
namespace {

// The synthetic tokenizer's ids 0..255 are the 256 bytes in byte order.
const text::Tokenizer& tokenizer() {
  static genbridge::testing::TempDir dir;
  static text::Tokenizer tok = [] {
    EXPECT_TRUE(text::write_synthetic_tokenizer(dir.path(), 512).ok());
    return text::Tokenizer::load(dir.path() / "tokenizer.json").value();
  }();
  return tok;
}

std::vector<std::string> feed(TextStream& ts, const std::string& bytes) {
  std::vector<std::string> out;
  for (unsigned char c : bytes) out.push_back(ts.push(c));
  return out;
}

TEST(TextStream, stop_string_over_three_tokens_is_held_back_and_never_emitted) {
  TextStream ts(tokenizer(), {"bcd"});
  EXPECT_EQ(feed(ts, "abcde"), (std::vector<std::string>{"a", "", "", "", ""}));
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.finish(), "");
}

TEST(TextStream, partial_match_that_fails_is_released) {
  TextStream ts(tokenizer(), {"bcd"});
  EXPECT_EQ(feed(ts, "abcx"), (std::vector<std::string>{"a", "", "", "bcx"}));
  EXPECT_FALSE(ts.stopped());
  EXPECT_EQ(feed(ts, "b"), (std::vector<std::string>{""}));
  EXPECT_EQ(ts.finish(), "b");  // held bytes at the end are text
}

TEST(TextStream, earliest_of_several_stop_strings_wins) {
  TextStream ts(tokenizer(), {"xyz", "cd"});
  std::string out;
  for (const auto& s : feed(ts, "abcdxyz")) out += s;
  EXPECT_EQ(out, "ab");
  EXPECT_TRUE(ts.stopped());
}

TEST(TextStream, multibyte_characters_are_never_split) {
  TextStream ts(tokenizer(), {"\xc3\xa9!"});                                  // "é!"
  EXPECT_EQ(feed(ts, "a\xc3\xa9"), (std::vector<std::string>{"a", "", ""}));  // é could start the stop string
  EXPECT_EQ(feed(ts, "?"), (std::vector<std::string>{"\xc3\xa9?"}));
  TextStream plain(tokenizer(), {});
  EXPECT_EQ(feed(plain, "\xc3\xa9"), (std::vector<std::string>{"", "\xc3\xa9"}));
}

ServedModel model_of(int64_t kv_pages) {
  ServedModel m;
  m.name = "m";
  m.tokenizer = &tokenizer();
  m.vocab_size = 512;
  m.max_position_embeddings = 4096;
  m.kv_pages = kv_pages;
  m.kv_page_size = 128;
  m.kv_memory_mb = 1;
  m.default_max_tokens = 256;
  return m;
}

ParsedRequest parsed(const std::string& body, const ServedModel& m) {
  auto r = parse_request(body, false, m);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<ParsedRequest>(r);
}

TEST(ParseRequest, defaults_follow_openai_and_max_tokens_fits_context_and_kv_pool) {
  const ParsedRequest r = parsed(R"({"model": "m", "prompt": [1, 2, 3]})", model_of(64));
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 256);
  EXPECT_EQ(r.sampling.temperature, 1.f);
  EXPECT_EQ(r.sampling.top_p, 1.f);
  EXPECT_FALSE(r.seeded);
  EXPECT_FALSE(r.stream);
  // One 128-token page: 3 prompt tokens leave room for 126 more K/V rows, so 126 + 1 new tokens.
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": [1, 2, 3]})", model_of(1)).max_tokens, 126);
}

TEST(ParseRequest, top_k_minus_one_means_no_limit_and_negative_seeds_wrap) {
  const ParsedRequest r =
      parsed(R"({"model": "m", "prompt": "ab", "top_k": -1, "seed": -1, "stop": "x", "temperature": 0})", model_of(64));
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.seed, UINT64_MAX);
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"x"}));
  EXPECT_EQ(r.sampling.temperature, 0.f);
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{'a', 'b'}));
}

TEST(ParseRequest, chat_without_a_template_is_refused) {
  auto r = parse_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})", true, model_of(64));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).message,
            "This model has no chat template (tokenizer_config.json's chat_template); use /v1/completions.");
}

TEST(ParseRequest, error_object_is_openai_shaped) {
  const nlohmann::json j = error_json(ApiError{.message = "m", .param = "p"});
  EXPECT_EQ(j.dump(), R"({"error":{"code":null,"message":"m","param":"p","type":"invalid_request_error"}})");
}

}  // namespace
}  // namespace genbridge::serve
