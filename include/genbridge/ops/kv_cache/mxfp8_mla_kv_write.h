#pragma once
// Stable operator kv_cache/mxfp8_mla_kv_write: stores the rope part of new tokens as bf16 and quantizes the
// latent part to fp8 e4m3fn in groups of 64 with one power-of-two E8M0 scale byte per group, packed in one
// row padded to 128 bytes (MlaKvFormat::kMxfp8RopeFirstPacked, kv_cache/kv_format.h). DeepSeek-V4's shared
// K = V rows (448 latent + 64 rope: 640 bytes) are this representation on a generation with an FP8 data
// path; a generation without one implements it as the explicit unsupported provider (Unimplemented,
// naming the op and the generation).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// The smallest group amax the scale is computed from (the CANN kernels' floor: an all-zero group gets the
// byte 105, 2^-22, and no NaN).
inline constexpr float kMxfp8KvAmaxFloor = 1e-4f;

// latent: [num_tokens, kv_lora_rank] (kv_lora_rank a multiple of kMxKvScaleGroup), rope: [num_tokens,
// rope_dim], fp32/fp16/bf16, any strides. slot_mapping: int32 [num_tokens] flat slots. cache.format ==
// kMxfp8RopeFirstPacked with cache.kv_cache uint8 [num_blocks, block_size, mla_kv_row_bytes(...).main].
// Row: bf16(rope) (RNE) at bytes [0, 2 rope_dim); then per group g of 64 latent values x (as fp32):
//   v = fp32(max(amax(|x|) over non-NaN x, kMxfp8KvAmaxFloor) / 448); e = the smallest integer with
//   2^e >= v (the fp32 biased exponent of v, plus one when v's mantissa is non-zero), as the byte
//   min(e + 127, 254); code i = e4m3fn(fp32(x[i] / 2^(byte - 127))) RNE, saturated to +-448;
// the codes after the rope, the scale bytes after the codes, zero bytes to the row's end. Every group's
// amax lands in (224, 448] after scaling, so no finite value saturates. Tokens in order; validates
// everything before writing; does not retain views.
Status mxfp8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                          const MlaKvCache& cache);

}  // namespace genbridge::ops
