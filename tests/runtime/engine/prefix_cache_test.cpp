// Automatic prefix caching (EngineOptions::prefix_caching): requests that share leading tokens with earlier ones
// (a common system prompt; a chat whose every turn resends the history with the reply) start on the cached KV
// pages and give the tokens and logits of a cold run bit for bit, for every architecture the engine caches, with
// whole prompts and with chunked prefill, in a pool so small that cached pages are evicted, and with preemption.
// Models with per-sequence state (Qwen3.5, DeepSeek-V4) are not cached: the engine leaves the cache off and their
// tokens are those of a run without it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

struct Options {
  std::string preset = "tiny";
  int64_t pool_pages = 64;
  int64_t budget = 0;  // max_num_batched_tokens
  Preemption preemption = Preemption::kOff;
  bool prefix_caching = false;
};

struct Outcome {
  std::vector<std::vector<RequestResult>> turns;  // each turn's results
  EngineMetrics metrics;
  bool cache_on = false;  // the pool's prefix cache
};

// Three turns through one engine (its cache lives across them). Turn 0: four prompts sharing a 300-token prefix
// (one of them is the prefix itself plus one token). Turn 1: each turn-0 request's prompt + its reply + 50 new
// tokens (a chat resending its history), and a repeat of a turn-0 prompt. Turn 2: turn 1's again, grown the same
// way.
Outcome run_turns(const Options& o) {
  const model::Checkpoint& ck = harness::checkpoint(o.preset);
  const int64_t vocab = ck.config().vocab_size;
  auto dev = runtime::DeviceOperator::create({});
  EXPECT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(ck.config())), o.pool_pages, 8);
  EXPECT_TRUE(pool.ok());
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  LocalExecutor ex(**runner);
  Engine eng(ex, *pool,
             {.max_batch = 8,
              .max_num_batched_tokens = o.budget,
              .record_logits = true,
              .preemption = o.preemption,
              .prefix_caching = o.prefix_caching});
  Outcome out;
  out.cache_on = pool->prefix_cache_enabled();
  const std::vector<int32_t> shared = harness::prompt_of(300, 77, vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<int32_t> p = shared;
    const std::vector<int32_t> own = harness::prompt_of(i == 0 ? 1 : 20 + 60 * i, 200 + static_cast<uint64_t>(i), vocab);
    p.insert(p.end(), own.begin(), own.end());
    prompts.push_back(p);
  }
  int64_t next_id = 0;
  for (int turn = 0; turn < 3; ++turn) {
    std::vector<int64_t> ids;
    for (const auto& p : prompts) {
      Request q;
      q.id = next_id++;
      q.prompt = p;
      q.max_new_tokens = 40;
      EXPECT_TRUE(eng.submit(std::move(q)).ok());
    }
    const size_t first = eng.results().size() - prompts.size();
    EXPECT_TRUE(eng.run_to_completion().ok());
    out.turns.emplace_back(eng.results().begin() + static_cast<std::ptrdiff_t>(first), eng.results().end());
    // The next turn: every prompt with its reply and 50 more tokens; a repeat of the first prompt.
    std::vector<std::vector<int32_t>> next;
    for (size_t i = 0; i < prompts.size() && i < 4; ++i) {
      std::vector<int32_t> p = prompts[i];
      const std::vector<int32_t>& reply = out.turns.back()[i].tokens;
      p.insert(p.end(), reply.begin(), reply.end());
      const std::vector<int32_t> more = harness::prompt_of(50, 300 + static_cast<uint64_t>(turn * 8 + i), vocab);
      p.insert(p.end(), more.begin(), more.end());
      next.push_back(p);
    }
    next.push_back(prompts[1]);
    prompts = next;
  }
  EXPECT_EQ(pool->used_pages(), 0) << "finished requests must return their pages";
  out.metrics = eng.metrics();
  return out;
}

void expect_same(const Outcome& got, const Outcome& want) {
  ASSERT_EQ(got.turns.size(), want.turns.size());
  for (size_t t = 0; t < want.turns.size(); ++t) {
    harness::expect_same_results(got.turns[t], want.turns[t], "turn " + std::to_string(t) + ", ");
  }
}

struct Case {
  std::string preset;
  int64_t budget;
};
class PrefixCache : public ::testing::TestWithParam<Case> {};

TEST_P(PrefixCache, hits_give_the_tokens_and_logits_of_a_cold_run) {
  const Case k = GetParam();
  const Outcome cold = run_turns({.preset = k.preset, .budget = k.budget});
  const Outcome warm = run_turns({.preset = k.preset, .budget = k.budget, .prefix_caching = true});
  EXPECT_TRUE(warm.cache_on);
  expect_same(warm, cold);
  // Turn 0 alone shares 2 pages with the first request for 3 requests; the later turns find their whole history.
  EXPECT_GE(warm.metrics.prefix_cache_hits, 3 * 256);
  EXPECT_GT(warm.metrics.prefix_cache_hits, warm.metrics.prefix_cache_queries / 2);
  EXPECT_LT(warm.metrics.prefill_tokens, cold.metrics.prefill_tokens / 2);
  EXPECT_EQ(cold.metrics.prefix_cache_queries, 0);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* preset : {"tiny", "tiny-gemma", "tiny-dsa", "tiny-dsv3-noq"}) {
    for (int64_t budget : {0, 100}) out.push_back({preset, budget});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Presets, PrefixCache, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = fmt::format("{}_budget{}", info.param.preset, info.param.budget);
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
});

// A pool of 8 pages cannot keep every history: cached pages are evicted (and the tokens stay those of a cold run),
// with reservation and with preemption.
TEST(PrefixCacheEviction, a_small_pool_evicts_and_keeps_every_bit) {
  const Outcome cold = run_turns({});
  for (const Preemption p : {Preemption::kOff, Preemption::kRecompute}) {
    const Outcome warm = run_turns({.pool_pages = 8, .preemption = p, .prefix_caching = true});
    expect_same(warm, cold);
    EXPECT_GT(warm.metrics.prefix_cache_evictions, 0) << preemption_name(p);
    EXPECT_GT(warm.metrics.prefix_cache_hits, 0) << preemption_name(p);
  }
}

// Qwen3.5 and DeepSeek-V4 keep per-sequence state: the engine does not cache them (nothing is looked up) and their
// tokens are a cold run's.
TEST(PrefixCacheState, models_with_per_sequence_state_are_not_cached) {
  for (const char* preset : {"tiny-qwen35", "tiny-dsv4"}) {
    const Outcome cold = run_turns({.preset = preset});
    const Outcome warm = run_turns({.preset = preset, .prefix_caching = true});
    EXPECT_FALSE(warm.cache_on) << preset;
    EXPECT_EQ(warm.metrics.prefix_cache_queries, 0) << preset;
    EXPECT_EQ(warm.metrics.prefill_tokens, cold.metrics.prefill_tokens) << preset;
    expect_same(warm, cold);
  }
}

}  // namespace
}  // namespace genbridge::engine
