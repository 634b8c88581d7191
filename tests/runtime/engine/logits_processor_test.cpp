#include "runtime/engine/logits_processor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace genbridge::engine {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> applied(const LogitsProcessor& p, std::vector<float> logits) {
  p.apply(logits);
  return logits;
}

TEST(LogitsProcessor, defaults_change_nothing_and_are_inactive) {
  LogitsProcessor p(SamplingParams{}, std::vector<int32_t>{1, 2}, std::vector<int32_t>{3});
  EXPECT_FALSE(p.active());
  const std::vector<float> l{0.5f, -1.f, 2.f, 7.f};
  EXPECT_EQ(applied(p, l), l);
}

// vLLM's penalties: repetition over prompt and output tokens (positive logits divided, negative multiplied),
// frequency x count and presence once over the output tokens only.
TEST(LogitsProcessor, penalties_follow_vllm) {
  SamplingParams s;
  s.repetition_penalty = 2.f;
  s.frequency_penalty = 0.5f;
  s.presence_penalty = 0.25f;
  LogitsProcessor p(s, std::vector<int32_t>{0, 1, 1}, {});
  EXPECT_TRUE(p.active());
  p.observe(1);
  p.observe(2);
  p.observe(2);
  const std::vector<float> got = applied(p, {4.f, -4.f, 6.f, 8.f});
  EXPECT_EQ(got[0], 2.f);                        // prompt only: 4 / 2
  EXPECT_EQ(got[1], -4.f * 2.f - 0.5f - 0.25f);  // prompt and output once: -4 x 2, then the output penalties
  EXPECT_EQ(got[2], 6.f / 2.f - 1.f - 0.25f);    // output twice: 6 / 2 - 0.5 x 2 - 0.25
  EXPECT_EQ(got[3], 8.f);                        // neither
}

TEST(LogitsProcessor, frequency_and_presence_ignore_the_prompt) {
  SamplingParams s;
  s.frequency_penalty = 1.f;
  s.presence_penalty = -1.f;  // negative: encourages repetition
  LogitsProcessor p(s, std::vector<int32_t>{0}, {});
  p.observe(1);
  EXPECT_EQ(applied(p, {1.f, 1.f, 1.f}), (std::vector<float>{1.f, 1.f, 1.f}));
}

TEST(LogitsProcessor, min_tokens_masks_the_stop_tokens_until_reached) {
  SamplingParams s;
  s.min_tokens = 2;
  LogitsProcessor p(s, std::vector<int32_t>{}, std::vector<int32_t>{1, 3});
  EXPECT_TRUE(p.active());
  EXPECT_EQ(applied(p, {0.f, 5.f, 1.f, 2.f}), (std::vector<float>{0.f, -kInf, 1.f, -kInf}));
  p.observe(0);
  EXPECT_TRUE(p.active());
  p.observe(2);
  EXPECT_FALSE(p.active());
  EXPECT_EQ(applied(p, {0.f, 5.f, 1.f, 2.f}), (std::vector<float>{0.f, 5.f, 1.f, 2.f}));
}

TEST(LogitsProcessor, allowed_token_ids_mask_every_other_token_and_bias_adds) {
  SamplingParams s;
  s.allowed_token_ids = {2, 0, 99};  // 99: beyond this vocabulary, skipped
  s.logit_bias = {{2, -3.f}, {1, 100.f}};
  LogitsProcessor p(s, std::vector<int32_t>{}, {});
  EXPECT_EQ(applied(p, {0.5f, 1.f, 2.f}), (std::vector<float>{0.5f, -kInf, -1.f}));
}

TEST(LogitsProcessor, a_masked_token_stays_masked_under_every_penalty) {
  SamplingParams s;
  s.allowed_token_ids = {0};
  s.repetition_penalty = 0.5f;
  s.frequency_penalty = -2.f;
  s.presence_penalty = -2.f;
  s.logit_bias = {{1, 100.f}};
  LogitsProcessor p(s, std::vector<int32_t>{1}, {});
  p.observe(1);
  EXPECT_EQ(applied(p, {0.5f, 1.f})[1], -kInf);
}

}  // namespace
}  // namespace genbridge::engine
