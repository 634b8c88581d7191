// engine::TokenConstraint: a request with a constraint draws only the tokens it allows (greedy: the best allowed
// one by the raw logits, which stay what is recorded and what logprobs report), is told how many tokens remain
// and each token drawn; 0 allowed ends it as stopped, an error ends it alone; requests without one are unchanged.
// With the logits processing and teacher forcing (Request::forced): forced tokens bypass the constraint and do
// not count against its budget; its mask applies to the processed logits; when the processing masks every
// token it allows (min_tokens holding back the only token a complete output may take), the constraint wins.
#include "runtime/engine/token_constraint.h"

#include <gtest/gtest.h>

#include <limits>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

// Allows the tokens whose id is a multiple of `every`; ends (0 allowed) or fails at step `stop_at` / `fail_at`.
class EveryNth final : public TokenConstraint {
 public:
  explicit EveryNth(int every, int stop_at = -1, int fail_at = -1)
      : every_(every), stop_at_(stop_at), fail_at_(fail_at) {}
  Result<int64_t> allowed_tokens(std::span<uint32_t> allowed, int64_t remaining) override {
    remaining_.push_back(remaining);
    const int step = static_cast<int>(remaining_.size()) - 1;
    if (step == fail_at_) return invalid_argument("the test's constraint failed");
    std::fill(allowed.begin(), allowed.end(), 0);
    if (step == stop_at_) return 0;
    int64_t n = 0;
    for (size_t i = 0; i < allowed.size() * 32; i += static_cast<size_t>(every_)) {
      allowed[i / 32] |= uint32_t{1} << (i % 32);
      ++n;
    }
    return n;
  }
  Status accept(int32_t token) override {
    accepted_.push_back(token);
    return ok_status();
  }
  std::vector<int64_t> remaining_;
  std::vector<int32_t> accepted_;

 private:
  int every_, stop_at_, fail_at_;
};

TEST(TokenConstraint, greedy_draws_the_best_allowed_token_by_the_raw_logits) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto c = std::make_shared<EveryNth>(7);
  Request q = request_of(1, 6, 8, vocab);
  q.constraint = c;
  q.logprobs = 0;
  const auto res = run_engine({}, {q, request_of(2, 6, 8, vocab)});
  ASSERT_EQ(res[0].tokens.size(), 8u);
  EXPECT_EQ(c->accepted_, res[0].tokens);
  EXPECT_EQ(c->remaining_, (std::vector<int64_t>{8, 7, 6, 5, 4, 3, 2, 1}));
  for (size_t s = 0; s < res[0].tokens.size(); ++s) {
    const float* row = res[0].logits.data() + s * static_cast<size_t>(vocab);
    int32_t best = 0;
    for (int32_t i = 0; i < vocab; i += 7) {
      if (row[i] > row[best]) best = i;
    }
    EXPECT_EQ(res[0].tokens[s], best) << "step " << s;
    // logprobs are the model's own: the raw row's log-softmax, not the masked one's.
    double m = row[0], sum = 0;
    for (int32_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(row[i]));
    for (int32_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - m);
    EXPECT_NEAR(res[0].logprobs[s].sampled.logprob, row[best] - m - std::log(sum), 1e-9);
  }
  // The unconstrained request beside it gets its tokens as if alone.
  EXPECT_EQ(res[1].tokens, run_engine({}, {request_of(2, 6, 8, vocab)})[0].tokens);
}

TEST(TokenConstraint, sampled_tokens_are_allowed_ones) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(1, 5, 24, vocab);
  q.sampling = {.temperature = 1.5f, .top_k = 0, .top_p = 1.f, .seed = 11};
  q.constraint = std::make_shared<EveryNth>(5);
  const auto res = run_engine({.record_logits = false}, {q});
  ASSERT_EQ(res[0].tokens.size(), 24u);
  for (int32_t t : res[0].tokens) EXPECT_EQ(t % 5, 0) << t;
}

TEST(TokenConstraint, no_token_allowed_ends_the_request_as_stopped) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(1, 4, 10, vocab);
  q.constraint = std::make_shared<EveryNth>(3, /*stop_at=*/3);
  const auto res = run_engine({.record_logits = false}, {q});
  EXPECT_EQ(res[0].reason, FinishReason::kStop);
  EXPECT_EQ(res[0].tokens.size(), 3u);
}

TEST(TokenConstraint, an_error_ends_that_request_alone) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(1, 4, 10, vocab);
  q.constraint = std::make_shared<EveryNth>(3, -1, /*fail_at=*/2);
  const auto res = run_engine({.record_logits = false}, {q, request_of(2, 4, 10, vocab)});
  EXPECT_EQ(res[0].reason, FinishReason::kError);
  EXPECT_EQ(res[0].message, "request 1, step 2: the test's constraint failed");
  EXPECT_EQ(res[0].tokens.size(), 2u);
  EXPECT_EQ(res[1].reason, FinishReason::kLength);
  EXPECT_EQ(res[1].tokens.size(), 10u);
}

// Allows exactly the tokens in `ids` at every step (a finished output: only its stop token).
class Only final : public TokenConstraint {
 public:
  explicit Only(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  Result<int64_t> allowed_tokens(std::span<uint32_t> allowed, int64_t) override {
    std::fill(allowed.begin(), allowed.end(), 0);
    for (int32_t i : ids_) allowed[static_cast<size_t>(i) / 32] |= uint32_t{1} << (i % 32);
    return static_cast<int64_t>(ids_.size());
  }
  Status accept(int32_t token) override {
    accepted_.push_back(token);
    return ok_status();
  }
  std::vector<int32_t> accepted_;

 private:
  std::vector<int32_t> ids_;
};

// Forced tokens (echo's prompt) are taken as they are: the constraint sees neither them nor their steps, its
// budget counts the tokens left to draw, and its draws are those of the same request without forcing.
TEST(TokenConstraint, forced_tokens_bypass_the_constraint_and_its_budget) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto plain_c = std::make_shared<EveryNth>(7);
  Request plain = request_of(1, 6, 5, vocab);
  plain.sampling = {.temperature = 0.9f, .seed = 3};
  plain.constraint = plain_c;
  auto fed_c = std::make_shared<EveryNth>(7);
  Request fed = plain;
  fed.id = 2;
  fed.prompt = {plain.prompt[0]};
  fed.forced.assign(plain.prompt.begin() + 1, plain.prompt.end());  // 5 tokens the constraint would not allow
  fed.max_new_tokens = 5 + 5;
  fed.constraint = fed_c;
  const auto res = run_engine({.record_logits = false}, {plain, fed});
  ASSERT_EQ(res[1].tokens.size(), 10u);
  EXPECT_EQ(std::vector<int32_t>(res[1].tokens.begin(), res[1].tokens.begin() + 5), fed.forced);
  EXPECT_EQ(std::vector<int32_t>(res[1].tokens.begin() + 5, res[1].tokens.end()), res[0].tokens);
  EXPECT_EQ(fed_c->accepted_, res[0].tokens);
  EXPECT_EQ(fed_c->remaining_, (std::vector<int64_t>{5, 4, 3, 2, 1}));
  EXPECT_EQ(fed_c->remaining_, plain_c->remaining_);
}

// The mask applies to the processed logits: logit_bias picks among the allowed tokens.
TEST(TokenConstraint, the_mask_applies_after_the_logits_processing) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(1, 5, 3, vocab);
  q.sampling.logit_bias = {{35, 100.f}, {36, 100.f}};  // 36 is not allowed
  q.constraint = std::make_shared<EveryNth>(7);
  const auto res = run_engine({.record_logits = false}, {q});
  EXPECT_EQ(res[0].tokens, (std::vector<int32_t>{35, 35, 35}));
}

// A constraint that allows only a stop token (a complete output) and min_tokens that holds the stop tokens back:
// the constraint wins (the output must stay valid and end within max_new_tokens), the request stops at once.
// While the constraint allows other tokens too, min_tokens holds: they are drawn instead of the stop token.
TEST(TokenConstraint, a_constraint_that_must_stop_wins_over_min_tokens) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(1, 5, 6, vocab);
  q.stop_tokens = {10};
  q.sampling.min_tokens = 4;
  auto only_stop = std::make_shared<Only>(std::vector<int32_t>{10});
  q.constraint = only_stop;
  auto got = run_engine({.record_logits = false}, {q})[0];
  EXPECT_EQ(got.tokens, std::vector<int32_t>{10});
  EXPECT_EQ(got.reason, FinishReason::kStop);
  EXPECT_EQ(only_stop->accepted_, std::vector<int32_t>{10});

  Request r = request_of(2, 5, 6, vocab);
  r.stop_tokens = {10};
  r.sampling.min_tokens = 4;
  r.sampling.logit_bias = {{10, 100.f}};  // the stop token would win every draw it may take part in
  r.constraint = std::make_shared<Only>(std::vector<int32_t>{10, 11});
  got = run_engine({.record_logits = false}, {r})[0];
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{11, 11, 11, 11, 10}));
  EXPECT_EQ(got.reason, FinishReason::kStop);
}

TEST(TokenConstraint, masked_logits_are_minus_infinity_elsewhere_and_unchanged_where_allowed) {
  std::vector<float> logits(70), out(70);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i) - 30.f;
  std::vector<uint32_t> allowed = {0xFFFFFFFFu, 0u, 0b101u};
  apply_token_mask(logits, allowed, out);
  for (size_t i = 0; i < 70; ++i) {
    const bool on = i < 32 || i == 64 || i == 66;
    EXPECT_EQ(out[i], on ? logits[i] : -std::numeric_limits<float>::infinity()) << i;
  }
}

TEST(TokenConstraint, any_allowed_drawable_reads_the_allowed_tokens_only) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> logits(70, -kInf);
  logits[3] = 1.f;
  EXPECT_FALSE(any_allowed_drawable(logits, std::vector<uint32_t>{0b10u, 0u, 0b1u}));
  EXPECT_TRUE(any_allowed_drawable(logits, std::vector<uint32_t>{0b1010u, 0u, 0u}));
  logits[69] = -1e30f;
  EXPECT_TRUE(any_allowed_drawable(logits, std::vector<uint32_t>{0u, 0u, 1u << 5}));
  EXPECT_FALSE(any_allowed_drawable(logits, std::vector<uint32_t>{0u, 0u, 0u}));
}

}  // namespace
}  // namespace genbridge::engine
