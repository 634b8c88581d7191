// AFD with quantized weights: the attention ranks run the quantized projections and shared
// experts, the FFN ranks the quantized routed experts; tokens and logits equal the monolithic engine with
// the same scheme bit for bit, and differ from the bf16 engine's (the quantized weights are in use), except on
// DeepSeek-V4's FP8 + MXFP4 form where auto keeps every value of the file (the generations with an MX data path),
// which stays within rounding of the bf16 engine (the same values, reduced in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "afd/engine_job.h"
#include "afd/support/engine_job_case.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/engine/assembly.h"
#include "runtime/forward/deepseek_attention.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

std::vector<engine::Request> requests(int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < 4; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 3 + 4 * r; ++i)
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(5 + r, i) * vocab));
    q.max_new_tokens = 4 + r % 2;
    reqs.push_back(q);
  }
  return reqs;
}

std::vector<engine::RequestResult> monolithic(const model::Checkpoint& ckpt, const runtime::DeviceOperator& dev,
                                              const model::QuantizedWeights* q) {
  auto assembled = engine::assemble_engine(
      ckpt, dev, 16, {.engine = {.record_logits = true}, .kv_pool = {.state_slots = 32}, .quantized = q}, {});
  EXPECT_TRUE(assembled.ok()) << assembled.status().to_string();
  if (!assembled.ok()) return {};
  engine::Engine& eng = *(*assembled)->engine;
  for (auto& r : requests(ckpt.config().vocab_size)) EXPECT_TRUE(eng.submit(r).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  return eng.results();
}

// tiny: a dense layer and a shared expert; tiny-qwen35: Gated DeltaNet layers (bf16) beside quantized
// full-attention layers, fused experts and the gated shared expert; tiny-dsv4: V4 attention's projections, the
// clamped routed and shared experts, hash routing, in the bf16 form and in DeepSeek's FP8 + MXFP4 form ("fp8").
struct Model {
  const char* preset;
  bool v4_fp8_form = false;
};
class QuantWeightsAfd : public ::testing::TestWithParam<Model> {};

TEST_P(QuantWeightsAfd, afd_equals_monolithic_with_the_same_scheme) {
  testing::TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint(GetParam().preset, 3, dir / "m").ok());
  if (GetParam().v4_fp8_form) {
    ASSERT_TRUE(model::convert_checkpoint_to_deepseek_v4_fp8(dir / "m").ok());
  }
  auto ckpt = model::Checkpoint::open(dir / "m");
  ASSERT_TRUE(ckpt.ok());
  runtime::DeviceConfig dc;
  dc.weight_quant = "auto";
  const runtime::DeviceOperator dev = runtime::DeviceOperator::create(dc).value();
  const runtime::DeviceOperator bf16_dev = runtime::DeviceOperator::create({}).value();
  model::QuantizeOptions options;
  options.mxfp4_repr = dev.mxfp4_weight_quant();
  auto q = model::QuantizedWeights::quantize(*ckpt, *dev.weight_quant(), dev.contract().weight_quant.layers, options);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  // auto on the FP8 + MXFP4 form keeps every value where the generation runs MXFP8 (the linears' codes) and MXFP4.
  const bool exact = GetParam().v4_fp8_form && dev.weight_quant()->scheme == ops::WeightQuantScheme::kMxfp8 &&
                     dev.mxfp4_weight_quant()->scheme == ops::WeightQuantScheme::kMxfp4;

  // Without the quantized weights the runner refuses to start under --weight-quant.
  {
    auto pool = runtime::KvPagePool::create(dev.kv_page_geometry(model::kv_model_shape(ckpt->config())), 4, 1);
    auto r = model::ModelRunner::create(*ckpt, dev, *pool);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("no quantized weights were given"), std::string::npos);
  }

  const auto mono = monolithic(*ckpt, dev, q->get());
  const auto bf16 = monolithic(*ckpt, bf16_dev, nullptr);
  ASSERT_EQ(mono.size(), bf16.size());
  bool differs = false;
  double worst = 0;  // largest relative L2 distance of a request's logits
  for (size_t r = 0; r < mono.size(); ++r) {
    differs |= mono[r].logits != bf16[r].logits;
    ASSERT_EQ(mono[r].logits.size(), bf16[r].logits.size());
    double d2 = 0, b2 = 0;
    for (size_t i = 0; i < bf16[r].logits.size(); ++i) {
      const double d = static_cast<double>(mono[r].logits[i]) - bf16[r].logits[i];
      d2 += d * d;
      b2 += static_cast<double>(bf16[r].logits[i]) * bf16[r].logits[i];
    }
    worst = std::max(worst, std::sqrt(d2 / std::max(b2, 1e-30)));
  }
  if (exact) {
    // Every value kept: only the reduction order differs (MX kernels: the fp32 order; bf16 weights: the pair
    // order, docs/linear.md), so the logits stay within rounding of the bf16 dequantization's.
    EXPECT_LE(worst, 0.1) << "auto on the FP8 + MXFP4 form moved away from its exact bf16 dequantization";
  } else {
    EXPECT_TRUE(differs) << "the quantized engine gave the bf16 engine's logits";
  }

  struct Case {
    ConnectorKind connector;
    int a, f, s;
  };
  for (Case k : {Case{ConnectorKind::kSync, 2, 2, 2}, Case{ConnectorKind::kAsync, 1, 2, 1}}) {
    EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
    o.quantized = q->get();
    auto job = run_inproc_engine_job(*ckpt, dev, requests(ckpt->config().vocab_size), 16, o);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    ASSERT_EQ(job->results.size(), mono.size());
    for (size_t r = 0; r < mono.size(); ++r) {
      EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r << " " << k.a << "A" << k.f << "F";
      EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r << " " << k.a << "A" << k.f << "F";
    }
  }
}

// Quantized weights with the quantized dispatch: the FFN ranks' quantized experts compute from the rows (W8A8
// from int8 codes as they are, other schemes from the rows' decoding); AFD equals the monolithic engine with the
// same flags, and with the int8 representation (W8A8's own activations) also the bf16 dispatch's bits.
TEST_P(QuantWeightsAfd, quantized_dispatch_with_quantized_weights_equals_monolithic) {
  if (GetParam().v4_fp8_form) GTEST_SKIP() << "the bf16 form covers the dispatch";
  testing::TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint(GetParam().preset, 3, dir / "m").ok());
  auto ckpt = model::Checkpoint::open(dir / "m");
  ASSERT_TRUE(ckpt.ok());
  for (const char* scheme : {"auto", "w8a8"}) {
    runtime::DeviceConfig dc;
    dc.weight_quant = scheme;
    const runtime::DeviceOperator bf16_dispatch = runtime::DeviceOperator::create(dc).value();
    dc.moe_dispatch = "quantized";
    const runtime::DeviceOperator dev = runtime::DeviceOperator::create(dc).value();
    auto q = model::QuantizedWeights::quantize(*ckpt, *dev.weight_quant(), dev.contract().weight_quant.layers);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const auto mono = monolithic(*ckpt, dev, q->get());
    const auto mono_bf16_dispatch = monolithic(*ckpt, bf16_dispatch, q->get());
    ASSERT_EQ(mono.size(), mono_bf16_dispatch.size());
    const bool lossless = dev.moe_dispatch()->activations == runtime::ActivationQuant::kPerTokenInt8 &&
                          dev.weight_quant()->scheme == ops::WeightQuantScheme::kW8A8;
    if (lossless) {
      for (size_t r = 0; r < mono.size(); ++r) {
        EXPECT_EQ(mono[r].logits, mono_bf16_dispatch[r].logits) << scheme << " request " << r;
      }
    } else {
      EXPECT_NE(mono[0].logits, mono_bf16_dispatch[0].logits) << scheme;
    }
    EngineJobOptions o = engine_job_case(ConnectorKind::kAsync, 2, 2, 2);
    o.quantized = q->get();
    auto job = run_inproc_engine_job(*ckpt, dev, requests(ckpt->config().vocab_size), 16, o);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    ASSERT_EQ(job->results.size(), mono.size());
    for (size_t r = 0; r < mono.size(); ++r) {
      EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << scheme << " request " << r;
      EXPECT_EQ(job->results[r].logits, mono[r].logits) << scheme << " request " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, QuantWeightsAfd,
                         ::testing::Values(Model{"tiny"}, Model{"tiny-qwen35"}, Model{"tiny-dsv4"},
                                           Model{"tiny-dsv4", true}),
                         [](const auto& info) {
                           std::string name = info.param.preset;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return info.param.v4_fp8_form ? name + "_fp8_form" : name;
                         });

}  // namespace
}  // namespace genbridge::afd
