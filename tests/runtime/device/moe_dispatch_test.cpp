// The quantized MoE dispatch in the DeviceOperator: the representation per generation is data in
// GenerationContract, --moe-dispatch resolution (a generation without one refuses "quantized"), the log line, and
// the rows (runtime/device/moe_dispatch.h): their bytes, layout, padding, quantization (the stable ops' bits) and
// decoding. Runs in both target builds; the MXFP8 rows need the build's MX data path.
#include "runtime/device/moe_dispatch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "genbridge/ops/quant/mx_dequant.h"
#include "support/tensor_util.h"

namespace genbridge::runtime {
namespace {

using testing::OwnedTensor;

Generation build_generation() { return generation_from_target(ops::build_target()).value(); }
const DispatchRepresentation& int8_rows() { return contract_for(Generation::kAscend910).quantized_dispatch; }
const DispatchRepresentation& mxfp8_rows() { return contract_for(Generation::kAscend950).quantized_dispatch; }

TEST(MoeDispatchContract, representations_per_generation) {
  const DispatchRepresentation& a2 = int8_rows();
  EXPECT_EQ(a2.activations, ActivationQuant::kPerTokenInt8);
  EXPECT_EQ(a2.element, DType::kI8);
  EXPECT_EQ(a2.scale_dtype, DType::kF32);
  EXPECT_EQ(a2.block, 0);
  EXPECT_EQ(a2.scale_layout, MxScaleLayout::kNone);
  // W8A8's activations: the experts of the generation's preferred scheme take these codes as they are.
  EXPECT_EQ(a2.activations,
            contract_for(Generation::kAscend910).weight_quant.find(ops::WeightQuantScheme::kW8A8)->activations);
  const GenerationContract& a5c = contract_for(Generation::kAscend950);
  const DispatchRepresentation& a5 = a5c.quantized_dispatch;
  EXPECT_EQ(a5.activations, ActivationQuant::kMxfp8);
  EXPECT_EQ(a5.element, DType::kFp8E4M3FN);
  EXPECT_EQ(a5.scale_dtype, DType::kE8M0);
  EXPECT_EQ(a5.block, 32);
  EXPECT_EQ(a5.scale_layout, a5c.mx_scale_layout);  // the generation's MX scale layout
}

TEST(MoeDispatchContract, resolution_and_refusal) {
  for (Generation g : {Generation::kAscend910, Generation::kAscend950}) {
    const GenerationContract& c = contract_for(g);
    EXPECT_EQ(resolve_moe_dispatch(c, "bf16").value(), nullptr);
    EXPECT_EQ(resolve_moe_dispatch(c, "quantized").value(), &c.quantized_dispatch);
    EXPECT_EQ(resolve_moe_dispatch(c, "int8").status().message(), "--moe-dispatch=int8 is not one of bf16, quantized");
  }
  // A generation without an activation representation refuses quantized dispatch, naming itself.
  GenerationContract none = contract_for(Generation::kAscend910);
  none.quantized_dispatch.activations = ActivationQuant::kNone;
  const auto refused = resolve_moe_dispatch(none, "quantized");
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "--moe-dispatch=quantized: Ascend910 (A2/A3) has no quantized activation representation for the MoE "
            "dispatch; use --moe-dispatch=bf16");
  EXPECT_EQ(resolve_moe_dispatch(none, "bf16").value(), nullptr);
}

TEST(MoeDispatchContract, device_operator_and_log_line) {
  DeviceConfig dc;
  EXPECT_EQ(DeviceOperator::create(dc)->moe_dispatch(), nullptr);
  dc.moe_dispatch = "quantized";
  auto dev = DeviceOperator::create(dc);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  EXPECT_EQ(dev->moe_dispatch(), &contract_for(build_generation()).quantized_dispatch);
  const bool int8 = dev->moe_dispatch()->activations == ActivationQuant::kPerTokenInt8;
  EXPECT_NE(dev->log_line().find(int8 ? "| MoE dispatch (moe_dispatch=quantized): int8 + fp32 scale per token (H + 4 B "
                                        "per token)"
                                      : "| MoE dispatch (moe_dispatch=quantized): mxfp8: fp8 e4m3fn + e8m0 scale per "
                                        "32, pair layout (H + H/32 B per token)"),
            std::string::npos)
      << dev->log_line();
  dc.moe_dispatch = "fp8";
  EXPECT_EQ(DeviceOperator::create(dc).status().message(), "--moe-dispatch=fp8 is not one of bf16, quantized");
}

// Codes, zero padding to 4, scales, zero padding to 4.
TEST(MoeDispatchRows, bytes_per_row) {
  EXPECT_EQ(dispatch_row_bytes(int8_rows(), 7168), 7168 + 4);
  EXPECT_EQ(dispatch_row_bytes(int8_rows(), 64), 68);
  EXPECT_EQ(dispatch_row_bytes(int8_rows(), 30), 32 + 4);
  EXPECT_EQ(dispatch_scale_offset(30), 32);
  EXPECT_EQ(dispatch_row_bytes(mxfp8_rows(), 7168), 7168 + 224);  // 224 blocks of 32: 112 pairs
  EXPECT_EQ(dispatch_row_bytes(mxfp8_rows(), 64), 68);            // 2 blocks: one pair, 2 B of padding
  EXPECT_EQ(dispatch_row_bytes(mxfp8_rows(), 96), 100);           // 3 blocks: 2 pairs, the last slot padded
  EXPECT_EQ(dispatch_row_bytes(mxfp8_rows(), 30), 32 + 4);
}

// The codes and scale of each row are quant/dynamic_quant_per_token's; the padding between them is zero; decoding
// is fl32(q * scale).
TEST(MoeDispatchRows, int8_per_token_rows_hold_the_ops_bits) {
  const int64_t T = 5, H = 30, row = dispatch_row_bytes(int8_rows(), H);
  OwnedTensor x(DType::kBF16, {T, H});
  testing::fill_uniform(x.view(), 3, -4.f, 4.f);
  std::vector<uint8_t> rows(static_cast<size_t>(T * row), 0xAB);
  const TensorView rv(rows.data(), DType::kU8, {T, row});
  ASSERT_TRUE(quantize_dispatch(int8_rows(), x.view(), rv).ok());
  OwnedTensor q(DType::kI8, {T, H}), s(DType::kF32, {T});
  ASSERT_TRUE(ops::dynamic_quant_per_token(x.view(), ops::kDynamicQuantPerTokenDefaultEps, q.view(), s.view()).ok());
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* r = rows.data() + t * row;
    EXPECT_EQ(std::memcmp(r, static_cast<std::byte*>(q.data()) + t * H, H), 0) << t;
    EXPECT_EQ(r[30], 0);
    EXPECT_EQ(r[31], 0);
    EXPECT_EQ(std::memcmp(r + 32, static_cast<float*>(s.data()) + t, 4), 0) << t;
  }
  std::vector<float> y(static_cast<size_t>(T * H));
  ASSERT_TRUE(dequantize_dispatch(int8_rows(), rv, TensorView(y.data(), DType::kF32, {T, H})).ok());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      const float want =
          static_cast<float>(static_cast<int8_t*>(q.data())[t * H + c]) * static_cast<float*>(s.data())[t];
      EXPECT_EQ(y[t * H + c], want);
    }
  }
}

// MXFP8 rows: quant/dynamic_mx_quant's codes and pair-layout scales (MxScaleAlg::kCeil), zero padding, decoding
// by quant/mx_dequant. A generation without an MX data path refuses them with the op's Unimplemented.
TEST(MoeDispatchRows, mxfp8_rows_hold_the_ops_bits) {
  const int64_t T = 4, H = 96, row = dispatch_row_bytes(mxfp8_rows(), H);
  OwnedTensor x(DType::kBF16, {T, H});
  testing::fill_uniform(x.view(), 5, -300.f, 300.f);
  std::vector<uint8_t> rows(static_cast<size_t>(T * row), 0xAB);
  const TensorView rv(rows.data(), DType::kU8, {T, row});
  const Status st = quantize_dispatch(mxfp8_rows(), x.view(), rv);
  if (ops::build_target() != std::string_view("Ascend950")) {
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.to_string();
    return;
  }
  ASSERT_TRUE(st.ok()) << st.to_string();
  OwnedTensor q(DType::kFp8E4M3FN, {T, H}), s(DType::kE8M0, {T, 2, 2});
  const ops::MxQuantConfig cfg{.block_size = 32, .dst = DType::kFp8E4M3FN, .scale_alg = ops::MxScaleAlg::kCeil};
  ASSERT_TRUE(ops::dynamic_mx_quant(x.view(), cfg, q.view(), s.view()).ok());
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* r = rows.data() + t * row;
    EXPECT_EQ(std::memcmp(r, static_cast<std::byte*>(q.data()) + t * H, H), 0) << t;
    EXPECT_EQ(std::memcmp(r + 96, static_cast<std::byte*>(s.data()) + t * 4, 4), 0) << t;  // 3 scales + pad slot
  }
  std::vector<float> y(static_cast<size_t>(T * H)), want(static_cast<size_t>(T * H));
  ASSERT_TRUE(dequantize_dispatch(mxfp8_rows(), rv, TensorView(y.data(), DType::kF32, {T, H})).ok());
  ASSERT_TRUE(ops::mx_dequant(q.view(), s.view(), 32, TensorView(want.data(), DType::kF32, {T, H})).ok());
  EXPECT_EQ(y, want);
  // H = 30: one block, padding after the codes and after the scale pair.
  std::vector<uint8_t> short_rows(static_cast<size_t>(T * 36), 0xAB);
  OwnedTensor x30(DType::kBF16, {T, 30});
  testing::fill_uniform(x30.view(), 6, -1.f, 1.f);
  ASSERT_TRUE(quantize_dispatch(mxfp8_rows(), x30.view(), TensorView(short_rows.data(), DType::kU8, {T, 36})).ok());
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* r = short_rows.data() + t * 36;
    EXPECT_EQ(r[30] | r[31] | r[33] | r[34] | r[35], 0) << t;  // r[32]: the block's scale, r[33]: the pair's pad slot
  }
}

TEST(MoeDispatchRows, invalid_rows) {
  const int64_t H = 64;
  std::vector<uint32_t> buf(64);
  OwnedTensor x(DType::kBF16, {2, H});
  EXPECT_EQ(dispatch_views(int8_rows(), TensorView(buf.data(), DType::kU8, {2, 64}), H).status().message(),
            "moe dispatch: rows must be uint8 [T, 68] (rows of 64 elements, back to back), got uint8 [2, 64]");
  EXPECT_EQ(dispatch_views(int8_rows(), TensorView(buf.data(), DType::kBF16, {2, 68}), H).status().message(),
            "moe dispatch: rows must be uint8 [T, 68] (rows of 64 elements, back to back), got bf16 [2, 68]");
  const TensorView misaligned(reinterpret_cast<uint8_t*>(buf.data()) + 1, DType::kU8, {2, 68});
  EXPECT_EQ(quantize_dispatch(int8_rows(), x.view(), misaligned).message(),
            "moe dispatch: rows must start at a multiple of 4 bytes (the scales are read in place)");
  const TensorView rows(buf.data(), DType::kU8, {2, 68});
  std::vector<float> y(3 * H);
  EXPECT_EQ(dequantize_dispatch(int8_rows(), rows, TensorView(y.data(), DType::kF32, {3, H})).message(),
            "moe dispatch: y must be fp32 [2, H] (one row per row of the dispatch), got fp32 [3, 64]");
  DispatchRepresentation none = int8_rows();
  none.activations = ActivationQuant::kNone;
  EXPECT_EQ(dispatch_views(none, rows, H).status().message(),
            "moe dispatch: the representation has no quantized activations (activations = none)");
}

}  // namespace
}  // namespace genbridge::runtime
