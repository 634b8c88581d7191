// Engine behaviour on real (synthetic) checkpoints: agreement with the independent fp64 reference forward
// pass, determinism across runs and thread counts, batch invariance, admission and refusal, stop tokens,
// bad requests. Runs unchanged in every target build (the DeviceOperator picks the KV representation).
#include "runtime/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "genbridge/core/threading.h"
#include "runtime/device/device_operator.h"
#include "runtime/model/synthetic.h"
#include "support/reference_forward.h"
#include "support/temp_dir.h"

namespace genbridge::engine {
namespace {

using model::Checkpoint;

// One model directory per preset for the whole test program.
const Checkpoint& checkpoint(const std::string& preset) {
  static testing::TempDir dir;
  static std::map<std::string, std::unique_ptr<Checkpoint>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    const auto path = dir / preset;
    const Status st = model::write_synthetic_checkpoint(preset, 7, path);
    EXPECT_TRUE(st.ok()) << st.to_string();
    auto ck = Checkpoint::open(path);
    EXPECT_TRUE(ck.ok()) << ck.status().to_string();
    slot = std::make_unique<Checkpoint>(std::move(ck).value());
  }
  return *slot;
}

struct RunConfig {
  std::string preset = "tiny";
  std::string kv_cache_dtype = "auto";
  int64_t max_batch = 8;
  int64_t pool_pages = 64;
  bool record_logits = true;
};

std::vector<int32_t> prompt_of(int64_t n, uint64_t salt, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(uniform_from(salt, i) * vocab));
  return p;
}

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

// Runs `reqs` through a fresh engine and returns the results (asserting success).
std::vector<RequestResult> run_engine(const RunConfig& rc, std::vector<Request> reqs, Status* error = nullptr) {
  const Checkpoint& ck = checkpoint(rc.preset);
  const model::ModelConfig& c = ck.config();
  auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = rc.kv_cache_dtype});
  EXPECT_TRUE(dev.ok()) << dev.status().to_string();
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}),
                                          rc.pool_pages);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  LocalExecutor executor(**runner);
  Engine eng(executor, *pool, {.max_batch = rc.max_batch, .record_logits = rc.record_logits});
  for (auto& r : reqs) EXPECT_TRUE(eng.submit(std::move(r)).ok());
  const Status st = eng.run_to_completion();
  if (error) {
    *error = st;
  } else {
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  EXPECT_EQ(pool->used_pages(), 0) << "finished requests must return their pages";
  return eng.results();
}

// Relative L2 error of one logits row against the reference.
double rel_l2(std::span<const float> got, std::span<const double> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The engine computes in bf16 activations with fp32 accumulation; the reference in fp64 on the same (bf16)
// weights. Each bf16 rounding has relative error <= 2^-9; a few dozen roundings per layer through residual
// adds, norms and projections over 4 layers give logits within ~1.5% relative L2 (observed, printed). We
// require <= 3% per step. One exception is legitimate: the router sees bf16 hidden states, so its logits
// carry an error of ~0.01-0.03 (router logits have std ~2); where the reference's gap between the k-th and
// (k+1)-th expert at the step's position is below kRoutingMargin in some MoE layer, the engine may pick the
// other expert, and that step's logits are not compared (at least 3/4 of the steps must be). Where the
// reference's top-2 logit gap exceeds twice the observed absolute error, the greedy token must match.
constexpr double kRoutingMargin = 0.05;

void check_against_reference(const std::string& preset) {
  const Checkpoint& ck = checkpoint(preset);
  const int64_t vocab = ck.config().vocab_size;
  Request q;
  q.id = 0;
  q.prompt = prompt_of(12, 42, vocab);
  q.max_new_tokens = 8;
  const auto res = run_engine({.preset = preset}, {q});
  ASSERT_EQ(res.size(), 1u);
  const auto& tokens = res[0].tokens;
  std::vector<int32_t> seq = q.prompt;
  seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
  const testing::ReferenceForward ref = testing::reference_forward(ck.config(), ck.weights(), seq);
  double worst = 0;
  size_t compared = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(q.prompt.size() + i) - 1;
    std::span<const float> got(res[0].logits.data() + i * vocab, vocab);
    const auto want = ref.logits_at(pos);
    double margin = INFINITY;
    for (const auto& layer : ref.topk_margin) {
      if (!layer.empty()) margin = std::min(margin, layer[pos]);
    }
    const double err = rel_l2(got, want);
    std::printf("%s step %zu: relative L2 error %.4f, smallest routing margin %.4f%s\n", preset.c_str(), i, err, margin,
                margin < kRoutingMargin ? " (routing may flip: not compared)" : "");
    if (margin < kRoutingMargin) continue;
    ++compared;
    worst = std::max(worst, err);
    EXPECT_LE(err, 3e-2) << preset << " step " << i;
    double max_abs = 0;
    for (int64_t v = 0; v < vocab; ++v) max_abs = std::max(max_abs, std::abs(got[v] - want[v]));
    std::vector<double> sorted(want.begin(), want.end());
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const int64_t ref_argmax = std::max_element(want.begin(), want.end()) - want.begin();
    if (sorted[0] - sorted[1] > 2 * max_abs) {
      EXPECT_EQ(tokens[i], ref_argmax) << preset << " step " << i;
    }
  }
  EXPECT_GE(compared * 4, tokens.size() * 3) << "too few steps with a clear routing decision to compare";
  std::printf("%s: worst relative L2 logit error vs fp64 reference over %zu compared steps: %.4f\n", preset.c_str(),
              compared, worst);
}

TEST(Engine, logits_agree_with_fp64_reference_rms_norm) { check_against_reference("tiny"); }
TEST(Engine, logits_agree_with_fp64_reference_gemma_norm) { check_against_reference("tiny-gemma"); }

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
            "request 4: sampling: temperature is -1 but must be finite and >= 0");
  EXPECT_TRUE(eng.submit({.id = 5, .prompt = {1}}).ok());
  EXPECT_EQ(eng.submit({.id = 5, .prompt = {2}}).message(), "request 5: the id is already in use");
}

}  // namespace
}  // namespace genbridge::engine
