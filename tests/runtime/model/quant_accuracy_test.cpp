// Accuracy bounds of quantized weights against the bf16 engine (issue 13), on the tiny synthetic preset
// (seed 0), 16-token prompt, 64 teacher-forced greedy steps: the bounds documented in
// docs/bench/quant_weights.md (measured there on tiny and small with bench.runtime.model.quant_accuracy_bench).
// Every scheme the build's generation runs is checked; each must also actually change the logits (a
// quantized run that silently used the bf16 weights fails the lower bound).
#include "support/quant_accuracy.h"

#include <gtest/gtest.h>

#include "runtime/engine/sampler.h"
#include "runtime/model/synthetic.h"
#include "support/temp_dir.h"

namespace genbridge::testing {
namespace {

struct Bound {
  const char* scheme;
  double median_max, p99_max, agreement_min;
};
// docs/bench/quant_weights.md, "Bounds asserted by tests" (measured: w8a8 0.022 / 0.18 / 96.9%,
// mxfp8 0.064 / 0.29 / 84.6%, mxfp4 0.25 / 0.67 / 63.1%).
constexpr Bound kBounds[] = {{"w8a8", 0.04, 0.30, 0.85}, {"mxfp8", 0.10, 0.40, 0.75}, {"mxfp4", 0.35, 0.80, 0.50}};

TEST(QuantAccuracy, tiny_preset_within_documented_bounds) {
  TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 0, dir / "m").ok());
  auto ckpt = model::Checkpoint::open(dir / "m");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) {
    prompt.push_back(
        static_cast<int32_t>(engine::uniform_from(2026, i) * static_cast<double>(ckpt->config().vocab_size)));
  }
  const runtime::GenerationContract& c = runtime::DeviceOperator::create({}).value().contract();
  int checked = 0;
  for (const Bound& b : kBounds) {
    bool offered = false;
    for (int i = 0; i < c.weight_quant.num_offered; ++i) {
      offered |= ops::weight_quant_scheme_name(c.weight_quant.offered[i].scheme) == b.scheme;
    }
    if (!offered) continue;
    auto acc = measure_quant_accuracy(*ckpt, b.scheme, prompt, 64);
    ASSERT_TRUE(acc.ok()) << b.scheme << ": " << acc.status().to_string();
    EXPECT_EQ(acc->scheme, b.scheme);
    EXPECT_EQ(acc->steps(), 65);
    EXPECT_LE(acc->quantile(0.5), b.median_max) << b.scheme;
    EXPECT_GE(acc->quantile(0.5), 1e-3) << b.scheme << ": the logits did not change; were the weights quantized?";
    EXPECT_LE(acc->quantile(0.99), b.p99_max) << b.scheme;
    EXPECT_GE(acc->agreement(), b.agreement_min) << b.scheme;
    ++checked;
  }
  EXPECT_EQ(checked, c.weight_quant.num_offered);
}

}  // namespace
}  // namespace genbridge::testing
