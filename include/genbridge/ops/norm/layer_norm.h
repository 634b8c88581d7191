#pragma once
// Stable operator norm/layer_norm: LayerNorm with weight and bias over the last dimension (the DSA
// indexer's k_norm).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// y = (x - mean(x)) * rsqrt(var(x) + eps) * gamma + beta over the last dimension D of x, mean and the
// (biased) variance computed in fp32 in two passes. x: [..., D] fp32/fp16/bf16, any strides; gamma,
// beta: [D] fp32/fp16/bf16 (any float dtypes); y: x's shape, fp32/fp16/bf16, any strides (may be x itself:
// in place). eps finite and >= 0. Bit-identical across runs, thread counts and CPU targets; a row's
// result does not depend on the other rows. Validates everything before writing; does not retain views.
Status layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                  const TensorView& y);

}  // namespace genbridge::ops
