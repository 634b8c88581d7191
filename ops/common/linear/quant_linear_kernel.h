#pragma once
// Internal: linear/quant_linear's shared parts (argument checks, the W8A8 scheme every generation with an
// INT8 data path runs) and the work split the MX kernels reuse. The MX schemes' kernels are private to the
// generations that have an MX data path (ops/target_providers/<Target>/linear/), which each generation
// names in its MxSchemes (mx_schemes.h).

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/linear/quant_linear.h"

namespace genbridge::ops::detail {

// A generation's MX schemes (MXFP8, MXFP4): its kernels, or, where it has no MX data path, no kernels and
// the words of the Unimplemented sentence (quant_scheme_unimplemented).
// Both kernels take checked arguments (linear: M, N, K > 0).
struct MxSchemes {
  void (*linear)(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t M, int64_t N,
                 int64_t K) = nullptr;
  Status (*quantize_weight)(const TensorView& w, const QuantWeight& out) = nullptr;
  const char* generation = "";
  const char* offers = "";
};

// linear/quant_linear and linear/quantize_weight: W8A8 here, the MX schemes through `mx` (Unimplemented,
// before any other check, where it has none).
Status run_quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, const MxSchemes& mx);
Status run_quantize_weight(const TensorView& w, const QuantWeight& out, const MxSchemes& mx);

// Checks x, y and the weight views against the scheme's representation (quant_linear.h); sets M (rows of
// x), N and K. InvalidArgument naming quant_linear, the tensor, the value and the rule.
Status check_quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t& M, int64_t& N,
                          int64_t& K);
// Checks a dense weight and the destination views of quantize_weight; sets N and K.
Status check_quantize_weight(const TensorView& w, const QuantWeight& out, int64_t& N, int64_t& K);

// The W8A8 scheme (arguments already checked, M, N, K > 0).
void run_w8a8_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t M, int64_t N, int64_t K);
// W8A8's parts, shared with moe/quant_expert_ffn (which runs them for all its experts at once):
// the activations of x ([..., K], checked) quantized per token as quant_linear does, into qx ([M, K]
// row-major) and sx ([M]);
void w8a8_quantize_rows(const TensorView& x, int8_t* qx, float* sx);
// and the epilogue y = fl32(fl32(fl32(acc) * sx) * sw).
inline float w8a8_scale(int32_t acc, float sx, float sw) { return (static_cast<float>(acc) * sx) * sw; }
// Items of at most kW8A8ItemRows x kW8A8ItemCols outputs: the int8 kernel's row block, and int32 / fp32
// partials of an item that stay in L2 beside the block's activations and weights.
inline constexpr int64_t kW8A8ItemRows = 64, kW8A8ItemCols = 512;

// quantize_weight for W8A8 (arguments already checked).
Status run_w8a8_quantize_weight(const TensorView& w, const QuantWeight& out);

// y[r0 + i, c0 + j] = vals[i * ldv + j] rounded (RNE) to y's dtype, for i < m, j < n (y: [..., N], rows
// numbered over the leading dimensions).
void store_y_block(const TensorView& y, int64_t r0, int64_t m, int64_t c0, int64_t n, const float* vals, int64_t ldv);

// y = 0 for every row (an empty reduction, K == 0).
void store_zero_rows(const TensorView& y, int64_t M, int64_t N);

// The message of a scheme a generation has no data path for (the unsupported-provider pattern).
Status quant_scheme_unimplemented(const char* op, WeightQuantScheme s, const char* generation, const char* offers);

}  // namespace genbridge::ops::detail
