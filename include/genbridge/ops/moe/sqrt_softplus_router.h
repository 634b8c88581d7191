#pragma once
// Stable operator moe/sqrt_softplus_router: DeepSeek-V4's routing. Scores are sqrt(softplus(logit)); the
// experts are either the top-k of the scores plus a selection-only bias, or given per token (hash routing:
// the ids a layer's tid2eid table holds for the token).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// For each token t (all fp32): s[e] = sqrt(softplus(logits[t, e])) with softplus(x) = x for x > 20, else
// log1p(exp(x)) (torch's threshold). Selection:
//   hash_ids given (int32 [T, k], any strides): topk_ids[t, :] = hash_ids[t, :] in their order; each id
//     must lie in [0, E) (InvalidArgument naming the token, the slot and the id otherwise; repeats allowed);
//   else: the k experts with the largest s[e] + bias[e] (bias: fp32 [E], or an empty view for none), best
//     first, ties to the lower expert id; NaN sorts below every number.
// topk_weights[t, j] = s[topk_ids[t, j]] / (sum_j s[topk_ids[t, j]] + 1e-20) * routed_scaling_factor when
// renormalize (the sum taken in slot order), else s[topk_ids[t, j]] * routed_scaling_factor.
// logits: [T, E] fp32/bf16/fp16, any strides; topk_ids: [T, k] int32; topk_weights: [T, k] fp32 (1 <= k <=
// E); outputs any strides, not overlapping the inputs or each other. routed_scaling_factor finite > 0.
// Deterministic and independent of T and the thread count. Validates everything before writing. Blocks
// until done; retains nothing.
Status sqrt_softplus_router(const TensorView& logits, const TensorView& bias, const TensorView& hash_ids,
                            bool renormalize, float routed_scaling_factor, const TensorView& topk_ids,
                            const TensorView& topk_weights);

}  // namespace genbridge::ops
