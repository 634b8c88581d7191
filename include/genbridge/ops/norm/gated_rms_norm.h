#pragma once
// Stable operator norm/gated_rms_norm: the output norm of a Gated DeltaNet layer (Qwen3.5 linear attention),
// a plain-weight RMSNorm gated by silu(z).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// Over the last dimension D of x (one row per value head), in fp32:
//   n = x * (1 / sqrtf(mean(x^2) + eps));  n' = n rounded to x's dtype;  y = (w * n') * silu(z)
// with silu(z) = z / (1 + expf(-z)), each step rounded to fp32, the result rounded once (RNE) to y's dtype
// (Hugging Face's Qwen3_5MoeRMSNormGated, norm before gate). mean(x^2) = sumsq / D with sumsq in this order:
// 16 lane sums, lane l adding x[i]^2 for i = l, l + 16, ... over the whole blocks of 16 (from +0); then
// s8[l] = lane[l] + lane[l + 8], s4[l] = s8[l] + s8[l + 4], (s4[0] + s4[2]) + (s4[1] + s4[3]); then the
// last D mod 16 squares added in order.
//   x, z: [..., D] fp32/bf16 of the same shape, any strides (unit last); w: [D] fp32/bf16 (the checkpoint
//   keeps it in fp32); y: x's shape, fp32/bf16, must not overlap x or z; eps finite >= 0. Validates
//   everything before writing; does not retain views.
Status gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& y);

}  // namespace genbridge::ops
