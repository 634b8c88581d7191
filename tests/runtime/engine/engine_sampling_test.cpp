// The engine's per-request sampling controls (runtime/engine/logits_processor.h) and teacher forcing
// (Request::forced): the processing runs in vLLM's order, min_tokens holds the stop tokens back, and a prompt
// fed as forced tokens gives the logits of its prefill and leaves the seeded draws after it unchanged.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

// The prompt fed one token per step (forced) gives bit for bit the logits and the seeded tokens of its
// prefill; the forced tokens are reported as generated ones, with their logprobs, and a stop token among them
// does not end the request.
TEST(EngineSampling, forced_prompt_tokens_give_the_prefill_logits_and_the_same_draws) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  const std::vector<int32_t> prompt = prompt_of(6, 77, vocab);
  Request whole = request_of(0, 6, 4, vocab);
  whole.prompt = prompt;
  whole.sampling = {.temperature = 0.8f, .seed = 5};
  whole.logprobs = 2;
  Request fed = whole;
  fed.id = 1;
  fed.prompt = {prompt[0]};
  fed.forced.assign(prompt.begin() + 1, prompt.end());
  fed.max_new_tokens = 5 + 4;
  fed.stop_tokens = {prompt[2]};
  const auto results = run_engine({}, {whole, fed});
  const RequestResult &a = results[0], &b = results[1];
  ASSERT_EQ(a.tokens.size(), 4u);
  ASSERT_EQ(b.tokens.size(), 9u);
  EXPECT_EQ(std::vector<int32_t>(b.tokens.begin(), b.tokens.begin() + 5), fed.forced);
  EXPECT_EQ(std::vector<int32_t>(b.tokens.begin() + 5, b.tokens.end()), a.tokens);
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data() + 5 * vocab, a.logits.size() * sizeof(float)))
      << "the logits after the forced prompt are the prefill's, bit for bit";
  ASSERT_EQ(b.logprobs.size(), 9u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(b.logprobs[i].sampled.token, fed.forced[i]);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(b.logprobs[5 + i].sampled.logprob, a.logprobs[i].sampled.logprob);
}

// logit_bias before the penalties (vLLM's order): with biases 100 / 75 / 50 on three allowed tokens and a
// repetition penalty of 1000, each biased logit drops below the next once generated, so greedy decoding
// walks a, b, c and then returns to a (the penalty divides once, however often a token repeats).
TEST(EngineSampling, logit_bias_then_repetition_penalty_over_allowed_tokens) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request r = request_of(0, 5, 5, vocab);
  r.sampling.allowed_token_ids = {30, 40, 50};
  r.sampling.logit_bias = {{40, 100.f}, {30, 75.f}, {50, 50.f}};
  r.sampling.repetition_penalty = 1000.f;
  r.prompt = {1, 2, 3};
  const auto results = run_engine({.record_logits = false}, {r});
  EXPECT_EQ(results[0].tokens, (std::vector<int32_t>{40, 30, 50, 40, 40}));
}

// min_tokens: the stop tokens cannot be drawn before that many tokens were generated.
TEST(EngineSampling, min_tokens_holds_the_stop_tokens_back) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request free = request_of(0, 5, 1, vocab);
  const int32_t first = run_engine({.record_logits = false}, {free})[0].tokens.at(0);
  Request r = request_of(0, 5, 6, vocab);
  r.stop_tokens = {first};
  r.sampling.min_tokens = 3;
  const auto got = run_engine({.record_logits = false}, {r})[0];
  ASSERT_GE(got.tokens.size(), 4u) << "the stop token can end the request only from its 4th token";
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(got.tokens[i], first);
  Request s = request_of(0, 5, 6, vocab);
  s.stop_tokens = {first};
  const auto stopped = run_engine({.record_logits = false}, {s})[0];
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>{first});
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
}

TEST(EngineSampling, token_ids_outside_the_vocabulary_are_refused_at_submit) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  const auto dev = runtime::DeviceOperator::create({}).value();
  const model::ModelConfig& c = checkpoint("tiny").config();
  auto pool = runtime::KvPagePool::create(dev.kv_page_geometry(model::kv_model_shape(c)), 8).value();
  auto runner = model::ModelRunner::create(checkpoint("tiny"), dev, pool).value();
  LocalExecutor executor(*runner);
  Engine eng(executor, pool, {});
  Request r = request_of(0, 3, 2, vocab);
  r.sampling.logit_bias = {{static_cast<int32_t>(vocab), 1.f}};
  EXPECT_EQ(eng.submit(r).message(),
            fmt::format("request 0: logit_bias token {} is outside the vocabulary [0, {})", vocab, vocab));
  r = request_of(0, 3, 2, vocab);
  r.sampling.allowed_token_ids = {-1};
  EXPECT_EQ(eng.submit(r).message(),
            fmt::format("request 0: allowed_token_ids token -1 is outside the vocabulary [0, {})", vocab));
  r = request_of(0, 3, 2, vocab);
  r.forced = {1, 2, 3};
  EXPECT_EQ(eng.submit(r).message(), "request 0: 3 forced tokens but max_new_tokens is 2");
}

}  // namespace
}  // namespace genbridge::engine
