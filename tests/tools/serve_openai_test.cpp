// tools/serve/openai: stop strings across token boundaries (TextStream) and request parsing (defaults, limits,
// extensions) without HTTP. The HTTP endpoints, the exact error messages and real clients are tested on
// loopback by tests/serve/.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "support/temp_dir.h"
#include "text/synthetic_tokenizer.h"
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
            "This model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); use "
            "/v1/completions.");
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
  // A request at the limit parses.
  const std::string at_limit = std::string(127, '[') + std::string(127, ']');
  EXPECT_EQ(parsed(R"({"model": "m", "prompt": [1], "x": )" + at_limit + "}", model_of(64)).prompt,
            (std::vector<int32_t>{1}));
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
      {false, R"("echo": true)", "echo", "'echo' is not supported by this server."},
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
      {false, R"("n": 0)", "n", "'n' must be 1 (this server generates one choice per request), got 0."},
      {false, R"("best_of": 2)", "best_of",
       "'best_of' must be 1 (this server generates one choice per request), got 2."},
      {false, R"("frequency_penalty": 0.5)", "frequency_penalty",
       "'frequency_penalty' is not supported by this server: it must be 0 (or absent), got 0.5."},
      {true, R"("presence_penalty": -2)", "presence_penalty",
       "'presence_penalty' is not supported by this server: it must be 0 (or absent), got -2."},
      {false, R"("repetition_penalty": 1.1)", "repetition_penalty",
       "'repetition_penalty' is not supported by this server: it must be 1 (or absent), got 1.1."},
      {false, R"("min_p": 0.05)", "min_p",
       "'min_p' is not supported by this server: it must be 0 (or absent), got 0.05."},
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
       "'prompt' must be a string or a list of token ids, got [1,2.5]."},
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
  EXPECT_EQ(ok(R"("best_of": 1.0, "n": 1)").max_tokens, 256);
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

}  // namespace
}  // namespace genbridge::serve
