// DeepSeek-V4 through the engine: agreement with the independent fp64 reference forward over long generations
// (contexts past several ratio-128 windows and past the indexer's top-k of ratio-4 windows), with bf16 and the
// generation's quantized shared K = V rows; batched requests give each one's bits alone; the state slots (window
// ring, compressors' unfinished windows) are taken zeroed and returned with the pages. Runs unchanged in every
// target build (the DeviceOperator picks the representations).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine_harness.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "support/deepseek_v4_reference_forward.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;
using model::Checkpoint;

struct Accuracy {
  std::vector<double> errors, free_errors;  // per step: relative L2 of the last-position logits (following / own)
  static double median(std::vector<double> e) {
    std::sort(e.begin(), e.end());
    return e.empty() ? INFINITY : e[e.size() / 2];
  }
};

// Every step of `res` against the fp64 reference, teacher-forced on the engine's own tokens: once following the
// engine's recorded choices (experts, indexer entries; the synthetic model's near-ties are not kernel errors,
// docs/deepseek.md) and once with the reference's own.
Accuracy accuracy(const Checkpoint& ck, const std::vector<int32_t>& prompt, const RequestResult& res) {
  const model::ModelConfig& c = ck.config();
  const int64_t vocab = c.vocab_size, L = c.num_hidden_layers;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), res.tokens.begin(), res.tokens.end() - 1);
  genbridge::testing::DeepseekV4Choices engine;
  engine.experts.assign(L, std::vector<std::vector<int64_t>>(seq.size()));
  engine.index_selected.assign(L, std::vector<std::vector<int64_t>>(seq.size()));
  size_t e = 0, x = 0;
  for (const ChoiceRecord& r : res.choices.records) {
    if (r.position < static_cast<int32_t>(seq.size())) {
      engine.experts[r.layer][r.position].assign(res.choices.expert_ids.begin() + e,
                                                 res.choices.expert_ids.begin() + e + r.num_experts);
      engine.index_selected[r.layer][r.position].assign(res.choices.index_positions.begin() + x,
                                                        res.choices.index_positions.begin() + x + r.num_index);
    }
    e += r.num_experts;
    x += r.num_index;
  }
  const auto ref = genbridge::testing::deepseek_v4_reference_forward(c, ck.weights(), seq, &engine);
  const auto own = genbridge::testing::deepseek_v4_reference_forward(c, ck.weights(), seq);
  Accuracy a;
  for (size_t i = 0; i < res.tokens.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(prompt.size() + i) - 1;
    const std::span<const float> got(res.logits.data() + i * vocab, static_cast<size_t>(vocab));
    a.errors.push_back(rel_l2(got, ref.logits_at(pos)));
    a.free_errors.push_back(rel_l2(got, own.logits_at(pos)));
  }
  return a;
}

// 256 greedy steps after a 400-token prompt: the context reaches 655 tokens, five ratio-128 windows and 163
// ratio-4 windows (index_topk 16), five sliding windows. Bounds on the median relative L2 of the last-position
// logits, following the engine's choices / with the reference's own (docs/deepseek.md, "Accuracy"; the measured
// values are printed).
struct Bounds {
  double following, own;
};
// bf16 shared K = V rows and indexer keys (both generations compute the same bits).
constexpr Bounds kBf16Bounds{1e-2, 2.5e-2};
// The generation's quantized rows (A2/A3: int8 + fp16 scale, bf16 rope; A5: the 640-byte MXFP8 row, fp8 indexer
// keys): window and compressed entries read rounded values.
constexpr Bounds kQuantizedBounds{1e-1, 2e-1};

// The FP8 + MXFP4 form DeepSeek ships (make-model --weight-quant fp8): genbridge binds its weights as their exact
// bf16 dequantization, so the engine on it agrees with the fp64 reference of the same checkpoint as the bf16 form
// does (the quantization itself is the checkpoint's: docs/deepseek.md has its error per role).
const Checkpoint& fp8_form() {
  static genbridge::testing::TempDir dir;
  static std::unique_ptr<Checkpoint> ck;
  if (!ck) {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny-dsv4", 7, dir / "m").ok());
    const Status st = model::convert_checkpoint_to_deepseek_v4_fp8(dir / "m");
    EXPECT_TRUE(st.ok()) << st.to_string();
    ck = std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / "m")).value());
  }
  return *ck;
}

void check_long_generation(const std::string& kv, const Bounds& bound, const Checkpoint* checkpoint_override = nullptr) {
  const Checkpoint& ck = checkpoint_override ? *checkpoint_override : checkpoint("tiny-dsv4");
  const Request q = request_of(0, 400, 256, ck.config().vocab_size, 42);
  const auto res = run_engine_on(
      ck, {.preset = "tiny-dsv4", .kv_cache_dtype = kv, .max_batch = 2, .pool_pages = 16, .record_choices = true}, {q});
  ASSERT_EQ(res.size(), 1u);
  ASSERT_EQ(res[0].tokens.size(), 256u) << res[0].message;
  const Accuracy a = accuracy(ck, q.prompt, res[0]);
  const double following = Accuracy::median(a.errors), own = Accuracy::median(a.free_errors);
  std::printf(
      "tiny-dsv4 kv=%s: %zu steps, median relative L2 logit error vs fp64 following the engine's choices %.5f, with "
      "the reference's own %.5f\n",
      kv.c_str(), a.errors.size(), following, own);
  EXPECT_LE(following, bound.following) << "kv=" << kv;
  EXPECT_LE(own, bound.own) << "kv=" << kv;
}

TEST(DeepseekV4Engine, matches_fp64_reference_over_256_steps_bf16_kv) { check_long_generation("auto", kBf16Bounds); }
TEST(DeepseekV4Engine, quantized_kv_matches_fp64_reference_within_its_bound) {
  check_long_generation("quantized", kQuantizedBounds);
}
// Measured: 0.58% following the engine's choices, 2.74% with the reference's own (this model's routing has more
// near-ties than the bf16 preset's: its experts carry MXFP4's rounding).
TEST(DeepseekV4Engine, fp8_mxfp4_form_matches_its_fp64_reference_over_256_steps) {
  check_long_generation("auto", {1e-2, 4e-2}, &fp8_form());
}

// Each request's tokens and logits do not depend on the others in its batch (prefill together, decode together,
// slots reused after a request ends) nor on its state slot or pages.
TEST(DeepseekV4Engine, batched_requests_match_each_alone) {
  const Checkpoint& ck = checkpoint("tiny-dsv4");
  const int64_t vocab = ck.config().vocab_size;
  std::vector<Request> reqs;
  for (int r = 0; r < 5; ++r) reqs.push_back(request_of(r, 3 + 67 * r, 20 + 9 * r, vocab));
  const auto together = run_engine({.preset = "tiny-dsv4", .max_batch = 3, .pool_pages = 24}, reqs);
  ASSERT_EQ(together.size(), reqs.size());
  for (size_t r = 0; r < reqs.size(); ++r) {
    const auto alone = run_engine({.preset = "tiny-dsv4", .max_batch = 1, .pool_pages = 8}, {reqs[r]});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(together[r].tokens, alone[0].tokens) << "request " << r;
    EXPECT_EQ(together[r].logits, alone[0].logits) << "request " << r;
  }
}

// A pool without state slots can never run the model: the runner refuses naming the state slots.
TEST(DeepseekV4Engine, a_pool_without_state_slots_is_refused_naming_them) {
  const Checkpoint& ck = checkpoint("tiny-dsv4");
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(ck.config())), 8, 0);
  ASSERT_TRUE(pool.ok());
  const auto runner = model::ModelRunner::create(ck, *dev, *pool);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().message(),
            "DeviceOperator::v4_window_view: the pool has no state slots; DeepSeek-V4 keeps each sequence's sliding "
            "window there");
}

}  // namespace
}  // namespace genbridge::engine
