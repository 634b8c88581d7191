// Generation past KV page boundaries. A page holds 128 tokens on every generation; admission
// reserves pages for prompt + every token a request may generate, so a sequence usually owns more pages
// than its current length fills. Each case decodes across 1, 2 or 3 page boundaries and is checked against
// the independent fp64 reference forward (teacher-forced on the engine's tokens) and against the engine
// itself run another way (each request alone vs. in a mixed batch, a roomy vs. a tight pool). Runs
// unchanged in every target build: "quantized" is the build's own representation (int8 + fp16 scale on the
// A2/A3 build, fp8 + packed fp32 scale on the A5 build).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_harness.h"
#include "runtime/engine/engine.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

constexpr int64_t kPage = 128;

int64_t vocab() { return checkpoint("tiny").config().vocab_size; }

// Quantized KV adds the representation's rounding to every cached K/V element (int8: half a step of
// amax/127; fp8 e4m3fn: 2^-4 relative). Through 4 layers this moves the logits by up to ~5% relative L2 on
// this model where routing is clear (observed, printed; a misread page gives errors of order 1). It also
// moves the router's logits by up to ~0.1 (fp8, observed), so steps whose reference top-k margin is below
// 0.15 may route differently and are skipped; at that margin 52-66% of the steps are compared.
constexpr ReferenceCheck kQuantizedKvCheck{
    .tolerance = 8e-2, .routing_margin = 0.15, .min_compared = 0.4, .greedy = false};
constexpr ReferenceCheck kSampledCheck{.greedy = false};

// Request 0 crosses one boundary (120 + 20 tokens), request 1 two (60 + 220), request 2 three (5 + 390);
// each crosses at a different decode step while the others decode next to it.
std::vector<Request> crossing_requests() {
  return {request_of(0, 120, 20, vocab()), request_of(1, 60, 220, vocab()), request_of(2, 5, 390, vocab())};
}

// Pages each request ends with (prompt + generated tokens fed back) cross the boundaries claimed above.
TEST(PageBoundary, requests_cross_the_claimed_number_of_pages) {
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(dev->contract().kv_page_size, kPage);
  const auto reqs = crossing_requests();
  for (size_t r = 0; r < reqs.size(); ++r) {
    const int64_t first = static_cast<int64_t>(reqs[r].prompt.size());
    const int64_t last = first + reqs[r].max_new_tokens - 1;
    EXPECT_EQ((last - 1) / kPage - (first - 1) / kPage, static_cast<int64_t>(r + 1)) << "request " << r;
  }
}

void expect_complete(const std::vector<RequestResult>& res, const std::vector<Request>& reqs) {
  ASSERT_EQ(res.size(), reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    EXPECT_EQ(res[r].reason, FinishReason::kLength) << "request " << r << ": " << res[r].message;
    EXPECT_EQ(static_cast<int64_t>(res[r].tokens.size()), reqs[r].max_new_tokens) << "request " << r;
  }
}

// Each request run alone in a fresh engine gives the same tokens and logits, bit for bit, as in `batched`.
void expect_equal_to_each_alone(const RunConfig& rc, const std::vector<Request>& reqs,
                                const std::vector<RequestResult>& batched) {
  for (const Request& q : reqs) {
    RunConfig alone = rc;
    alone.max_batch = 1;
    const auto one = run_engine(alone, {q});
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].tokens, batched[q.id].tokens) << "request " << q.id;
    EXPECT_EQ(one[0].logits, batched[q.id].logits) << "request " << q.id;
  }
}

TEST(PageBoundary, greedy_across_1_2_3_pages_matches_fp64_reference) {
  const auto reqs = crossing_requests();
  const auto res = run_engine({}, reqs);
  expect_complete(res, reqs);
  for (size_t r = 0; r < reqs.size(); ++r) {
    compare_with_reference(checkpoint("tiny"), reqs[r].prompt, res[r], kBf16KvCheck,
                           "bf16 KV, request " + std::to_string(r));
  }
}

TEST(PageBoundary, mixed_batch_crossing_at_different_steps_equals_each_request_alone) {
  const auto reqs = crossing_requests();
  const auto res = run_engine({}, reqs);
  expect_complete(res, reqs);
  expect_equal_to_each_alone({}, reqs, res);
}

TEST(PageBoundary, sampled_across_pages_matches_fp64_reference_and_each_request_alone) {
  auto reqs = crossing_requests();
  for (auto& r : reqs) r.sampling = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .seed = 31 + uint64_t(r.id)};
  const auto res = run_engine({}, reqs);
  expect_complete(res, reqs);
  for (size_t r = 0; r < reqs.size(); ++r) {
    compare_with_reference(checkpoint("tiny"), reqs[r].prompt, res[r], kSampledCheck,
                           "sampled, request " + std::to_string(r));
  }
  expect_equal_to_each_alone({}, reqs, res);
}

TEST(PageBoundary, quantized_kv_across_pages_matches_fp64_reference_and_each_request_alone) {
  const RunConfig rc{.kv_cache_dtype = "quantized"};
  const auto reqs = crossing_requests();
  const auto res = run_engine(rc, reqs);
  expect_complete(res, reqs);
  for (size_t r = 0; r < reqs.size(); ++r) {
    compare_with_reference(checkpoint("tiny"), reqs[r].prompt, res[r], kQuantizedKvCheck,
                           "quantized KV, request " + std::to_string(r));
  }
  expect_equal_to_each_alone(rc, reqs, res);
}

// Prompts that end just before, exactly on and just after a page boundary, a prompt that spans three
// pages at prefill, and the two reproductions of the issue: a 1-token prompt generating 200 tokens and a
// 128-token prompt generating 2 (the second token's K/V is the first of a new page).
std::vector<Request> edge_requests() {
  return {request_of(0, 127, 3, vocab()), request_of(1, 128, 3, vocab()), request_of(2, 129, 3, vocab()),
          request_of(3, 128, 1, vocab()), request_of(4, 128, 2, vocab()), request_of(5, 1, 200, vocab()),
          request_of(6, 300, 10, vocab())};
}

TEST(PageBoundary, prompts_of_127_128_129_tokens_match_fp64_reference_and_each_request_alone) {
  for (const std::string kv : {"auto", "quantized"}) {
    const RunConfig rc{.kv_cache_dtype = kv};
    const auto reqs = edge_requests();
    const auto res = run_engine(rc, reqs);
    expect_complete(res, reqs);
    // The short requests have 1-3 steps each: the compared fraction is checked over all of them.
    const ReferenceCheck& check = kv == "auto" ? kBf16KvCheck : kQuantizedKvCheck;
    ReferenceComparison all;
    for (size_t r = 0; r < reqs.size(); ++r) {
      all += compare_steps_with_reference(checkpoint("tiny"), reqs[r].prompt, res[r], check,
                                          kv + " KV, prompt of " + std::to_string(reqs[r].prompt.size()) + " tokens");
    }
    expect_enough_compared(all, check, kv + " KV");
    expect_equal_to_each_alone(rc, reqs, res);
  }
}

// A pool of 4 pages for requests of 3, 3, 2 and 3 pages: they wait for each other and reuse the pages
// the previous ones freed (with stale K/V of another sequence in them), yet every result equals the one
// of a pool where nothing waits.
TEST(PageBoundary, tight_pool_requests_wait_and_reuse_pages_without_changing_results) {
  for (const std::string kv : {"auto", "quantized"}) {
    const std::vector<Request> reqs = {request_of(0, 100, 200, vocab()), request_of(1, 30, 300, vocab()),
                                       request_of(2, 129, 100, vocab()), request_of(3, 5, 260, vocab())};
    RunTrace roomy_trace, tight_trace;
    const auto roomy = run_engine({.kv_cache_dtype = kv, .pool_pages = 64}, reqs, &roomy_trace);
    const auto tight = run_engine({.kv_cache_dtype = kv, .pool_pages = 4}, reqs, &tight_trace);
    ASSERT_TRUE(roomy_trace.status.ok()) << roomy_trace.status.to_string();
    ASSERT_TRUE(tight_trace.status.ok()) << tight_trace.status.to_string();
    EXPECT_EQ(roomy_trace.max_waiting, 0) << kv;
    EXPECT_GT(tight_trace.max_waiting, 0) << kv << ": the tight pool must make requests wait";
    EXPECT_LE(tight_trace.max_pages_in_use, 4) << kv;
    expect_complete(tight, reqs);
    for (size_t r = 0; r < reqs.size(); ++r) {
      EXPECT_EQ(tight[r].tokens, roomy[r].tokens) << kv << " request " << r;
      EXPECT_EQ(tight[r].logits, roomy[r].logits) << kv << " request " << r;
    }
  }
}

}  // namespace
}  // namespace genbridge::engine
