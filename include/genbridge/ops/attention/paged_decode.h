#pragma once
// Stable operator attention/paged_decode: attention of query tokens against a paged KV cache, for
// decode (one query token per sequence) and chunked prefill (several, causally masked).

#include <array>
#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// One layer's K and V caches: the representations are listed in kv_cache/kv_format.h (KvCacheFormat).
// Every cache is contiguous and head-major inside a page ("HND": each (page, kv head) holds block_size
// consecutive rows, so decode streams them):
//   kBf16:             key/value_cache bf16 [num_blocks, num_kv_heads, block_size, head_dim].
//   kInt8Fp16Scale:    key/value_cache int8 [num_blocks, num_kv_heads, block_size, head_dim] plus
//                      key/value_scale_cache fp16 [num_blocks, num_kv_heads, block_size]: one scale per
//                      (token, kv head); element value = code * scale.
//   kFp8Fp32PackedScale: key/value_cache uint8 [num_blocks, num_kv_heads, block_size, head_dim + 4]:
//                      head_dim fp8 e4m3fn codes followed by that row's fp32 scale (little-endian).
// A token's slot is block * block_size + offset; its row for kv head h is [block, h, offset].

// Every head_dim paged_decode implements, in increasing order: those of real models (64: many small models,
// 80: Phi-2, 96: Phi-3, 112: Falcon/StableLM variants, 128: Llama/Qwen, 192: MLA-style latent heads, 256:
// Gemma). Any other head_dim is Unimplemented; model loaders refuse it up front.
inline constexpr std::array<int64_t, 7> kPagedDecodeHeadDims = {64, 80, 96, 112, 128, 192, 256};

// One layer's cache in one representation. Views only: the memory pool owns the bytes.
struct PagedKvCache {
  KvCacheFormat format = KvCacheFormat::kBf16;
  TensorView key_cache;
  TensorView value_cache;
  TensorView key_scale_cache;    // kInt8Fp16Scale only; ignored otherwise
  TensorView value_scale_cache;  // kInt8Fp16Scale only; ignored otherwise
};

// out = softmax(scale * q k^T) v per query token and query head, reading K/V through block tables.
// query: [num_query_tokens, num_heads, head_dim] fp32/fp16/bf16, any strides; the tokens of sequence s
//   are rows [query_start_loc[s], query_start_loc[s+1]). num_heads is a multiple of num_kv_heads (GQA:
//   query head h reads kv head h / (num_heads / num_kv_heads)). head_dim is one of kPagedDecodeHeadDims.
// block_tables: int32 [num_seqs, max_blocks_per_seq]; context_lens: int32 [num_seqs], the number of
//   cached tokens of each sequence including its query tokens; query_start_loc: int32 [num_seqs + 1],
//   0 first, non-decreasing, num_query_tokens last. Query i of a sequence with q_len queries and context
//   length L sits at position L - q_len + i and attends to positions <= its own (causal).
// out: query's shape, fp32 or bf16, any strides. Scores and softmax accumulate in fp32; the result is
// bit-identical across runs and thread counts, and a query's result does not depend on the other
// sequences or query tokens in the call. Validates everything before writing; does not retain views.
Status paged_decode(const TensorView& query, const PagedKvCache& cache, const TensorView& block_tables,
                    const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                    const TensorView& out);

}  // namespace genbridge::ops
