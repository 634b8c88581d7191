#pragma once
// Stable operator linear_attention/gdn_gating: the per-token, per-value-head decay and write strength of a
// Gated DeltaNet layer (Qwen3.5 linear attention).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// For every token t and value head h, in fp32:
//   g[t, h]    = -expf(A_log[h]) * softplus(a[t, h] + dt_bias[h])     (log of the decay, <= 0)
//   beta[t, h] = 1 / (1 + expf(-b[t, h]))                              (sigmoid)
// with softplus(v) = v for v > 20 (torch's threshold) else log1pf(expf(v)); each step rounded to fp32.
//   a, b: [T, nv] fp32/bf16, any strides; A_log, dt_bias: [nv] fp32/bf16 (a checkpoint's dtype, kept);
//   g, beta: [T, nv] fp32. Validates everything before writing; does not retain views.
Status gdn_gating(const TensorView& a, const TensorView& b, const TensorView& A_log, const TensorView& dt_bias,
                  const TensorView& g, const TensorView& beta);

}  // namespace genbridge::ops
