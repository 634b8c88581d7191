#pragma once
// Stable operator linear/linear: dense matmul with a Hugging Face Linear weight (out x in), for
// decode (a few rows) and prefill (thousands of rows) alike.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/linear/packed_weights.h"

namespace genbridge::ops {

// y[..., n] = sum_k x[..., k] * w[n, k] (+ bias[n]), accumulated in fp32, rounded once (RNE) to y's dtype.
// x: [..., K] fp32/bf16/fp16, any strides. w: [N, K] bf16 (fast path), fp16 or fp32, unit stride along K,
// any row stride. bias: optional [N] fp32/bf16/fp16 (nullptr: none). y: x's leading shape + [N],
// fp32/bf16/fp16, any strides, must not overlap x, w or bias. Batch-invariant: each y row is bit-identical
// whatever other rows share the call and whatever the thread count (fixed 16-lane fused multiply-add
// order along K, see docs/linear.md). Blocks until done; writes y only; does not retain any view.
// packed: optional, w packed (ops/linear/packed_weights.h; w bf16, packed->rows() x cols() = w's shape, else
// an error naming both): the kernel then reads the packed copy only, with the same bits.
Status linear(const TensorView& x, const TensorView& w, const TensorView& y, const TensorView* bias = nullptr,
              const PackedWeights* packed = nullptr);

}  // namespace genbridge::ops
