#pragma once
// Stable operator linear/quant_linear: a dense matmul whose weight (Hugging Face Linear layout, out x in)
// is held in a quantized representation with its scales. Which representation a generation
// uses is the DeviceOperator's (runtime/device, GenerationContract::weight_quant); this op runs the one it
// is given, or returns Unimplemented when the build's generation has no data path for it.

#include <cstdint>
#include <string_view>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// The quantized weight representations.
enum class WeightQuantScheme : uint8_t {
  kNone,   // bf16 weights (linear/linear)
  kW8A8,   // int8 weights, one fp32 scale per output channel; activations int8 per token, dynamically
  kMxfp8,  // fp8 e4m3fn weights, one e8m0 scale per 32 along K in the pair layout; activations fp32
  kMxfp4,  // fp4 e2m1 weights two per byte, one e8m0 scale per 32 along K in the pair layout; activations fp32
};

// "none", "w8a8", "mxfp8", "mxfp4" (the spelling of --weight-quant).
constexpr std::string_view weight_quant_scheme_name(WeightQuantScheme s) {
  switch (s) {
    case WeightQuantScheme::kNone:
      return "none";
    case WeightQuantScheme::kW8A8:
      return "w8a8";
    case WeightQuantScheme::kMxfp8:
      return "mxfp8";
    case WeightQuantScheme::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

// Elements per MX scale block along K.
inline constexpr int64_t kMxWeightBlock = 32;
// Scale pairs per weight row of K inputs in the MX pair layout: ceil(ceil(K / 32) / 2).
constexpr int64_t mx_scale_pairs_of(int64_t k) { return ((k + kMxWeightBlock - 1) / kMxWeightBlock + 1) / 2; }
// Largest K for W8A8: the int32 accumulation of K products of +-127 is exact below 2^31.
inline constexpr int64_t kW8A8MaxK = (int64_t{1} << 31) / (127 * 127) - 1;

// A quantized weight matrix of N output channels and K inputs. Views only; nothing is owned.
//   kW8A8:  data int8 [N, K]; scale fp32 [N]. w[n, k] = data[n, k] * scale[n].
//   kMxfp8: data fp8_e4m3fn [N, K]; scale e8m0 [N, ceil(ceil(K / 32) / 2), 2] (the pair layout of
//           quant/dynamic_mx_quant and quant/normalize_mx_scale_layout).
//           w[n, k] = fl32(e4m3(data[n, k]) * 2^(scale[n, j / 2, j % 2] - 127)), j = k / 32.
//   kMxfp4: data fp4_e2m1x2 [N, K / 2] (K even, value 2i in the low nibble of byte i); scale as kMxfp8.
// data and scale: unit stride along their last dimension(s) (scale pairs contiguous), any row stride.
struct QuantWeight {
  WeightQuantScheme scheme = WeightQuantScheme::kNone;
  TensorView data;
  TensorView scale;
  int64_t in_features = 0;  // K (kMxfp4's data holds K / 2 bytes per row)
};

// y[..., n] = the scheme's quantized product of x[..., :] and weight row n, rounded once (RNE) to y's dtype:
//   kW8A8:  (qx, sx) = quant/dynamic_quant_per_token(x row, default eps);
//           acc = sum_k qx[k] * data[n, k] in int32 (exact: any order gives the same bits);
//           y = fl32(fl32(fl32(acc) * sx) * scale[n]).
//   kMxfp8, kMxfp4: y = linear/linear's fp32 reduction of x (widened to fp32) against the decoded fp32 row
//           w[n, :] above (16 lanes, fused multiply-add in increasing k, the contract's pairwise lane sum).
// x: [..., K] fp32/bf16/fp16, any strides; y: x's leading shape + [N], fp32/bf16/fp16, any strides, not
// overlapping the inputs. Batch-invariant: each y row is bit-identical whatever other rows share the call,
// the thread count and the CPU target. A NaN in an x row makes that row's W8A8 output NaN. Blocks until
// done; writes y only (nothing on error); does not retain any view. kNone is InvalidArgument (use
// linear/linear). A scheme the build's generation has no data path for returns Unimplemented naming it.
Status quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y);

// Quantizes a dense weight w [N, K] (fp32/bf16/fp16, unit stride along K) into `out`, whose data and scale
// views the caller allocated with the shapes above for out.scheme:
//   kW8A8:  (data, scale) = quant/dynamic_quant_per_token(w) (per output channel, scale = amax / 127).
//   kMxfp8: quant/dynamic_mx_quant(w, block 32, fp8_e4m3fn, MxScaleAlg::kCeil) (no element saturates).
//   kMxfp4: quant/dynamic_mx_quant(w, block 32, fp4_e2m1, MxScaleAlg::kOcpFloor) (the OCP rule).
// Same availability as quant_linear. Results do not depend on the thread count.
Status quantize_weight(const TensorView& w, const QuantWeight& out);

}  // namespace genbridge::ops
