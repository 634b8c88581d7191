// Chunked prefill (EngineOptions::max_num_batched_tokens): prompts fed in chunks of 1, 7, 128 and 512 tokens per
// step, beside running decodes, give every architecture's tokens and logits of whole-prompt prefill bit for bit;
// prompt lengths cross page boundaries (128 tokens per page). The step's token budget is kept.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

using harness::RunConfig;

struct Case {
  std::string preset;
  int64_t max_batch, budget;
};

class ChunkedPrefill : public ::testing::TestWithParam<Case> {};

std::vector<Request> requests(int64_t vocab) {
  std::vector<Request> reqs;
  const int64_t lens[] = {1, 130, 300, 7, 513, 128};
  for (int64_t i = 0; i < 6; ++i) reqs.push_back(harness::request_of(i, lens[i], 3 + static_cast<int>(i % 3), vocab));
  return reqs;
}

TEST_P(ChunkedPrefill, tokens_and_logits_equal_whole_prompt_prefill) {
  const Case k = GetParam();
  const int64_t vocab = harness::checkpoint(k.preset).config().vocab_size;
  const RunConfig whole{.preset = k.preset, .max_batch = k.max_batch, .pool_pages = 64};
  RunConfig chunked = whole;
  chunked.max_num_batched_tokens = k.budget;
  const std::vector<RequestResult> want = harness::run_engine(whole, requests(vocab));
  const std::vector<RequestResult> got = harness::run_engine(chunked, requests(vocab));
  harness::expect_same_results(got, want);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* preset : {"tiny", "tiny-gemma", "tiny-dsa", "tiny-dsv3-noq", "tiny-qwen35", "tiny-dsv4"}) {
    // Chunks of 1 (one request at a time, budget 1), 7, 128 and 512 tokens beside up to 4 decodes.
    out.push_back({preset, 1, 1});
    for (int64_t chunk : {7, 128, 512}) out.push_back({preset, 4, chunk + 4});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Presets, ChunkedPrefill, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = fmt::format("{}_batch{}_budget{}", info.param.preset, info.param.max_batch, info.param.budget);
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
});

// The budget bounds every step: with 4 running decodes and a budget of 11, a 300-token prompt is prefilled 7
// tokens a step while the others decode; metrics count every prompt token once.
TEST(ChunkedPrefillSteps, a_long_prompt_is_prefilled_over_several_steps_while_the_others_decode) {
  const int64_t vocab = harness::checkpoint("tiny").config().vocab_size;
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  auto dev = runtime::DeviceOperator::create({});
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(ck.config())), 64, 8);
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  LocalExecutor ex(**runner);
  Engine eng(ex, *pool, {.max_batch = 8, .max_num_batched_tokens = 11});
  for (int64_t i = 0; i < 4; ++i) ASSERT_TRUE(eng.submit(harness::request_of(i, 3, 200, vocab)).ok());
  ASSERT_TRUE(eng.step().ok());  // the four short prompts: 12 tokens > 11, so three of them, then the fourth
  ASSERT_TRUE(eng.step().ok());
  ASSERT_TRUE(eng.submit(harness::request_of(9, 300, 2, vocab)).ok());
  const int64_t before = eng.metrics().prefill_tokens;
  int steps = 0;
  while (eng.metrics().prefill_tokens - before < 300) {
    ASSERT_TRUE(eng.step().ok());
    ++steps;
    ASSERT_LE(eng.metrics().prefill_tokens - before, 7 * steps);  // 11 - 4 decodes
  }
  EXPECT_EQ(steps, (300 + 6) / 7);
  EXPECT_EQ(eng.metrics().prefill_tokens, 4 * 3 + 300);
}

}  // namespace
}  // namespace genbridge::engine
