#pragma once
// Stable operator activation/silu_and_mul: the SwiGLU activation of a fused [gate | up] row.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// y[..., i] = silu(x[..., i]) * x[..., d + i] for i < d, computed in fp32 as (g / (1 + exp(-g))) * u and
// rounded once (RNE) to y's dtype. x: [..., 2d] fp32/bf16/fp16, any strides; y: x's leading shape + [d],
// fp32/bf16/fp16, any strides, must not overlap x. Same formula as moe/expert_ffn's activation, so
// linear(gate) + linear(up) into one [T, 2I] buffer, silu_and_mul, linear(down) reproduce expert_ffn bit
// for bit. Blocks until done; writes y only; does not retain any view.
Status silu_and_mul(const TensorView& x, const TensorView& y);

}  // namespace genbridge::ops
