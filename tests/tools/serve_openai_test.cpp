// tools/serve/openai: stop strings across token boundaries (TextStream) and request parsing (defaults, limits,
// extensions) without HTTP. The HTTP endpoints, the exact error messages and real clients are tested on
// loopback by tests/serve/.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>

#include "support/temp_dir.h"
#include "text/synthetic_tokenizer.h"
#include "tools/serve/generation_config.h"
#include "tools/serve/openai.h"
#include "tools/serve/reasoning.h"
#include "tools/serve/request_fields.h"

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

const text::TokenizerConfig& synthetic_config() {
  static text::TokenizerConfig config = [] {
    genbridge::testing::TempDir dir;
    EXPECT_TRUE(text::write_synthetic_tokenizer(dir.path(), 512).ok());
    return text::TokenizerConfig::load(dir.path() / "tokenizer_config.json").value();
  }();
  return config;
}

ServedModel model_of(int64_t kv_pages) {
  ServedModel m;
  m.names = {"m"};
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
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
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
  EXPECT_EQ(r.prompts.at(0).ids, (std::vector<int32_t>{'a', 'b'}));
}

TEST(ParseRequest, chat_without_a_template_is_refused) {
  auto r = parse_request(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}]})", true, model_of(64));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).message,
            "This model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja, no "
            "--chat-template); use /v1/completions or give 'chat_template'.");
}

TEST(ParseRequest, nesting_past_the_depth_limit_is_refused_before_parsing) {
  // 100,000 levels would overflow the stack in the parser, a copy or a dump; refused naming the limit.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = parse_request(R"({"model": "m", "prompt": )" + deep + "}", false, model_of(64));
  ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  EXPECT_EQ(std::get<ApiError>(r).message,
            "The request body nests arrays and objects more than 128 levels deep (level 129 opens at byte 152); "
            "this server's limit is 128 levels.");
  EXPECT_EQ(json_too_deep_at(std::string(128, '{') + std::string(128, '}'), kMaxJsonDepth), std::nullopt);
  EXPECT_EQ(json_too_deep_at(std::string(129, '['), kMaxJsonDepth), 128u);
  // Brackets inside strings, escaped quotes included, are not nesting.
  EXPECT_EQ(json_too_deep_at(R"(["\"[[[", "\\", "[[[[\\"])", 1), std::nullopt);
  EXPECT_EQ(json_too_deep_at(R"(["\\", [1]])", 1), 7u);
  // A request at the limit parses (the body, chat_template_kwargs and 126 levels below).
  const std::string at_limit = std::string(126, '[') + std::string(126, ']');
  ServedModel chat = model_of(64);
  chat.tokenizer_config = &synthetic_config();
  auto deep_ok = parse_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": )" + at_limit + "}}", true,
      chat);
  EXPECT_TRUE(std::holds_alternative<ParsedRequest>(deep_ok)) << std::get<ApiError>(deep_ok).message;
}

TEST(ParseRequest, error_object_is_openai_shaped) {
  const nlohmann::json j = error_json(ApiError{.message = "m", .param = "p"});
  EXPECT_EQ(j.dump(), R"({"error":{"code":null,"message":"m","param":"p","type":"invalid_request_error"}})");
}

// Feeds `bytes` (one token per byte) with a logprob entry per token whose sampled logprob is -(index + 1),
// collecting what the queue releases after each push (all at the end when no stop string ended the text).
struct Fed {
  std::string text;
  std::vector<std::pair<double, size_t>> released;  // (logprob, text_offset)
};
Fed feed_with_logprobs(TextStream& ts, LogprobQueue& q, const std::string& bytes) {
  Fed f;
  auto take = [&](bool all) {
    for (const LogprobEntry& e : q.take(ts.released_bytes(), all))
      f.released.emplace_back(e.logprobs.sampled.logprob, e.text_offset);
  };
  for (size_t i = 0; i < bytes.size() && !ts.stopped(); ++i) {
    engine::TokenLogprobs lp;
    lp.sampled = {static_cast<unsigned char>(bytes[i]), -static_cast<double>(i + 1)};
    q.add(lp, ts.decoded_bytes(), ts.decoded_chars());
    f.text += ts.push(static_cast<unsigned char>(bytes[i]));
    take(false);
  }
  f.text += ts.finish();
  take(!ts.stopped());
  return f;
}

TEST(LogprobQueue, tokens_of_a_stop_string_are_never_released) {
  TextStream ts(tokenizer(), {"cd"});
  LogprobQueue q;
  const Fed f = feed_with_logprobs(ts, q, "abcdef");
  EXPECT_EQ(f.text, "ab");
  EXPECT_EQ(f.released, (std::vector<std::pair<double, size_t>>{{-1, 0}, {-2, 1}}));
}

TEST(LogprobQueue, entries_wait_for_held_text_and_offsets_count_characters) {
  // "é" is two tokens (two bytes): both entries go out with the character, at character offset 1; "x" is
  // held (it could start the stop string "x!") and goes out with "?", with its entry.
  TextStream ts(tokenizer(), {"x!"});
  LogprobQueue q;
  std::vector<size_t> released_after;
  std::string text;
  std::vector<LogprobEntry> got;
  const std::string bytes =
      "a\xc3\xa9"
      "bx?";
  for (size_t i = 0; i < bytes.size(); ++i) {
    engine::TokenLogprobs lp;
    lp.sampled = {static_cast<unsigned char>(bytes[i]), -static_cast<double>(i + 1)};
    q.add(lp, ts.decoded_bytes(), ts.decoded_chars());
    text += ts.push(static_cast<unsigned char>(bytes[i]));
    auto now = q.take(ts.released_bytes(), false);
    released_after.push_back(now.size());
    for (auto& e : now) got.push_back(std::move(e));
  }
  EXPECT_EQ(released_after, (std::vector<size_t>{1, 0, 2, 1, 0, 2}));  // x is held until "?" rules out "x!"
  text += ts.finish();
  for (auto& e : q.take(ts.released_bytes(), true)) got.push_back(std::move(e));
  EXPECT_EQ(text,
            "a\xc3\xa9"
            "bx?");
  std::vector<size_t> offsets;
  for (const auto& e : got) offsets.push_back(e.text_offset);
  EXPECT_EQ(offsets, (std::vector<size_t>{0, 1, 1, 2, 3, 4}));
}

TEST(LogprobQueue, a_stop_string_completed_at_the_end_drops_its_tokens) {
  TextStream ts(tokenizer(), {"yz"});
  LogprobQueue q;
  const Fed f = feed_with_logprobs(ts, q, "xyz");
  EXPECT_EQ(f.text, "x");
  EXPECT_EQ(f.released, (std::vector<std::pair<double, size_t>>{{-1, 0}}));
}

ParsedRequest parsed_chat(const std::string& body, const ServedModel& m) {
  auto r = parse_request(body, true, m);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << e->message;
    return {};
  }
  return std::get<ParsedRequest>(r);
}

TEST(ParseRequest, logprobs_of_completions_and_chat) {
  const ServedModel m = model_of(64);
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": "a"})", m).logprobs, -1);
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": "a", "logprobs": null})", m).logprobs, -1);
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": "a", "logprobs": 0})", m).logprobs, 0);
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": "a", "logprobs": 20})", m).logprobs, 20);
  static text::TokenizerConfig config = [] {
    genbridge::testing::TempDir dir;
    EXPECT_TRUE(text::write_synthetic_tokenizer(dir.path(), 512).ok());
    return text::TokenizerConfig::load(dir.path() / "tokenizer_config.json").value();
  }();
  ServedModel chat = m;
  chat.tokenizer_config = &config;
  const std::string msgs = R"("model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parsed_chat("{" + msgs + "}", chat).logprobs, -1);
  EXPECT_EQ(parsed_chat("{" + msgs + R"(, "logprobs": false})", chat).logprobs, -1);
  EXPECT_EQ(parsed_chat("{" + msgs + R"(, "logprobs": true})", chat).logprobs, 0);
  EXPECT_EQ(parsed_chat("{" + msgs + R"(, "logprobs": true, "top_logprobs": 7})", chat).logprobs, 7);
}

TEST(ParseRequest, bad_logprobs_name_the_field_and_the_rule) {
  const ServedModel m = model_of(64);
  const std::vector<std::tuple<bool, std::string, std::string, std::string>> cases = {
      {false, R"("logprobs": 21)", "logprobs", "'logprobs' must be between 0 and 20, got 21."},
      {false, R"("logprobs": -1)", "logprobs", "'logprobs' must be between 0 and 20, got -1."},
      {false, R"("logprobs": true)", "logprobs", "'logprobs' must be an integer, got true."},
      {false, R"("logprobs": 2.5)", "logprobs", "'logprobs' must be an integer, got 2.5."},
      {false, R"("top_logprobs": 2)", "top_logprobs",
       "'top_logprobs' belongs to /v1/chat/completions; /v1/completions takes 'logprobs': k."},
      {false, R"("suffix": "x")", "suffix",
       "'suffix' is not supported by this server: it inserts text after the completion (fill-in-the-middle), "
       "which this server does not do; got \"x\"."},
      {true, R"("logprobs": 3)", "logprobs", "'logprobs' must be a boolean, got 3."},
      {true, R"("logprobs": true, "top_logprobs": 21)", "top_logprobs",
       "'top_logprobs' must be between 0 and 20, got 21."},
      {true, R"("logprobs": true, "top_logprobs": -1)", "top_logprobs",
       "'top_logprobs' must be between 0 and 20, got -1."},
      {true, R"("logprobs": true, "top_logprobs": "5")", "top_logprobs",
       "'top_logprobs' must be an integer, got \"5\"."},
      {true, R"("top_logprobs": 2)", "top_logprobs", "'top_logprobs' requires 'logprobs': true."},
      {true, R"("logprobs": false, "top_logprobs": 2)", "top_logprobs", "'top_logprobs' requires 'logprobs': true."},
  };
  for (const auto& [chat, field, param, message] : cases) {
    const std::string body = chat ? R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], )" + field + "}"
                                  : R"({"model": "m", "prompt": "a", )" + field + "}";
    auto r = parse_request(body, chat, m);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).message, message) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400);
  }
}

// Every numeric field of both endpoints at its extremes (0, -0, negative, huge, beyond a double, subnormal,
// not an integer where one is expected): a 400 naming the field and the rule, never a 500 (before: 1e400
// anywhere was a 500 "[json.exception.out_of_range.406]" and a top_p of 1e-300 a 500 "top_p is 0"), and
// values the sampler would see differently from what was asked (a temperature of 1e-300 becoming greedy) are
// refused.
TEST(ParseRequest, every_numeric_field_at_its_extremes_is_a_400_naming_it) {
  static text::TokenizerConfig config = [] {
    genbridge::testing::TempDir dir;
    EXPECT_TRUE(text::write_synthetic_tokenizer(dir.path(), 512).ok());
    return text::TokenizerConfig::load(dir.path() / "tokenizer_config.json").value();
  }();
  ServedModel m = model_of(64);
  m.tokenizer_config = &config;
  const std::string dbl = ", a number beyond the range of a double (magnitude at most 1.7976931348623157e+308).";
  const std::string temp = "'temperature' must be 0 or a number in [1.1754944e-38, 2], got ";
  const std::string top_p = "'top_p' must be a number in [1.1754944e-38, 1], got ";
  const std::string top_k = "'top_k' must be -1 or 0 (no limit) or an integer in [1, 2147483647], got ";
  const std::string seed = "'seed' must be an integer in [-9223372036854775808, 18446744073709551615], got ";
  // (chat, fields, param, message)
  const std::vector<std::tuple<bool, std::string, std::string, std::string>> cases = {
      {false, R"("temperature": 1e400)", "temperature", "'temperature' is 1e400" + dbl},
      {false, R"("temperature": -1e400)", "temperature", "'temperature' is -1e400" + dbl},
      {true, R"("temperature": 1E+999)", "temperature", "'temperature' is 1E+999" + dbl},
      {false, R"("temperature": 1e-300)", "temperature", temp + "1e-300."},
      {false, R"("temperature": 1e-40)", "temperature", temp + "1e-40."},
      {false, R"("temperature": -1e-50)", "temperature", temp + "-1e-50."},
      {false, R"("temperature": 3.5e38)", "temperature", temp + "3.5e+38."},
      {false, R"("temperature": 2.5)", "temperature", temp + "2.5."},
      {false, R"("temperature": -1)", "temperature", temp + "-1."},
      {false, R"("temperature": 18446744073709551615)", "temperature", temp + "18446744073709551615."},
      {false, R"("top_p": 1e-300)", "top_p", top_p + "1e-300."},
      {false, R"("top_p": 1e-46)", "top_p", top_p + "1e-46."},
      {false, R"("top_p": 1e-40)", "top_p", top_p + "1e-40."},
      {false, R"("top_p": 0)", "top_p", top_p + "0."},
      {false, R"("top_p": -0.0)", "top_p", top_p + "-0.0."},
      {false, R"("top_p": 1.5)", "top_p", top_p + "1.5."},
      {true, R"("top_p": 1e400)", "top_p", "'top_p' is 1e400" + dbl},
      {false, R"("top_p": true)", "top_p", "'top_p' must be a number, got true."},
      {false, R"("top_k": -2)", "top_k", top_k + "-2."},
      {false, R"("top_k": 2147483648)", "top_k", top_k + "2147483648."},
      {false, R"("top_k": 18446744073709551615)", "top_k",
       top_k + "18446744073709551615 (beyond a signed 64-bit integer)."},
      {false, R"("top_k": 2.5)", "top_k", "'top_k' must be an integer, got 2.5."},
      {false, R"("top_k": 99999999999999999999)", "top_k", "'top_k' must be an integer, got 1e+20."},
      {false, R"("top_k": 1e400)", "top_k", "'top_k' is 1e400" + dbl},
      {false, R"("seed": 1.5)", "seed", "'seed' must be an integer, got 1.5."},
      {false, R"("seed": 18446744073709551616)", "seed", seed + "1.8446744073709552e+19."},
      {false, R"("seed": -9223372036854775809)", "seed", seed + "-9.223372036854776e+18."},
      {false, R"("seed": 1e400)", "seed", "'seed' is 1e400" + dbl},
      {false, R"("seed": "1")", "seed", "'seed' must be an integer, got \"1\"."},
      {false, R"("max_tokens": 1e400)", "max_tokens", "'max_tokens' is 1e400" + dbl},
      {false, R"("max_tokens": -0)", "max_tokens", "'max_tokens' must be at least 1, got 0."},
      {false, R"("max_tokens": 2.0)", "max_tokens", "'max_tokens' must be an integer, got 2.0."},
      {false, R"("max_tokens": 18446744073709551615)", "max_tokens",
       "'max_tokens' must be at least 1, got 18446744073709551615 (beyond a signed 64-bit integer)."},
      {true, R"("max_completion_tokens": 0)", "max_completion_tokens",
       "'max_completion_tokens' must be at least 1, got 0."},
      {true, R"("max_completion_tokens": 1e400)", "max_completion_tokens", "'max_completion_tokens' is 1e400" + dbl},
      {false, R"("logprobs": 1e400)", "logprobs", "'logprobs' is 1e400" + dbl},
      {false, R"("logprobs": 20.0)", "logprobs", "'logprobs' must be an integer, got 20.0."},
      {true, R"("logprobs": true, "top_logprobs": 1e400)", "top_logprobs", "'top_logprobs' is 1e400" + dbl},
      {false, R"("n": 1e400)", "n", "'n' is 1e400" + dbl},
      {false, R"("n": 0)", "n", "'n' must be an integer in [1, 128], got 0."},
      {false, R"("n": 129)", "n", "'n' must be an integer in [1, 128], got 129."},
      {false, R"("best_of": 0)", "best_of", "'best_of' must be an integer in [1, 128], got 0."},
      {false, R"("n": 3, "best_of": 2)", "best_of", "'best_of' must be at least 'n' (3), got 2."},
      {false, R"("best_of": 2, "stream": true)", "best_of",
       "'best_of' 2 > 'n' 1 cannot be streamed: the best 1 of 2 are known only when every one has ended."},
      {false, R"("frequency_penalty": 2.5)", "frequency_penalty",
       "'frequency_penalty' must be a number in [-2, 2], got 2.5."},
      {true, R"("presence_penalty": -3)", "presence_penalty", "'presence_penalty' must be a number in [-2, 2], got -3."},
      {false, R"("repetition_penalty": 0)", "repetition_penalty",
       "'repetition_penalty' must be a number in [1.1754944e-38, 3.4028235e+38], got 0."},
      {false, R"("repetition_penalty": "1.1")", "repetition_penalty",
       "'repetition_penalty' must be a number, got \"1.1\"."},
      {false, R"("min_p": 1.5)", "min_p", "'min_p' must be a number in [0, 1], got 1.5."},
      {false, R"("min_p": 1e-50)", "min_p", "'min_p' must be a number in [0, 1], got 1e-50."},
      {false, R"("logit_bias": {"5": 101})", "logit_bias.5", "'logit_bias.5' must be a number in [-100, 100], got 101."},
      {false, R"("logit_bias": {"512": 1})", "logit_bias", "'logit_bias' keys must be token ids in [0, 512), got \"512\"."},
      {false, R"("logit_bias": {"x": 1})", "logit_bias", "'logit_bias' keys must be token ids in [0, 512), got \"x\"."},
      {false, R"("allowed_token_ids": [])", "allowed_token_ids",
       "'allowed_token_ids' must not be empty (it would mask every token)."},
      {false, R"("allowed_token_ids": [600])", "allowed_token_ids",
       "'allowed_token_ids' token 600 is outside the vocabulary [0, 512)."},
      {false, R"("stop_token_ids": [1, -1])", "stop_token_ids",
       "'stop_token_ids' token -1 is outside the vocabulary [0, 512)."},
      {false, R"("max_tokens": 3, "min_tokens": 4)", "min_tokens",
       "'min_tokens' must be an integer in [0, 3] (at most 'max_tokens'), got 4."},
      {false, R"("truncate_prompt_tokens": 0)", "truncate_prompt_tokens", "'truncate_prompt_tokens' must be at least 1, got 0."},
      {false, R"("max_tokens": 0, "echo": true, "n": 2)", "max_tokens",
       "'max_tokens' 0 (the echoed prompt alone) takes one choice, but 'n' / 'best_of' is 2."},
      {false, R"("min_p": "0")", "min_p", "'min_p' must be a number, got \"0\"."},
      {false, R"("frequency_penalty": 1e400)", "frequency_penalty", "'frequency_penalty' is 1e400" + dbl},
      {false, R"("logit_bias": {"5": 1e400})", "logit_bias.5", "'logit_bias.5' is 1e400" + dbl},
      {false, R"("stream": true, "stream_options": {"include_usage": -1e999})", "stream_options.include_usage",
       "'stream_options.include_usage' is -1e999" + dbl},
      {false, R"("extra": [1, [2, 3], {"a": [4, 5e500]}])", "extra[2].a[1]", "'extra[2].a[1]' is 5e500" + dbl},
      {true, R"("tools": [{"type": "function", "x": 1e400}])", "tools[0].x", "'tools[0].x' is 1e400" + dbl},
  };
  for (const auto& [chat, fields, param, message] : cases) {
    const std::string body = chat ? R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], )" + fields + "}"
                                  : R"({"model": "m", "prompt": "a", )" + fields + "}";
    auto r = parse_request(body, chat, m);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).message, message) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body;
    EXPECT_EQ(std::get<ApiError>(r).http_status, 400) << body;
  }
  // Beyond a double inside the prompt, a message and the whole body.
  const std::vector<std::tuple<bool, std::string, std::string, std::string>> bodies = {
      {false, R"({"model": "m", "prompt": [1, 2, 1e400]})", "prompt[2]", "'prompt[2]' is 1e400" + dbl},
      {true, R"({"model": "m", "messages": [{"role": "user", "content": "hi", "w": 1e400}]})", "messages[0].w",
       "'messages[0].w' is 1e400" + dbl},
      {false, "1e400", "", "The request body holds 1e400" + dbl},
      {false, R"({"model": "m", "prompt": [1, 2.5]})", "prompt",
       "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists, got [1,2.5]."},
      {false, R"({"model": "m", "prompt": [[1], [2.5]]})", "prompt[1]",
       "'prompt[1]' must be a list of token ids, got [2.5]."},
      {false, R"({"model": "m", "prompt": ["a", ""]})", "prompt", "'prompt[1]' is empty: it encodes to no token."},
      {false, R"({"model": "x", "prompt": "a"})", "model", "The model 'x' does not exist; this server serves 'm'."},
      {false, R"({"model": "m", "prompt": "a", "frobnicate": 1})", "frobnicate",
       "Unrecognized request argument supplied: frobnicate"},
      {false, R"({"model": "m", "prompt": "a", "messages": []})", "messages",
       "'messages' belongs to /v1/chat/completions, not /v1/completions."},
      {false, R"({"model": "m", "prompt": [18446744073709551615]})", "prompt",
       "'prompt' token 18446744073709551615 is outside the vocabulary [0, 512)."},
      {false, R"({"model": "m", "prompt": [-1]})", "prompt", "'prompt' token -1 is outside the vocabulary [0, 512)."},
  };
  for (const auto& [chat, body, param, message] : bodies) {
    auto r = parse_request(body, chat, m);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
    EXPECT_EQ(std::get<ApiError>(r).message, message) << body;
    EXPECT_EQ(std::get<ApiError>(r).param, param) << body;
  }
  // The ends that are accepted, as the sampler will see them.
  auto ok = [&](const std::string& fields) { return parsed(R"({"model": "m", "prompt": "a", )" + fields + "}", m); };
  EXPECT_EQ(ok(R"("temperature": -0.0)").sampling.temperature, 0.f);  // -0 is 0: greedy
  EXPECT_EQ(ok(R"("temperature": 1.1754944e-38)").sampling.temperature, std::numeric_limits<float>::min());
  EXPECT_EQ(ok(R"("temperature": 2)").sampling.temperature, 2.f);
  EXPECT_EQ(ok(R"("top_p": 1.1754944e-38)").sampling.top_p, std::numeric_limits<float>::min());
  EXPECT_EQ(ok(R"("top_p": 1)").sampling.top_p, 1.f);
  EXPECT_EQ(ok(R"("top_k": 2147483647)").sampling.top_k, 2147483647);
  EXPECT_EQ(ok(R"("top_k": 0)").sampling.top_k, 0);
  EXPECT_EQ(ok(R"("seed": 18446744073709551615)").sampling.seed, UINT64_MAX);
  EXPECT_EQ(ok(R"("seed": -9223372036854775808)").sampling.seed, uint64_t{1} << 63);
  EXPECT_EQ(ok(R"("seed": -0)").sampling.seed, 0u);
  EXPECT_EQ(ok(R"("max_tokens": 4095)").max_tokens, 4095);
  EXPECT_EQ(ok(R"("frequency_penalty": 0, "presence_penalty": -0.0, "repetition_penalty": 1, "min_p": 0)").max_tokens,
            256);
  EXPECT_EQ(ok(R"("best_of": 1, "n": 1)").max_tokens, 256);
  const ParsedRequest controls = ok(
      R"("frequency_penalty": -2, "presence_penalty": 2, "repetition_penalty": 1.5, "min_p": 1, "logit_bias": )"
      R"({"7": -100, "8": 100}, "allowed_token_ids": [7, 8], "min_tokens": 5, "stop_token_ids": [9])");
  EXPECT_EQ(controls.sampling.frequency_penalty, -2.f);
  EXPECT_EQ(controls.sampling.presence_penalty, 2.f);
  EXPECT_EQ(controls.sampling.repetition_penalty, 1.5f);
  EXPECT_EQ(controls.sampling.min_p, 1.f);
  EXPECT_EQ(controls.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.f}, {8, 100.f}}));
  EXPECT_EQ(controls.sampling.allowed_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(controls.sampling.min_tokens, 5);
  EXPECT_EQ(controls.stop_token_ids, (std::vector<int32_t>{9}));
  for (const char* f : {R"("temperature": 1e-300)", R"("top_p": 1e-300)"}) {
    auto r = parse_request(std::string(R"({"model": "m", "prompt": "a", )") + f + "}", false, m);
    ASSERT_TRUE(std::holds_alternative<ApiError>(r));
  }
  EXPECT_TRUE(engine::validate(ok(R"("temperature": 1.1754944e-38, "top_p": 1.1754944e-38)").sampling).ok());
}

TEST(LogprobsJson, legacy_completions_and_chat_formats) {
  ParsedRequest r;
  r.logprobs = 1;
  engine::TokenLogprobs a;
  a.sampled = {'h', -0.5};
  a.top = {{'i', -0.25}};
  engine::TokenLogprobs b;
  b.sampled = {0xc3, -1.5};  // a piece of a character: text U+FFFD, bytes exact
  b.top = {{0xc3, -1.5}};
  const std::vector<LogprobEntry> entries = {{a, 0}, {b, 1}};
  EXPECT_EQ(logprobs_json(r, tokenizer(), entries),
            nlohmann::json::parse(R"({"text_offset":[0,1],"token_logprobs":[-0.5,-1.5],"tokens":["h","\ufffd"],)"
                                  R"("top_logprobs":[{"h":-0.5,"i":-0.25},{"\ufffd":-1.5}]})"));
  r.chat = true;
  EXPECT_EQ(
      logprobs_json(r, tokenizer(), {{a, 0}}).dump(),
      R"({"content":[{"bytes":[104],"logprob":-0.5,"token":"h","top_logprobs":[{"bytes":[105],"logprob":-0.25,"token":"i"}]}]})");
  r.logprobs = -1;
  EXPECT_TRUE(logprobs_json(r, tokenizer(), entries).is_null());
}


// vLLM's stop rules: include_stop_str_in_output releases the stop string with the text; a stop string must end
// in the text of a token after the first min_tokens ones.
TEST(TextStream, include_stop_and_min_tokens_follow_vllm) {
  TextStream with(tokenizer(), {"bc"}, /*include_stop=*/true);
  EXPECT_EQ(feed(with, "abcd"), (std::vector<std::string>{"a", "", "bc", ""}));
  EXPECT_EQ(with.stop_string(), "bc");
  // min_tokens 3: "bc" ends in the 3rd token's text (not counted), the second "bc" ends in the 6th.
  TextStream held(tokenizer(), {"bc"}, false, /*min_tokens=*/3);
  std::string out;
  for (const std::string& piece : feed(held, "abcxbcz")) out += piece;
  EXPECT_EQ(out, "abcx");
  EXPECT_TRUE(held.stopped());
  // A stop string that starts within the first min_tokens tokens and ends after them counts.
  TextStream across(tokenizer(), {"bc"}, false, /*min_tokens=*/2);
  out.clear();
  for (const std::string& piece : feed(across, "abcx")) out += piece;
  EXPECT_EQ(out, "a");
}

TEST(Reasoning, qwen3_splits_a_think_block_streamed_in_pieces) {
  ReasoningSplitter r(ReasoningParser::kQwen3);
  std::string reasoning, content;
  for (std::string_view piece : {"<th", "ink>let me", " see</th", "ink>\n\nThe answer", " is 4."}) {
    auto p = r.push(piece);
    reasoning += p.reasoning;
    content += p.content;
  }
  auto p = r.finish();
  EXPECT_EQ(reasoning + p.reasoning, "let me see");
  EXPECT_EQ(content + p.content, "\n\nThe answer is 4.");
  EXPECT_TRUE(r.saw_reasoning());
  // No opening tag: all content (enable_thinking false closed an empty block in the prompt).
  ReasoningSplitter plain(ReasoningParser::kQwen3);
  EXPECT_EQ(plain.push("<t").content, "");
  EXPECT_EQ(plain.push("able>").content, "<table>");
  EXPECT_FALSE(plain.saw_reasoning());
}

TEST(Reasoning, deepseek_r1_is_reasoning_from_the_start_until_the_close) {
  ReasoningSplitter r(ReasoningParser::kDeepSeekR1);
  auto a = r.push("thinking</think>done");
  EXPECT_EQ(a.reasoning, "thinking");
  EXPECT_EQ(a.content, "done");
  ReasoningSplitter open(ReasoningParser::kDeepSeekR1);
  auto b = open.push("<think>never closed</");
  auto c = open.finish();
  EXPECT_EQ(b.reasoning + c.reasoning, "never closed</");
  EXPECT_EQ(b.content + c.content, "");
}

ServedModel chat_model() {
  ServedModel m = model_of(64);
  m.tokenizer_config = &synthetic_config();
  return m;
}

TEST(ParseRequest, prompt_lists_choices_echo_and_model_defaults) {
  const ServedModel m = model_of(64);
  const ParsedRequest r = parsed(R"({"prompt": [[1, 2], [3]], "n": 2, "best_of": 3, "echo": true, "logprobs": 1})", m);
  EXPECT_EQ(r.model, "m") << "model is optional: the first served name";
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(r.prompts[0].text, "\x01\x02");
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 3);
  EXPECT_TRUE(r.prompt_logprobs());
  EXPECT_EQ(r.prompt_tokens(), 3);
  EXPECT_EQ(parsed(R"({"prompt": ["ab", "c"]})", m).prompts[0].text, "ab");
  EXPECT_EQ(parsed(R"({"prompt": [1, 2, 3, 4], "truncate_prompt_tokens": 2})", m).prompts[0].ids,
            (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(parsed(R"({"prompt": "a", "echo": true, "max_tokens": 0})", m).max_tokens, 0);
  ServedModel two = m;
  two.names = {"m", "alias"};
  two.defaults.temperature = 0.6f;
  two.defaults.top_k = 20;
  two.defaults.max_tokens = 7;
  const ParsedRequest d = parsed(R"({"model": "alias", "prompt": "a"})", two);
  EXPECT_EQ(d.model, "alias");
  EXPECT_EQ(d.sampling.temperature, 0.6f);
  EXPECT_EQ(d.sampling.top_k, 20);
  EXPECT_EQ(d.max_tokens, 7);
  EXPECT_EQ(parsed(R"({"prompt": "a", "temperature": 0, "top_k": 3})", two).sampling.temperature, 0.f);
  auto unknown = parse_request(R"({"model": "other", "prompt": "a"})", false, two);
  ASSERT_TRUE(std::holds_alternative<ApiError>(unknown));
  EXPECT_EQ(std::get<ApiError>(unknown).http_status, 404);
  EXPECT_EQ(std::get<ApiError>(unknown).code, "model_not_found");
  EXPECT_EQ(std::get<ApiError>(unknown).message, "The model 'other' does not exist; this server serves 'm', 'alias'.");
  auto ctx = parse_request(R"({"prompt": "a", "max_tokens": 5000})", false, m);
  EXPECT_EQ(std::get<ApiError>(ctx).code, "context_length_exceeded");
}

// add_special_tokens: tokenizer_config.json's add_bos_token puts bos_token before a completions text prompt
// (default true), not before token ids, and not before a chat prompt (default false: the template writes it).
TEST(ParseRequest, add_special_tokens_follows_add_bos_token) {
  text::TokenizerConfig config = synthetic_config();
  config.add_bos_token = true;
  config.bos_token = "a";  // a token of the synthetic tokenizer: id 'a'
  ServedModel m = model_of(64);
  m.tokenizer_config = &config;
  EXPECT_EQ(parsed(R"({"prompt": "b"})", m).prompts[0].ids, (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(parsed(R"({"prompt": "b", "add_special_tokens": false})", m).prompts[0].ids, (std::vector<int32_t>{'b'}));
  EXPECT_EQ(parsed(R"({"prompt": [98]})", m).prompts[0].ids, (std::vector<int32_t>{98}));
  const ParsedRequest chat = parsed_chat(R"({"messages": [{"role": "user", "content": "b"}]})", m);
  const ParsedRequest chat_bos =
      parsed_chat(R"({"messages": [{"role": "user", "content": "b"}], "add_special_tokens": true})", m);
  EXPECT_EQ(chat_bos.prompts[0].ids.size(), chat.prompts[0].ids.size() + 1);
  EXPECT_EQ(chat_bos.prompts[0].ids[0], 'a');
}

// The chat template sees the request's key order (tojson prints it), as transformers renders it: two orders of
// the same message give two prompts, each in its order.
TEST(ParseRequest, chat_template_sees_the_request_key_order) {
  const ServedModel m = chat_model();
  const std::string tmpl = R"("chat_template": "{{ messages[0] | tojson }}")";
  const ParsedRequest a = parsed_chat(R"({"messages": [{"role": "user", "content": "x"}], )" + tmpl + "}", m);
  const ParsedRequest b = parsed_chat(R"({"messages": [{"content": "x", "role": "user"}], )" + tmpl + "}", m);
  EXPECT_EQ(tokenizer().decode(a.prompts[0].ids), R"({"role": "user", "content": "x"})");
  EXPECT_EQ(tokenizer().decode(b.prompts[0].ids), R"({"content": "x", "role": "user"})");
}

TEST(ParseRequest, continue_final_message_and_generation_prompt) {
  const ServedModel m = chat_model();
  const std::string msgs =
      R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello the"}])";
  const ParsedRequest c = parsed_chat(
      "{" + msgs + R"(, "add_generation_prompt": false, "continue_final_message": true, "echo": true})", m);
  const std::string text = tokenizer().decode(c.prompts[0].ids);
  EXPECT_TRUE(text.size() >= 9 && text.compare(text.size() - 9, 9, "Hello the") == 0) << text;
  EXPECT_EQ(c.role, "assistant");
  EXPECT_EQ(c.echo_text, "Hello the");
  auto both = parse_request("{" + msgs + R"(, "continue_final_message": true})", true, m);
  EXPECT_EQ(std::get<ApiError>(both).message,
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true (add_generation_prompt is "
            "true unless the request sets it to false).");
  const ParsedRequest plain = parsed_chat("{" + msgs + R"(, "add_generation_prompt": false})", m);
  const ParsedRequest gen = parsed_chat("{" + msgs + "}", m);
  EXPECT_LT(plain.prompts[0].ids.size(), gen.prompts[0].ids.size()) << "the generation prompt is added by default";
}

// docs/serving.md's field table and the server's list of fields agree row for row: name, endpoints, status.
TEST(RequestFields, the_docs_table_lists_every_field_with_its_status) {
  std::ifstream in(std::string(GENBRIDGE_SOURCE_DIR) + "/docs/serving.md");
  ASSERT_TRUE(in) << "docs/serving.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::regex row(R"(^\| `([a-z_]+)` \| (both|completions|chat) \| (honoured|default only|refused) \|)");
  std::map<std::string, std::pair<unsigned, std::string>> docs;
  std::string line;
  while (std::getline(text, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const unsigned ep = m[2] == "both" ? kBothEndpoints : m[2] == "chat" ? kChat : kCompletions;
    auto& [endpoints, status] = docs[m[1]];
    endpoints |= ep;
    if (!status.empty()) EXPECT_EQ(status, m[3]) << m[1] << ": two statuses";
    status = m[3];
  }
  const std::map<FieldStatus, std::string> names = {{FieldStatus::kHonoured, "honoured"},
                                                    {FieldStatus::kDefaultOnly, "default only"},
                                                    {FieldStatus::kRefused, "refused"}};
  for (const RequestField& f : request_fields()) {
    auto it = docs.find(std::string(f.name));
    ASSERT_NE(it, docs.end()) << f.name << " is not in docs/serving.md's field table";
    EXPECT_EQ(it->second.first, f.endpoints) << f.name << ": endpoints";
    EXPECT_EQ(it->second.second, names.at(f.status)) << f.name << ": status";
    docs.erase(it);
  }
  for (const auto& [name, rest] : docs) ADD_FAILURE() << name << " is in the docs' table but not a field of the server";
}

TEST(GenerationConfig, eos_ids_and_sampling_defaults_with_their_rules) {
  auto c = parse_generation_config(
      R"({"eos_token_id": [151645, 151643], "temperature": 0.6, "top_k": 20, "top_p": 0.95, "do_sample": true,
          "max_new_tokens": 64})",
      "generation_config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(c->defaults.temperature, 0.6f);
  EXPECT_EQ(c->defaults.top_k, 20);
  EXPECT_EQ(c->defaults.top_p, 0.95f);
  EXPECT_EQ(c->defaults.max_tokens, 64);
  EXPECT_FALSE(c->defaults.min_p);
  EXPECT_EQ(parse_generation_config(R"({"eos_token_id": 7})", "g").value().eos_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(parse_generation_config(R"({"temperature": -1})", "g").status().message(),
            "g: \"temperature\" is -1; it must be 0 or a number in [1.1754944e-38, 2]");
  EXPECT_EQ(parse_generation_config(R"({"eos_token_id": "x"})", "g").status().message(),
            "g: \"eos_token_id\" is \"x\"; it must be a token id or a list of them");
  SamplingDefaults d = c->defaults;
  ASSERT_TRUE(override_generation_config(R"({"temperature": 0.5, "min_p": 0.1})", "--override-generation-config", &d)
                  .ok());
  EXPECT_EQ(d.temperature, 0.5f);
  EXPECT_EQ(d.min_p, 0.1f);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_EQ(override_generation_config(R"({"do_sample": true})", "--override-generation-config", &d).message(),
            "--override-generation-config: \"do_sample\" is not a sampling default (temperature, top_p, top_k, "
            "min_p, repetition_penalty, max_new_tokens)");
}

}  // namespace
}  // namespace genbridge::serve
