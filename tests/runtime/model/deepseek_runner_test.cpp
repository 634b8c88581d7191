// The engine's DeepSeek path (ModelRunner with MlaAttention: absorbed MLA over paged latent rows, the DSA
// indexer's top-k and sparse attention, grouped sigmoid routing, shared experts, YaRN) against the
// independent fp64 forward in tests/support, for the V3.2 and V3 presets (with and without q_lora), bf16 and
// quantized KV: a chunked prefill, then decode one token per step past index_topk tokens of context and
// across KV pages. Runs unchanged in every target build.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "runtime/device/device_operator.h"
#include "runtime/model/runner.h"
#include "runtime/model/synthetic.h"
#include "support/deepseek_reference_forward.h"
#include "support/temp_dir.h"

namespace genbridge::model {
namespace {

// The reference is slow under AddressSanitizer: shorter sequences there (still past index_topk = 64).
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kTokens = 80;
#else
constexpr int64_t kTokens = 150;  // > index_topk (64) and > one KV page (128)
#endif
constexpr int64_t kPrompt = 40;

const Checkpoint& checkpoint(const std::string& preset) {
  static genbridge::testing::TempDir dir;
  static std::map<std::string, std::unique_ptr<Checkpoint>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    EXPECT_TRUE(write_synthetic_checkpoint(preset, 11, dir / preset).ok());
    slot = std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / preset)).value());
  }
  return *slot;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((i * 2654435761u + 12345u) % static_cast<uint64_t>(vocab));
  return t;
}

double rel_l2(std::span<const float> got, std::span<const double> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Runs `seq` through the runner: prefill of kPrompt tokens (two chunks of kPrompt / 2), then one token per
// step. Returns the logits of every position from kPrompt / 2 - 1 on ([position][vocab]).
std::vector<std::vector<float>> run(const Checkpoint& ck, const std::string& kv, const std::vector<int32_t>& seq,
                                    int64_t* kv_bytes_per_token_per_layer) {
  const ModelConfig& c = ck.config();
  const int64_t V = c.vocab_size, n = static_cast<int64_t>(seq.size());
  auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = kv});
  EXPECT_TRUE(dev.ok()) << dev.status().to_string();
  const runtime::KvPageGeometry g = dev->kv_page_geometry(kv_model_shape(c));
  *kv_bytes_per_token_per_layer = g.bytes_per_token_per_layer();
  auto pool = runtime::KvPagePool::create(g, 4);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  auto runner = ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  if (!runner.ok()) return {};
  ForwardBatch batch = (*runner)->make_batch(kPrompt, 1);
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  const runtime::SeqId id = 1;
  int64_t done = 0;
  EXPECT_TRUE(pool->admit(id, kPrompt / 2, n).ok());
  while (done < n) {
    const int64_t q = done < kPrompt ? kPrompt / 2 : 1;
    if (done > 0) EXPECT_TRUE(pool->append(id, q).ok());
    const std::vector<runtime::SeqId> ids = {id};
    const std::vector<int32_t> q_lens = {static_cast<int32_t>(q)};
    const Status st = (*runner)->forward(batch, {std::span(seq).subspan(done, q), ids, q_lens}, logits);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return {};
    done += q;
    out[done - 1] = logits;
  }
  return out;
}

struct Case {
  const char* preset;
  const char* kv;
  double tolerance;  // relative L2 logit error bound per compared position
};

// Compares the engine's logits with the reference at every position it produced, skipping positions where
// some layer's routing (sigmoid selection scores) or indexer top-k decision is a near-tie the bf16 engine
// may legitimately decide the other way.
void check(const Case& k) {
  const Checkpoint& ck = checkpoint(k.preset);
  const ModelConfig& c = ck.config();
  const std::vector<int32_t> seq = tokens(kTokens, c.vocab_size);
  int64_t bytes = 0;
  const std::vector<std::vector<float>> got = run(ck, k.kv, seq, &bytes);
  ASSERT_EQ(got.size(), seq.size()) << k.preset << " " << k.kv;
  model::LoadOptions native;
  native.precision = WeightPrecision::kNative;
  const Checkpoint exact = Checkpoint::open(ck.dir(), native).value();
  const genbridge::testing::DeepseekReference ref =
      genbridge::testing::deepseek_reference_forward(exact.config(), exact.weights(), seq);
  int64_t steps = 0, compared = 0;
  double worst = 0;
  for (int64_t p = 0; p < kTokens; ++p) {
    if (got[p].empty()) continue;
    ++steps;
    double margin = INFINITY, index_margin = INFINITY;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      // Routing and indexer decisions at every position up to p shape position p's logits (through the keys).
      if (!ref.topk_margin[l].empty()) margin = std::min(margin, ref.topk_margin[l][p]);
      if (c.has_indexer()) {
        index_margin = std::min(index_margin, ref.index_margin[l][p]);
      }
    }
    if (margin < 0.01 || index_margin < 1e-3) continue;
    ++compared;
    const double err = rel_l2(got[p], ref.logits_at(p));
    worst = std::max(worst, err);
    EXPECT_LE(err, k.tolerance) << k.preset << " kv " << k.kv << " position " << p << " (routing margin " << margin
                                << ", indexer margin " << index_margin << ")";
  }
  std::printf(
      "%s kv=%s: %lld positions, %lld compared, worst relative L2 logit error vs fp64 %.4f, KV %lld B per "
      "token per layer\n",
      k.preset, k.kv, static_cast<long long>(steps), static_cast<long long>(compared), worst,
      static_cast<long long>(bytes));
  EXPECT_GE(compared, steps / 2) << k.preset << " " << k.kv << ": too few positions without near-ties";
}

TEST(DeepseekRunner, dsa_bf16_kv_matches_the_fp64_forward) { check({"tiny-dsa", "bf16", 3e-2}); }
TEST(DeepseekRunner, dsa_quantized_kv_matches_the_fp64_forward) { check({"tiny-dsa", "quantized", 6e-2}); }
TEST(DeepseekRunner, v3_bf16_kv_matches_the_fp64_forward) { check({"tiny-dsv3", "bf16", 3e-2}); }
TEST(DeepseekRunner, v3_without_q_lora_bf16_kv_matches_the_fp64_forward) { check({"tiny-dsv3-noq", "bf16", 3e-2}); }
TEST(DeepseekRunner, v3_quantized_kv_matches_the_fp64_forward) { check({"tiny-dsv3", "quantized", 6e-2}); }

TEST(DeepseekRunner, kv_bytes_per_token_per_layer) {
  // tiny-dsa: kv_lora_rank 128, rope 64, index_head_dim 128. bf16 MLA rows are 2 (128 + 64) = 384 B; the
  // indexer keys take the generation's representation whatever kv_cache_dtype says (bf16 256 B or fp8 +
  // scale 132 B); quantized MLA rows are the generation's (kv_cache/kv_format.h).
  const ModelConfig c = synthetic_preset_config("tiny-dsa").value();
  const ModelConfig v3 = synthetic_preset_config("tiny-dsv3").value();
  for (const char* kv : {"bf16", "quantized"}) {
    auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = kv});
    ASSERT_TRUE(dev.ok());
    const int64_t mla = ops::mla_kv_row_bytes(dev->mla_kv_format(), 128, 64).total();
    const int64_t keys = ops::indexer_key_row_bytes(dev->indexer_key_format(), 128).total();
    if (std::string(kv) == "bf16") EXPECT_EQ(mla, 384);
    EXPECT_LT(mla, 384 + (std::string(kv) == "bf16" ? 1 : 0));
    EXPECT_TRUE(keys == 256 || keys == 132) << keys;
    EXPECT_EQ(dev->kv_page_geometry(kv_model_shape(c)).bytes_per_token_per_layer(), mla + keys) << kv;
    EXPECT_EQ(dev->kv_page_geometry(kv_model_shape(v3)).bytes_per_token_per_layer(), mla) << kv;
  }
}

}  // namespace
}  // namespace genbridge::model
