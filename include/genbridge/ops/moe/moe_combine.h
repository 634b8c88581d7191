#pragma once
// Stable operator moe/moe_combine: the weighted sum of a token's per-slot expert outputs.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// out[t, :] = sum over j = 0..k-1, in that order, of topk_weights[t, j] * expert_out[t, j, :], in fp32
// starting from +0 (each product and each sum rounded once), then + sigmoid(shared_gate[t]) * shared_out[t, :]
// when shared_out is given (+ shared_out[t, :] alone when shared_gate is nullptr), rounded once (RNE) to
// out's dtype. expert_out: [T, k, H] fp32/bf16/fp16; topk_weights: [T, k] fp32; out: [T, H] fp32/bf16/fp16;
// shared_out: optional [T, H] fp32/bf16/fp16; shared_gate: optional [T, 1] or [T] fp32 gate logits
// (requires shared_out). Any strides; out must not overlap an input. Each row depends only on its own
// inputs, so a monolithic run and an attention-FFN disaggregated run give the same bits. Blocks until
// done; writes out only; retains nothing.
Status moe_combine(const TensorView& expert_out, const TensorView& topk_weights, const TensorView& out,
                   const TensorView* shared_out = nullptr, const TensorView* shared_gate = nullptr);

}  // namespace genbridge::ops
