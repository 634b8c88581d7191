#pragma once
// Stable operator moe/grouped_topk_router: DeepSeek-V3 routing (sigmoid scores, a selection-only
// correction bias, group-limited top-k, optional renormalisation and a routed scaling factor).

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

struct GroupedTopkParams {
  int64_t n_group = 1;     // experts form n_group groups of E / n_group consecutive ids
  int64_t topk_group = 1;  // groups a token may pick experts from, 1 <= topk_group <= n_group
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// For each token t, in fp32:
//   s[e] = 1 / (1 + exp(-logits[t, e]))                       (the expert's score)
//   c[e] = s[e] + bias[e]                                        (selection score; c = s without a bias)
//   group g's score = the sum of its two largest c (largest first; the one c for a group of one expert)
//   the topk_group groups with the largest scores are kept (ties to the lower group id)
//   topk_ids[t, :] = the k experts of the kept groups with the largest c, best first, ties to the lower id
//   topk_weights[t, j] = s[topk_ids[t, j]] (the bias never weights), divided by (their sum in slot order
//     + 1e-20) when norm_topk_prob, then multiplied by routed_scaling_factor.
// logits: [T, E] fp32/bf16/fp16, any strides; bias: [E] fp32/bf16/fp16 or an empty view (no bias);
// topk_ids: [T, k] int32; topk_weights: [T, k] fp32 (k = topk_ids' last dimension,
// 1 <= k <= topk_group * E / n_group; n_group divides E); outputs any strides, not overlapping the
// inputs or each other. Ids are distinct and in [0, E) even for NaN logits. Deterministic and independent
// of T and the thread count. Blocks until done; writes the outputs only; retains nothing.
Status grouped_topk_router(const TensorView& logits, const TensorView& bias, const GroupedTopkParams& params,
                           const TensorView& topk_ids, const TensorView& topk_weights);

}  // namespace genbridge::ops
