// The quantized MoE dispatch in the forward pass: the routed experts compute from the rows route() quantized
// (ExpertBank::compute_dispatched). W8A8 experts take int8-per-token codes as they are, so with them the int8
// dispatch changes no bit; other experts compute from the rows' fp32 decoding. The monolithic engine with
// --moe-dispatch quantized runs the same quantization at the same point, so its logits are AFD's (tests/afd/).
// Runs in both target builds.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/device/moe_dispatch.h"
#include "runtime/engine/assembly.h"
#include "runtime/forward/runner.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using runtime::ActivationQuant;
using runtime::DispatchRepresentation;
using runtime::Generation;

struct Tiny {
  testing::TempDir dir;
  std::unique_ptr<Checkpoint> ckpt;
  Tiny() {
    EXPECT_TRUE(write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    ckpt = std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / "m")).value());
  }
};
Tiny& tiny() {
  static Tiny t;
  return t;
}

const DispatchRepresentation& int8_rows() { return runtime::contract_for(Generation::kAscend910).quantized_dispatch; }

// One MoE layer's routed experts on random inputs: x, the int8 rows of x, and routing over every expert.
struct LayerInput {
  int64_t T = 0, H = 0, k = 0, layer = 0;
  testing::OwnedTensor x{DType::kBF16, {1}}, ids{DType::kI32, {1}};
  std::vector<uint8_t> rows;
  std::vector<float> x32;
  LayerInput(const ModelConfig& c, int64_t tokens) : T(tokens), H(c.hidden_size), k(c.num_experts_per_tok) {
    while (!c.is_moe_layer(layer)) ++layer;
    x = testing::OwnedTensor(DType::kBF16, {T, H});
    testing::fill_uniform(x.view(), 41, -3.f, 3.f);
    ids = testing::OwnedTensor(DType::kI32, {T, k});
    auto* p = static_cast<int32_t*>(ids.data());
    for (int64_t i = 0; i < T * k; ++i) p[i] = static_cast<int32_t>((i * 5 + i / k) % c.num_experts);
    rows.resize(static_cast<size_t>(T * runtime::dispatch_row_bytes(int8_rows(), H)));
    x32.resize(static_cast<size_t>(T * H));
    EXPECT_TRUE(runtime::quantize_dispatch(int8_rows(), x.view(), this->rows_view()).ok());
  }
  TensorView rows_view() {
    return TensorView(rows.data(), DType::kU8, {T, runtime::dispatch_row_bytes(int8_rows(), H)});
  }
  TensorView x32_view() { return TensorView(x32.data(), DType::kF32, {T, H}); }
};

TEST(MoeDispatchExperts, w8a8_experts_take_int8_codes_as_they_are) {
  const Checkpoint& ckpt = *tiny().ckpt;
  const runtime::GenerationContract& c = runtime::contract_for(Generation::kAscend910);
  auto q = QuantizedWeights::quantize(ckpt, *c.weight_quant.find(ops::WeightQuantScheme::kW8A8), c.weight_quant.layers);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const ExpertBank bank(ckpt, q->get());
  const int64_t E = ckpt.config().num_experts;
  LayerInput in(ckpt.config(), 23);
  testing::OwnedTensor want(DType::kBF16, {in.T, in.k, in.H}), got(DType::kBF16, {in.T, in.k, in.H});
  ASSERT_TRUE(bank.compute(in.layer, in.x.view(), in.ids.view(), 0, E, want.view()).ok());
  std::fill(in.x32.begin(), in.x32.end(), -7.f);
  ASSERT_TRUE(
      bank.compute_dispatched(in.layer, int8_rows(), in.rows_view(), in.ids.view(), 0, E, got.view(), in.x32_view())
          .ok());
  EXPECT_EQ(got.bytes(), want.bytes());
  EXPECT_EQ(in.x32[0], -7.f);  // the codes went in as they are: nothing was decoded
}

TEST(MoeDispatchExperts, bf16_experts_compute_from_the_decoded_rows) {
  const Checkpoint& ckpt = *tiny().ckpt;
  const ExpertBank bank(ckpt);
  const int64_t E = ckpt.config().num_experts;
  LayerInput in(ckpt.config(), 9);
  testing::OwnedTensor want(DType::kBF16, {in.T, in.k, in.H}), got(DType::kBF16, {in.T, in.k, in.H}),
      plain(DType::kBF16, {in.T, in.k, in.H});
  std::vector<float> decoded(in.x32.size());
  ASSERT_TRUE(
      runtime::dequantize_dispatch(int8_rows(), in.rows_view(), TensorView(decoded.data(), DType::kF32, {in.T, in.H}))
          .ok());
  ASSERT_TRUE(
      bank.compute(in.layer, TensorView(decoded.data(), DType::kF32, {in.T, in.H}), in.ids.view(), 0, E, want.view())
          .ok());
  ASSERT_TRUE(
      bank.compute_dispatched(in.layer, int8_rows(), in.rows_view(), in.ids.view(), 0, E, got.view(), in.x32_view())
          .ok());
  EXPECT_EQ(got.bytes(), want.bytes());
  ASSERT_TRUE(bank.compute(in.layer, in.x.view(), in.ids.view(), 0, E, plain.view()).ok());
  EXPECT_NE(got.bytes(), plain.bytes());  // the quantization is in force
  EXPECT_EQ(bank.compute_dispatched(in.layer + 100, int8_rows(), in.rows_view(), in.ids.view(), 0, E, got.view(),
                                    in.x32_view())
                .message(),
            "experts: layer " + std::to_string(in.layer + 100) + " is not a MoE layer of this model");
}

std::vector<float> engine_logits(const runtime::DeviceOperator& dev, const QuantizedWeights* q) {
  const Checkpoint& ckpt = *tiny().ckpt;
  auto assembled = engine::assemble_engine(ckpt, dev, 16, {.engine = {.record_logits = true}, .quantized = q}, {});
  EXPECT_TRUE(assembled.ok()) << assembled.status().to_string();
  if (!assembled.ok()) return {};
  engine::Engine& eng = *(*assembled)->engine;
  for (int r = 0; r < 3; ++r) {
    engine::Request req;
    req.id = r;
    for (int i = 0; i < 5 + 4 * r; ++i) {
      req.prompt.push_back(static_cast<int32_t>(engine::uniform_from(13 + r, i) * ckpt.config().vocab_size));
    }
    req.max_new_tokens = 4;
    EXPECT_TRUE(eng.submit(req).ok());
  }
  EXPECT_TRUE(eng.run_to_completion().ok());
  std::vector<float> out;
  for (const auto& r : eng.results()) out.insert(out.end(), r.logits.begin(), r.logits.end());
  return out;
}

// The monolithic engine with --moe-dispatch quantized: bf16 experts see the quantization; W8A8 experts with the
// int8 representation (the build's, where it is int8) see none, so the logits are the bf16 dispatch's.
TEST(MoeDispatchEngine, monolithic_engine_quantizes_the_routed_experts_input) {
  runtime::DeviceConfig dc;
  const auto bf16 = runtime::DeviceOperator::create(dc).value();
  dc.moe_dispatch = "quantized";
  const auto quantized = runtime::DeviceOperator::create(dc).value();
  const std::vector<float> a = engine_logits(bf16, nullptr), b = engine_logits(quantized, nullptr);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a.size(), b.size());
  EXPECT_NE(a, b);

  dc.weight_quant = "w8a8";
  const auto w8a8_quantized = runtime::DeviceOperator::create(dc).value();
  dc.moe_dispatch = "bf16";
  const auto w8a8 = runtime::DeviceOperator::create(dc).value();
  auto q = QuantizedWeights::quantize(*tiny().ckpt, *w8a8.weight_quant(), w8a8.contract().weight_quant.layers);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const std::vector<float> c = engine_logits(w8a8, q->get()), d = engine_logits(w8a8_quantized, q->get());
  ASSERT_FALSE(c.empty());
  if (quantized.moe_dispatch()->activations == ActivationQuant::kPerTokenInt8) {
    EXPECT_EQ(c, d);
  } else {
    EXPECT_NE(c, d);  // MXFP8 rows, decoded, then quantized per token by W8A8
  }
}

}  // namespace
}  // namespace genbridge::model
