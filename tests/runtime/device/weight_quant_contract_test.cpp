// Quantized weights in the DeviceOperator: the representation per scheme is data in
// GenerationContract, --weight-quant resolution (auto = the generation's preferred scheme; a scheme the
// generation cannot run is refused naming the generation and what it offers), the log line, and the
// bytes a representation occupies. Runs in both target builds.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "genbridge/build_info.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "runtime/device/device_operator.h"

namespace genbridge::runtime {
namespace {

using ops::WeightQuantScheme;

Generation build_generation() { return generation_from_target(ops::build_target()).value(); }

TEST(WeightQuantContract, representations_per_generation) {
  const WeightQuantContract& a2 = contract_for(Generation::kAscend910).weight_quant;
  EXPECT_EQ(a2.preferred, WeightQuantScheme::kW8A8);
  ASSERT_EQ(a2.num_offered, 1);
  EXPECT_EQ(a2.find(WeightQuantScheme::kMxfp8), nullptr);
  EXPECT_EQ(a2.find(WeightQuantScheme::kMxfp4), nullptr);
  const WeightQuantRepresentation* w8 = a2.find(WeightQuantScheme::kW8A8);
  ASSERT_NE(w8, nullptr);
  EXPECT_EQ(w8->weight_element, DType::kI8);
  EXPECT_EQ(w8->scale_dtype, DType::kF32);
  EXPECT_EQ(w8->granularity, WeightScaleGranularity::kPerOutputChannel);
  EXPECT_EQ(w8->scale_layout, MxScaleLayout::kNone);
  EXPECT_EQ(w8->activations, ActivationQuant::kPerTokenInt8);

  const GenerationContract& a5c = contract_for(Generation::kAscend950);
  const WeightQuantContract& a5 = a5c.weight_quant;
  EXPECT_EQ(a5.preferred, WeightQuantScheme::kMxfp8);
  ASSERT_EQ(a5.num_offered, 3);  // A5 keeps W8A8 (documented in docs/quant_weights.md)
  ASSERT_NE(a5.find(WeightQuantScheme::kW8A8), nullptr);
  for (auto [s, elem] : {std::pair{WeightQuantScheme::kMxfp8, DType::kFp8E4M3FN},
                         std::pair{WeightQuantScheme::kMxfp4, DType::kFp4E2M1x2}}) {
    const WeightQuantRepresentation* r = a5.find(s);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->weight_element, elem);
    EXPECT_EQ(r->scale_dtype, DType::kE8M0);
    EXPECT_EQ(r->granularity, WeightScaleGranularity::kPerBlockAlongK);
    EXPECT_EQ(r->block_k, 32);
    EXPECT_EQ(r->block_k, ops::kMxWeightBlock);
    // The MX weights' scale layout is the generation's MX scale layout (docs/design.md#deviceoperator-contract).
    EXPECT_EQ(r->scale_layout, a5c.mx_scale_layout);
    EXPECT_EQ(r->activations, ActivationQuant::kNone);
  }
  for (const WeightQuantContract* w : {&a2, &a5}) {
    EXPECT_TRUE(w->layers.attention_projections);
    EXPECT_TRUE(w->layers.experts);
    EXPECT_TRUE(w->layers.shared_experts);
    EXPECT_FALSE(w->layers.router);
    EXPECT_FALSE(w->layers.lm_head);
    EXPECT_FALSE(w->layers.indexer_projections);
    EXPECT_NE(w->find(w->preferred), nullptr);
  }
}

TEST(WeightQuantContract, weight_bytes) {
  const WeightQuantContract& a5 = contract_for(Generation::kAscend950).weight_quant;
  // [N=4, K=96]: 3 blocks -> 2 pairs -> 4 scale bytes per row.
  EXPECT_EQ(quant_weight_bytes(*a5.find(WeightQuantScheme::kMxfp8), 4, 96), 4 * 96 + 4 * 4);
  EXPECT_EQ(quant_weight_bytes(*a5.find(WeightQuantScheme::kMxfp4), 4, 96), 4 * 48 + 4 * 4);
  EXPECT_EQ(4 * 2 * 2, 4 * ops::mx_scale_pairs(96, 32) * 2);
  EXPECT_EQ(quant_weight_bytes(*a5.find(WeightQuantScheme::kW8A8), 4, 96), 4 * 96 + 4 * 4);
}

TEST(WeightQuantContract, resolution) {
  const GenerationContract& a2 = contract_for(Generation::kAscend910);
  const GenerationContract& a5 = contract_for(Generation::kAscend950);
  EXPECT_EQ(resolve_weight_quant(a2, "none").value(), nullptr);
  EXPECT_EQ(resolve_weight_quant(a2, "auto").value()->scheme, WeightQuantScheme::kW8A8);
  EXPECT_EQ(resolve_weight_quant(a2, "w8a8").value()->scheme, WeightQuantScheme::kW8A8);
  EXPECT_EQ(resolve_weight_quant(a5, "auto").value()->scheme, WeightQuantScheme::kMxfp8);
  EXPECT_EQ(resolve_weight_quant(a5, "mxfp4").value()->scheme, WeightQuantScheme::kMxfp4);
  EXPECT_EQ(resolve_weight_quant(a5, "w8a8").value()->scheme, WeightQuantScheme::kW8A8);

  auto mx = resolve_weight_quant(a2, "mxfp4");
  ASSERT_FALSE(mx.ok());
  EXPECT_EQ(mx.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mx.status().message(),
            "--weight-quant=mxfp4: Ascend910 (A2/A3) cannot run mxfp4 weights; it offers w8a8 (auto = w8a8), or none "
            "for bf16 weights");
  auto bad = resolve_weight_quant(a5, "int4");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "--weight-quant=int4 is not one of none, auto, w8a8, mxfp8, mxfp4 (Ascend950 offers mxfp8, mxfp4, w8a8; "
            "auto = mxfp8)");
}

TEST(WeightQuantContract, device_operator_resolves_and_logs_it) {
  char tmpl[] = "/tmp/gb_wq_XXXXXX";
  const std::filesystem::path empty = ::mkdtemp(tmpl);
  DeviceConfig config;
  config.path_env = empty.string();
  config.weight_quant = "auto";
  auto dev = DeviceOperator::create(config);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  ASSERT_NE(dev->weight_quant(), nullptr);
  EXPECT_EQ(dev->weight_quant(), dev->contract().weight_quant.find(dev->contract().weight_quant.preferred));
  const bool a2 = build_generation() == Generation::kAscend910;
  EXPECT_NE(dev->log_line().find(a2 ? "weights (weight_quant=auto): w8a8 (int8 weights + fp32 scale per output "
                                      "channel, int8 activations per token)"
                                    : "weights (weight_quant=auto): mxfp8 (fp8 e4m3fn weights + e8m0 scale per 32 "
                                      "along K, pair layout)"),
            std::string::npos)
      << dev->log_line();
  config.weight_quant = a2 ? "mxfp8" : "fp8";
  auto refused = DeviceOperator::create(config);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  config.weight_quant = "none";
  EXPECT_EQ(DeviceOperator::create(config).value().weight_quant(), nullptr);
  std::filesystem::remove_all(empty);
}

}  // namespace
}  // namespace genbridge::runtime
