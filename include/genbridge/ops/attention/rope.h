#pragma once
// Stable operator attention/rope: NeoX-style rotary position embedding, in place on q and k.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// Rotates the pairs (x[i], x[i + D/2]), i < D/2, of every head of query [num_tokens, num_q_heads, D] and
// key [num_tokens, num_kv_heads, D] IN PLACE by the angle a = fp32(fp32(positions[t]) * inv_freq_i),
// inv_freq_i = fp32(rope_theta^(-2i/D)) (the fp32 angle of Hugging Face / vLLM):
//   x[i] <- x[i] cos a - x[i + D/2] sin a,   x[i + D/2] <- x[i + D/2] cos a + x[i] sin a,
// computed in fp32 and rounded to the tensor's dtype. query and key: fp32/fp16/bf16, any strides (they
// may differ in dtype); D even and equal for both. positions: int32 or int64 [num_tokens], >= 0.
// rope_theta finite and > 1. Validates everything before writing; does not retain views.
Status rope(const TensorView& positions, const TensorView& query, const TensorView& key, float rope_theta);

}  // namespace genbridge::ops
