#pragma once
// Stable operator moe/topk_router: softmax routing of tokens to their top-k experts.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// For each token t: p = softmax(logits[t, :]) in fp32 (max subtracted, exp, sum over experts in id order,
// divide); topk_ids[t, :] = the k experts with the largest p, best first, ties to the lower expert id;
// topk_weights[t, j] = p[topk_ids[t, j]], divided by their sum (taken in slot order) when
// norm_topk_prob. logits: [T, E] fp32/bf16/fp16, any strides; topk_ids: [T, k] int32; topk_weights:
// [T, k] fp32 (k = topk_ids' last dimension, 1 <= k <= E); outputs any strides, not overlapping the
// inputs or each other. Ids are always distinct and in [0, E), even for NaN logits. Deterministic and
// independent of T and the thread count. Blocks until done; writes the outputs only; retains nothing.
Status topk_router(const TensorView& logits, bool norm_topk_prob, const TensorView& topk_ids,
                   const TensorView& topk_weights);

}  // namespace genbridge::ops
