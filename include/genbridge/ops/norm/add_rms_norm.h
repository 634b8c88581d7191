#pragma once
// Stable operator norm/add_rms_norm (docs/design.md#stable-operator-contracts).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// residual_sum = x + residual (rounded to x's dtype); y = rms_norm(residual_sum, gamma, eps).
// x, residual, y, residual_sum: same shape and dtype (fp32/fp16/bf16, any strides); gamma: x's trailing
// shape and dtype. residual_sum may alias residual exactly (in-place update of the residual stream);
// nothing else may alias. Does not retain views.
Status add_rms_norm(const TensorView& x, const TensorView& gamma, const TensorView& residual, float eps,
                    const TensorView& y, const TensorView& residual_sum);

}  // namespace genbridge::ops
