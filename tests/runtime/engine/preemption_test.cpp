// Preemption (EngineOptions::preemption = kRecompute): requests take KV pages as they fill them, and when the pool
// runs out the newest running request is preempted and later fed its tokens again. Every architecture's tokens,
// logits and routing choices equal those of a pool that holds every request at once (whole prompts and chunked
// prefill; Qwen3.5's Gated DeltaNet state refed prompt first, then one generated token per step); preemptions
// happen in every case (the test cannot pass without them); a pool sized for a third of the requests at full
// length runs more of them at once than reservation does; a preempted request resumes before a newer one; a
// request that can never fit is still refused with the arithmetic.
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
  int64_t budget;  // max_num_batched_tokens (0: whole prompts)
};

class Preempt : public ::testing::TestWithParam<Case> {};

// Six requests of 2 or 3 pages (128 tokens each) at full length: 15 pages in all.
std::vector<Request> requests(int64_t vocab) {
  const int64_t lens[] = {100, 200, 30, 130, 250, 60};
  const int max_new[] = {150, 100, 200, 120, 90, 180};
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 6; ++i) reqs.push_back(harness::request_of(i, lens[i], max_new[i], vocab));
  return reqs;
}

void expect_same_choices(const RequestChoices& got, const RequestChoices& want, size_t r) {
  ASSERT_EQ(got.records.size(), want.records.size()) << "request " << r;
  for (size_t i = 0; i < want.records.size(); ++i) {
    const ChoiceRecord &g = got.records[i], &w = want.records[i];
    EXPECT_TRUE(g.step == w.step && g.position == w.position && g.layer == w.layer &&
                g.num_experts == w.num_experts && g.num_index == w.num_index)
        << "request " << r << ", record " << i;
  }
  EXPECT_EQ(got.expert_ids, want.expert_ids) << "request " << r;
  EXPECT_EQ(got.expert_weights, want.expert_weights) << "request " << r;
  EXPECT_EQ(got.index_positions, want.index_positions) << "request " << r;
}

TEST_P(Preempt, tokens_logits_and_choices_equal_a_pool_that_holds_every_request) {
  const Case k = GetParam();
  const int64_t vocab = harness::checkpoint(k.preset).config().vocab_size;
  const RunConfig roomy{.preset = k.preset,
                        .max_batch = 8,
                        .pool_pages = 64,
                        .record_choices = true,
                        .max_num_batched_tokens = k.budget};
  RunConfig tight = roomy;
  tight.pool_pages = 5;
  tight.preemption = Preemption::kRecompute;
  const std::vector<RequestResult> want = harness::run_engine(roomy, requests(vocab));
  harness::RunTrace trace;
  const std::vector<RequestResult> got = harness::run_engine(tight, requests(vocab), &trace);
  ASSERT_TRUE(trace.status.ok()) << trace.status.to_string();
  EXPECT_GT(trace.metrics.preemptions, 0);
  EXPECT_GT(trace.metrics.recomputed_tokens, 0);
  EXPECT_LE(trace.max_pages_in_use, 5);
  harness::expect_same_results(got, want);
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) expect_same_choices(got[r].choices, want[r].choices, r);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* preset : {"tiny", "tiny-gemma", "tiny-dsa", "tiny-dsv3-noq", "tiny-qwen35", "tiny-dsv4"}) {
    for (int64_t budget : {0, 200}) out.push_back({preset, budget});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Presets, Preempt, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string name = fmt::format("{}_budget{}", info.param.preset, info.param.budget);
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
});

TEST(Preemption, runs_more_requests_at_once_than_reservation_in_the_same_pool) {
  const int64_t vocab = harness::checkpoint("tiny").config().vocab_size;
  RunConfig reserve{.preset = "tiny", .max_batch = 8, .pool_pages = 5};
  RunConfig recompute = reserve;
  recompute.preemption = Preemption::kRecompute;
  harness::RunTrace rt, ct;
  const std::vector<RequestResult> a = harness::run_engine(reserve, requests(vocab), &rt);
  const std::vector<RequestResult> b = harness::run_engine(recompute, requests(vocab), &ct);
  ASSERT_TRUE(rt.status.ok() && ct.status.ok());
  EXPECT_EQ(rt.metrics.preemptions, 0);
  EXPECT_LE(rt.max_running, 2);  // 2 + 3 pages reserved fill the 5
  EXPECT_GE(ct.max_running, 3);  // requests 0, 1 and 2 start with 1 + 2 + 1 pages
  for (size_t r = 0; r < a.size(); ++r) EXPECT_EQ(a[r].tokens, b[r].tokens) << "request " << r;
}

// A (started first) and B fill a 3-page pool; B, the newest, is preempted when both need their second page. C,
// submitted after that, starts only after B has resumed (B waits at the front of the queue).
TEST(Preemption, a_preempted_request_resumes_before_a_newer_one) {
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  const int64_t vocab = ck.config().vocab_size;
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(ck.config())), 3, 4);
  ASSERT_TRUE(pool.ok());
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  ASSERT_TRUE(runner.ok());
  LocalExecutor ex(**runner);
  Engine eng(ex, *pool, {.max_batch = 4, .preemption = Preemption::kRecompute});
  std::vector<int64_t> order;  // the request of every token, in the order drawn
  std::vector<RequestResult> done;
  eng.set_listener({.on_token = [&](int64_t id, int32_t, const TokenLogprobs*) { order.push_back(id); },
                    .on_finish = [&](RequestResult&& r) { done.push_back(std::move(r)); }});
  ASSERT_TRUE(eng.submit(harness::request_of(0, 100, 200, vocab)).ok());
  ASSERT_TRUE(eng.submit(harness::request_of(1, 100, 200, vocab)).ok());
  while (eng.metrics().preemptions == 0) {
    ASSERT_TRUE(eng.has_work());
    ASSERT_TRUE(eng.step().ok());
  }
  EXPECT_EQ(eng.num_running(), 1);
  EXPECT_EQ(eng.num_waiting(), 1);
  const size_t preempted_at = order.size();
  ASSERT_TRUE(eng.submit(harness::request_of(2, 10, 5, vocab)).ok());
  while (eng.has_work()) ASSERT_TRUE(eng.step().ok());
  ASSERT_EQ(done.size(), 3u);
  for (const RequestResult& r : done) EXPECT_EQ(r.reason, FinishReason::kLength) << r.id << ": " << r.message;
  const auto first_of = [&](int64_t id) {
    return std::find(order.begin() + static_cast<std::ptrdiff_t>(preempted_at), order.end(), id) - order.begin();
  };
  EXPECT_LT(first_of(1), first_of(2));
  EXPECT_EQ(pool->used_pages(), 0);
  EXPECT_EQ(eng.metrics().preemptions, 1);
}

TEST(Preemption, a_request_that_can_never_fit_is_still_refused_with_the_arithmetic) {
  const int64_t vocab = harness::checkpoint("tiny").config().vocab_size;
  RunConfig rc{.preset = "tiny", .max_batch = 4, .pool_pages = 3, .preemption = Preemption::kRecompute};
  std::vector<Request> reqs;
  reqs.push_back(harness::request_of(0, 300, 200, vocab));
  reqs.push_back(harness::request_of(1, 20, 10, vocab));
  const std::vector<RequestResult> got = harness::run_engine(rc, std::move(reqs));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].reason, FinishReason::kRefused);
  EXPECT_EQ(got[0].message,
            "request 0 needs 4 KV pages (300 prompt + 200 new tokens at 128 tokens per page) but the pool has only 3 "
            "pages; raise --kv-memory-mb or lower --max-new-tokens");
  EXPECT_EQ(got[1].reason, FinishReason::kLength);
  EXPECT_EQ(got[1].tokens.size(), 10u);
}

}  // namespace
}  // namespace genbridge::engine
