#pragma once
// Stable operator kv_cache/int8_mla_kv_write: quantizes the MLA latent of new tokens to int8 with one fp16
// scale per token in a separate scale cache, and stores the rope key as bf16 in its own cache
// (MlaKvFormat::kInt8Fp16ScaleSplitRope, kv_cache/kv_format.h).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// latent: [num_tokens, kv_lora_rank], rope: [num_tokens, rope_dim], fp32/fp16/bf16, any strides.
// slot_mapping: int32 [num_tokens, 2] ([block, offset] pairs). cache.format == kInt8Fp16ScaleSplitRope:
// kv_cache int8 [num_blocks, block_size, kv_lora_rank], scale_cache fp16 [num_blocks, block_size],
// rope_cache bf16 [num_blocks, block_size, rope_dim]. Per token: scale = fp16(fp32(max(amax(|latent|),
// kInt8KvScaleTinyAmax) / 127)), code = clamp(rne(fp32(x / scale)), -127, 127) (the rule of
// int8_kv_write, over the whole latent), rope = bf16(rope) (RNE). Tokens in order; validates everything
// before writing; does not retain views.
Status int8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                         const MlaKvCache& cache);

}  // namespace genbridge::ops
