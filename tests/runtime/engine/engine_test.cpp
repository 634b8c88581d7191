// Engine behaviour on real (synthetic) checkpoints: agreement with the independent fp64 reference forward
// pass, determinism across runs and thread counts, batch invariance, admission and refusal, stop tokens,
// bad requests. Runs unchanged in every target build (the DeviceOperator picks the KV representation).
#include "runtime/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "engine_harness.h"
#include "genbridge/core/threading.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;
using model::Checkpoint;

std::vector<Request> some_requests(int64_t vocab, int n = 4, int max_new = 6) {
  std::vector<Request> reqs;
  for (int r = 0; r < n; ++r) {
    Request q;
    q.id = r;
    q.prompt = prompt_of(3 + 5 * r, 100 + r, vocab);
    q.max_new_tokens = max_new;
    reqs.push_back(q);
  }
  return reqs;
}

void check_against_reference(const std::string& preset) {
  const Checkpoint& ck = checkpoint(preset);
  const int64_t vocab = ck.config().vocab_size;
  Request q;
  q.id = 0;
  q.prompt = prompt_of(12, 42, vocab);
  q.max_new_tokens = 8;
  const auto res = run_engine({.preset = preset}, {q});
  ASSERT_EQ(res.size(), 1u);
  compare_with_reference(ck, q.prompt, res[0], kBf16KvCheck, preset);
}

TEST(Engine, logits_agree_with_fp64_reference_rms_norm) { check_against_reference("tiny"); }
TEST(Engine, logits_agree_with_fp64_reference_gemma_norm) { check_against_reference("tiny-gemma"); }

// The tiny model with each head_dim attention implements (80 and 112 take the kernels' 16-column tail)
// agrees with the fp64 reference over a generation that crosses a KV page, in bf16 KV. Each head_dim is a
// different random model; most stay within 2% (observed), the head_dim-192 one reaches 3.7% at its prefill
// step (seeds 8-10 give 1.2% there; paged_decode itself matches the fp64 reference on its stored K/V to
// 3e-7 at every head_dim). 5% still fails any wiring fault (a wrong head stride, rope or norm width
// gives errors of order 1).
constexpr ReferenceCheck kHeadDimCheck{.tolerance = 5e-2};
TEST(Engine, every_supported_head_dim_agrees_with_fp64_reference) {
  genbridge::testing::TempDir dir;
  for (int64_t d : ops::kPagedDecodeHeadDims) {
    model::ModelConfig c = model::synthetic_preset_config("tiny").value();
    c.head_dim = d;
    const auto path = dir / ("tiny_d" + std::to_string(d));
    ASSERT_TRUE(model::write_synthetic_checkpoint(c, 7, path).ok());
    auto ck = Checkpoint::open(path);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const Request q = request_of(0, 120, 12, c.vocab_size, 42);
    const auto res = run_engine_on(*ck, {}, {q});
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].tokens.size(), 12u);
    compare_with_reference(*ck, q.prompt, res[0], kHeadDimCheck, "head_dim " + std::to_string(d));
  }
}

TEST(Engine, greedy_bit_identical_across_runs_and_thread_counts) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  set_num_threads(1);
  const auto one = run_engine({}, some_requests(vocab));
  for (int threads : {2, 3, 1}) {
    set_num_threads(threads);
    const auto again = run_engine({}, some_requests(vocab));
    for (size_t r = 0; r < one.size(); ++r) {
      EXPECT_EQ(again[r].tokens, one[r].tokens) << "threads " << threads;
      EXPECT_EQ(again[r].logits, one[r].logits) << "threads " << threads;
    }
  }
  set_num_threads(0);
}

TEST(Engine, batched_decoding_equals_decoding_each_request_alone) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  const auto batched = run_engine({.max_batch = 8}, some_requests(vocab));
  for (const Request& q : some_requests(vocab)) {
    const auto alone = run_engine({.max_batch = 1}, {q});
    EXPECT_EQ(alone[0].tokens, batched[q.id].tokens) << "request " << q.id;
    EXPECT_EQ(alone[0].logits, batched[q.id].logits) << "request " << q.id;
  }
}

TEST(Engine, small_pool_makes_requests_wait_without_changing_results) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  const auto roomy = run_engine({}, some_requests(vocab));
  const auto tight = run_engine({.pool_pages = 1}, some_requests(vocab));  // one sequence at a time
  for (size_t r = 0; r < roomy.size(); ++r) EXPECT_EQ(tight[r].tokens, roomy[r].tokens);
}

TEST(Engine, request_that_can_never_fit_is_refused_and_others_complete) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto reqs = some_requests(vocab, 2);
  Request big;
  big.id = 9;
  big.prompt = prompt_of(200, 5, vocab);
  big.max_new_tokens = 100;
  reqs.insert(reqs.begin() + 1, big);
  const auto res = run_engine({.pool_pages = 2}, reqs);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_EQ(res[1].reason, FinishReason::kRefused);
  EXPECT_EQ(res[1].message,
            "request 9 needs 3 KV pages (200 prompt + 100 new tokens at 128 tokens per page) but the pool has only 2 "
            "pages; raise --kv-memory-mb or lower --max-new-tokens");
  EXPECT_TRUE(res[1].tokens.empty());
  EXPECT_EQ(res[0].tokens.size(), 6u);
  EXPECT_EQ(res[2].tokens.size(), 6u);
}

TEST(Engine, stop_token_ends_the_request_and_is_kept) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto reqs = some_requests(vocab, 1, 8);
  const auto full = run_engine({}, reqs);
  const int32_t stop = full[0].tokens[2];
  const size_t first = std::find(full[0].tokens.begin(), full[0].tokens.end(), stop) - full[0].tokens.begin();
  reqs[0].stop_tokens = {stop};
  const auto stopped = run_engine({}, reqs);
  EXPECT_EQ(stopped[0].reason, FinishReason::kStop);
  EXPECT_EQ(stopped[0].tokens, std::vector<int32_t>(full[0].tokens.begin(), full[0].tokens.begin() + first + 1));
}

TEST(Engine, seeded_sampling_is_reproducible_and_batch_independent) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto reqs = some_requests(vocab, 3, 8);
  for (auto& r : reqs) r.sampling = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .seed = 11 + uint64_t(r.id)};
  const auto a = run_engine({}, reqs), b = run_engine({.max_batch = 1}, reqs);
  for (size_t r = 0; r < a.size(); ++r) EXPECT_EQ(a[r].tokens, b[r].tokens);
}

TEST(Engine, quantized_kv_stays_close_to_bf16_kv) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  auto reqs = some_requests(vocab, 2, 4);
  const auto bf16 = run_engine({}, reqs), quant = run_engine({.kv_cache_dtype = "quantized"}, reqs);
  // Same first token: it is produced by the prefill, whose attention reads the just-written (quantized) KV.
  for (size_t r = 0; r < bf16.size(); ++r) {
    std::span<const float> q(quant[r].logits.data(), vocab);
    std::vector<double> b(bf16[r].logits.begin(), bf16[r].logits.begin() + vocab);
    EXPECT_LE(rel_l2(q, b), 5e-2) << "request " << r;
  }
}

TEST(Engine, malformed_requests_are_rejected_with_a_reason) {
  const Checkpoint& ck = checkpoint("tiny");
  const model::ModelConfig& c = ck.config();
  auto dev = runtime::DeviceOperator::create({});
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 4);
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  LocalExecutor executor(**runner);
  Engine eng(executor, *pool, {});
  EXPECT_EQ(eng.submit({.id = 1, .prompt = {}}).message(), "request 1: the prompt is empty");
  EXPECT_EQ(eng.submit({.id = 2, .prompt = {1, 512}}).message(),
            "request 2: prompt token 512 is outside the vocabulary [0, 512)");
  EXPECT_EQ(eng.submit({.id = 3, .prompt = {1}, .max_new_tokens = 0}).message(),
            "request 3: max_new_tokens is 0 but must be >= 1");
  EXPECT_EQ(eng.submit({.id = 4, .prompt = {1}, .sampling = {.temperature = -1.f}}).message(),
            "request 4: sampling: temperature is -1 but must be 0 or a number in [1.1754944e-38, 3.4028235e+38]");
  EXPECT_TRUE(eng.submit({.id = 5, .prompt = {1}}).ok());
  EXPECT_EQ(eng.submit({.id = 5, .prompt = {2}}).message(), "request 5: the id is already in use");
}

}  // namespace
}  // namespace genbridge::engine
