#pragma once
// Stable operator norm/rms_norm (docs/design.md#stable-operator-contracts).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// y = x * rsqrt(mean(x^2) + eps) * gamma, normalising over the trailing gamma.rank() dimensions of x.
// x: fp32/fp16/bf16, any strides; gamma: x's trailing shape and dtype; y: x's shape and dtype;
// rstd: fp32 of shape x.shape[:-k] + [1]*k (k = gamma.rank()). Accumulates in fp32. Writes y and rstd
// only; does not retain any view. eps must be finite and >= 0.
Status rms_norm(const TensorView& x, const TensorView& gamma, float eps, const TensorView& y,
                const TensorView& rstd);

}  // namespace genbridge::ops
