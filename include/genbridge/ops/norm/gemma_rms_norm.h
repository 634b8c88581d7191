#pragma once
// Stable operator norm/gemma_rms_norm (docs/design.md#stable-operator-contracts): the weight is an offset from one.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

inline constexpr float kGemmaRmsNormDefaultEps = 1e-6f;

// y = x * rsqrt(mean(x^2) + eps) * (1 + w) over the trailing w.rank() dimensions of x. Shapes and dtypes
// as rms_norm (w plays gamma). Tolerance against fp64: atol = rtol = 2e-2 for fp16/bf16, 1e-5 for fp32;
// providers may differ in the last bit for bf16/fp16 (where 1 + w is rounded). Does not retain views.
Status gemma_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                      const TensorView& rstd);

}  // namespace genbridge::ops
