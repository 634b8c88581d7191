#pragma once
// Stable operator kv_cache/bf16_mla_kv_write: stores the MLA latent and rope key of new tokens into a bf16
// latent+rope paged cache (MlaKvFormat::kBf16, kv_cache/kv_format.h).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// latent: [num_tokens, kv_lora_rank], rope: [num_tokens, rope_dim], fp32/fp16/bf16 (rope may differ in
// dtype), any strides; rope_dim may be 0. slot_mapping: int32, flat [num_tokens] or [num_tokens, 2]
// ([block, offset] pairs). cache.format == kBf16 with cache.kv_cache bf16 [num_blocks, block_size,
// kv_lora_rank + rope_dim]. Writes row [block, offset] = (bf16(latent), bf16(rope)) (RNE) for every token;
// tokens in order (a repeated slot keeps the last). Validates every argument and slot before writing
// anything; does not retain views.
Status bf16_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                         const MlaKvCache& cache);

}  // namespace genbridge::ops
