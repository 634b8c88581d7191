#pragma once
// Stable operator norm/add_gemma_rms_norm (docs/design.md#stable-operator-contracts). Argument order is (input, weight,
// residual, eps).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// residual_sum = x + residual (rounded to x's dtype); y = gemma_rms_norm(residual_sum, w, eps).
// Shapes, dtypes and aliasing as add_rms_norm. Tolerance: atol = rtol = 1e-2 for fp16.
Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum);

}  // namespace genbridge::ops
