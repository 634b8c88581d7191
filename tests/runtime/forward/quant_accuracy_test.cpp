// Accuracy bounds of quantized weights against the bf16 engine, on the tiny synthetic preset
// (seed 0), 16-token prompt, 64 teacher-forced greedy steps: the bounds documented in
// docs/bench/quant_weights.md (measured there on tiny and small with bench.runtime.forward.quant_accuracy_bench).
// Every scheme the build's generation runs is checked; each must also actually change the logits (a
// quantized run that silently used the bf16 weights fails the lower bound), except where a scheme holds
// every value of a quantized checkpoint exactly: there only the reduction order differs (the MX kernels reduce in
// linear's fp32 order, bf16 weights in the pair order the bf16 dot instruction defines; docs/linear.md), so the
// logits stay within the kKept bounds, an order of magnitude below any quantization's.
#include "support/quant_accuracy.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/engine/sampler.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::testing {
namespace {

struct Bound {
  const char* scheme;  // --weight-quant
  double median_max, p99_max, agreement_min;
  bool exact = false;  // every value kept: within the kKept bounds of the bf16 engine
};
// Where every value is kept, two reduction orders' fp32 roundings through the layers (and the indexer's top-k
// choices they can flip) separate the runs (measured on tiny-dsv4's FP8 + MXFP4 form: rel L2 median 0.0015, worst
// step 0.052, greedy agreement 96.9%; docs/bench/quant_weights.md, "DeepSeek-V4 preset").
constexpr double kKeptMedianMax = 0.005, kKeptWorstMax = 0.1, kKeptAgreementMin = 0.9;
// docs/bench/quant_weights.md, "Bounds asserted by tests" (measured: w8a8 0.022 / 0.18 / 96.9%,
// mxfp8 0.064 / 0.29 / 84.6%, mxfp4 0.25 / 0.67 / 63.1%).
constexpr Bound kBounds[] = {{"w8a8", 0.04, 0.30, 0.85}, {"mxfp8", 0.10, 0.40, 0.75}, {"mxfp4", 0.35, 0.80, 0.50}};

// `v4_fp8_form`: the DeepSeek-V4 preset converted to DeepSeek's FP8 + MXFP4 form; the bf16 engine runs its exact
// dequantization.
void check_bounds(const char* preset, std::span<const Bound> bounds, bool v4_fp8_form = false) {
  TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint(preset, 0, dir / "m").ok());
  if (v4_fp8_form) {
    ASSERT_TRUE(model::convert_checkpoint_to_deepseek_v4_fp8(dir / "m").ok());
  }
  auto ckpt = model::Checkpoint::open(dir / "m");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) {
    prompt.push_back(
        static_cast<int32_t>(engine::uniform_from(2026, i) * static_cast<double>(ckpt->config().vocab_size)));
  }
  const runtime::GenerationContract& c = runtime::DeviceOperator::create({}).value().contract();
  int checked = 0, offered_rows = 0;
  for (const Bound& b : bounds) {
    bool offered = std::string_view(b.scheme) == "auto";
    for (int i = 0; i < c.weight_quant.num_offered; ++i) {
      offered |= ops::weight_quant_scheme_name(c.weight_quant.offered[i].scheme) == b.scheme;
    }
    if (!offered) continue;
    ++offered_rows;
    auto acc = measure_quant_accuracy(*ckpt, b.scheme, prompt, 64);
    ASSERT_TRUE(acc.ok()) << b.scheme << ": " << acc.status().to_string();
    if (std::string_view(b.scheme) != "auto") {
      EXPECT_EQ(acc->scheme, b.scheme);
    }
    EXPECT_EQ(acc->steps(), 65);
    if (b.exact) {
      EXPECT_LE(acc->quantile(0.5), kKeptMedianMax) << b.scheme << ": further from the bf16 engine than rounding";
      EXPECT_LE(acc->quantile(1.0), kKeptWorstMax) << b.scheme;
      EXPECT_GE(acc->agreement(), kKeptAgreementMin) << b.scheme;
    } else {
      EXPECT_LE(acc->quantile(0.5), b.median_max) << b.scheme;
      EXPECT_GE(acc->quantile(0.5), 1e-3) << b.scheme << ": the logits did not change; were the weights quantized?";
      EXPECT_LE(acc->quantile(0.99), b.p99_max) << b.scheme;
      EXPECT_GE(acc->agreement(), b.agreement_min) << b.scheme;
    }
    std::printf("%s %s: rel L2 median %.3g, p99 %.3g, greedy agreement %.1f%%\n", preset, b.scheme, acc->quantile(0.5),
                acc->quantile(0.99), 100 * acc->agreement());
    ++checked;
  }
  EXPECT_EQ(checked, offered_rows);
  EXPECT_GE(checked, c.weight_quant.num_offered);
}

TEST(QuantAccuracy, tiny_preset_within_documented_bounds) { check_bounds("tiny", kBounds); }

// DeepSeek-V3.2 (MLA projections, experts and the shared expert quantized; indexer bf16): the 80 positions
// go past index_topk = 64, so the sparse selection is active. docs/bench/quant_weights.md, "DSA preset"
// (measured: w8a8 0.027 / 0.71 / 86.2%, mxfp8 0.083 / 0.65 / 76.9%, mxfp4 0.36 / 0.81 / 41.5%; the p99 of 65
// steps is the worst step: a flipped expert or indexer selection moves a step's logits by tens of percent).
constexpr Bound kDsaBounds[] = {{"w8a8", 0.05, 0.90, 0.80}, {"mxfp8", 0.15, 0.90, 0.70}, {"mxfp4", 0.50, 1.00, 0.30}};

TEST(QuantAccuracy, tiny_dsa_preset_within_documented_bounds) { check_bounds("tiny-dsa", kDsaBounds); }

// Qwen3.5-MoE (full-attention projections, routed and gated shared experts quantized; the Gated DeltaNet
// projections, router and LM head bf16). docs/bench/quant_weights.md, "Qwen3.5 preset" (measured: MEASURED).
constexpr Bound kQwen35Bounds[] = {
    {"w8a8", 0.10, 0.90, 0.50}, {"mxfp8", 0.20, 0.90, 0.50}, {"mxfp4", 0.60, 1.00, 0.20}};

TEST(QuantAccuracy, tiny_qwen35_preset_within_documented_bounds) { check_bounds("tiny-qwen35", kQwen35Bounds); }

// DeepSeek-V4, bf16 form (wq_a, wq_b, wkv, wo_a per group, wo_b, the routed experts with their SwiGLU clamp and the
// shared expert quantized; compressors, indexer, router, hyper-connections and head bf16). docs/bench/quant_weights.md,
// "DeepSeek-V4 preset" (measured: w8a8 0.051 / 0.45 / 81.5%, mxfp8 0.22 / 0.48 / 52.3%, mxfp4 0.63 / 0.94 / 15.4%;
// 65 steps, so the p99 is the worst step).
constexpr Bound kDsv4Bounds[] = {{"w8a8", 0.08, 0.70, 0.70}, {"mxfp8", 0.35, 0.80, 0.40}, {"mxfp4", 0.80, 1.20, 0.05}};

TEST(QuantAccuracy, tiny_dsv4_preset_within_documented_bounds) { check_bounds("tiny-dsv4", kDsv4Bounds); }

// DeepSeek-V4 in the FP8 + MXFP4 form DeepSeek ships, against the bf16 engine on the same checkpoint (its exact
// dequantization). Where the generation runs MX, auto (the FP8 linears as MXFP8 with the file's codes, the experts'
// own MXFP4 codes) and mxfp8 (the e2m1 codes re-encoded as e4m3) hold every value the file holds: the bf16 engine's
// values, reduced in another order (kKept bounds). W8A8 (auto where the generation has no MX data path) and mxfp4 (the FP8 linears requantized) within their
// bounds. docs/bench/quant_weights.md, "DeepSeek-V4 preset" (measured: auto and mxfp8 0 / 0 / 100% on the A5 build;
// w8a8 0.047 / 0.23 / 89.2% on both builds, the same bits; mxfp4 0.61 / 0.79 / 26.2%).
TEST(QuantAccuracy, tiny_dsv4_fp8_form_exact_where_kept_else_within_documented_bounds) {
  const runtime::GenerationContract& c = runtime::DeviceOperator::create({}).value().contract();
  const Bound w8a8{"w8a8", 0.08, 0.50, 0.75};
  const bool mx = c.weight_quant.find(ops::WeightQuantScheme::kMxfp4) != nullptr;
  const std::vector<Bound> bounds = {
      mx ? Bound{"auto", 0, 0, 1, true} : Bound{"auto", w8a8.median_max, w8a8.p99_max, w8a8.agreement_min}, w8a8,
      Bound{"mxfp8", 0, 0, 1, true}, Bound{"mxfp4", 0.80, 1.00, 0.10}};
  check_bounds("tiny-dsv4", bounds, /*v4_fp8_form=*/true);
}

}  // namespace
}  // namespace genbridge::testing
