#pragma once
// Stable operator linear_attention/causal_conv1d: the causal depthwise convolution of a Gated DeltaNet
// layer (Qwen3.5 linear attention), over a chunk of new tokens per sequence, carrying each sequence's last
// kernel - 1 inputs in a state slot between calls (prefill of a whole prompt and one-token decode alike).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// For every sequence s (rows [query_start_loc[s], query_start_loc[s+1]) of x, consecutive time steps) and
// channel c, with K = weight.dim(1) and the sequence's history h = conv_state[state_indices[s]] (the K - 1
// inputs before the chunk, oldest first; all zeros for a fresh sequence):
//   xp = h[0..K-2, c] ++ x[rows, c]                      (K - 1 + q_len inputs)
//   y[t, c] = silu( sum_{j=0..K-1} weight[c, j] * xp[t + j, c] )   for t = 0..q_len-1,
// each product and the running sum (j increasing, from +0) in fp32, silu(a) = a / (1 + expf(-a)) in fp32,
// rounded once (RNE) to y's dtype. Then the state slot receives the last K - 1 entries of xp (rounded to
// the state's dtype), so the next call continues the sequence.
//   x: [T, C] fp32/bf16, rows unit-stride; weight: [C, K] fp32/bf16 (HF conv1d.weight [C, 1, K] viewed as
//   [C, K]), 2 <= K <= 8; conv_state: [num_slots, K - 1, C] bf16 or fp32, contiguous (the DeviceOperator's
//   state contract; any other shape, dtype or layout is InvalidArgument naming it); state_indices: int32 [S],
//   each in [0, num_slots), distinct; query_start_loc: int32 [S + 1], 0 first, non-decreasing, T last; y:
//   [T, C] fp32/bf16, must not overlap x or the state. A sequence's rows depend only on its own inputs and
//   state (batch-invariant, bit-identical across thread counts and CPU targets). Validates everything before
//   writing; does not retain views.
Status causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                     const TensorView& state_indices, const TensorView& query_start_loc, const TensorView& y);

}  // namespace genbridge::ops
