#pragma once
// Internal: argument checks shared by the MLA / DSA operators (kv_cache/*_mla_kv_write,
// kv_cache/*_indexer_key_write, attention/mla_decode, sparse_mla_decode, lightning_indexer). Generic:
// representations from kv_cache/kv_format.h, never targets.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

// Geometry of a validated token-major cache ([num_blocks, block_size, row]).
struct TokenCacheGeometry {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t width = 0;      // kv_lora_rank (MLA) or index_head_dim (indexer)
  int64_t rope_dim = 0;   // MLA only
  int64_t row_bytes = 0;  // bytes of one main-cache row (kv_row_bytes(...).main)
  int64_t num_slots() const { return num_blocks * block_size; }
};

// Validates an MLA cache: format `want` (InvalidArgument naming op when the cache has another one), the
// dimensions (check_mla_kv_dims), dtypes, shapes, contiguity and host data of every view it uses.
Result<TokenCacheGeometry> check_mla_cache(const char* op, const MlaKvCache& cache);
// Validates an indexer key cache the same way.
Result<TokenCacheGeometry> check_indexer_cache(const char* op, const IndexerKeyCache& cache);

// Validates the batch description of attention/paged_decode against `num_tokens` query tokens and a
// cache of num_blocks blocks of block_size tokens (the same rules and messages as paged_decode).
Status check_attention_batch(const char* op, const TensorView& block_tables, const TensorView& context_lens,
                             const TensorView& query_start_loc, int64_t num_tokens, int64_t num_blocks,
                             int64_t block_size);

// Validates a slot mapping for `num_tokens` tokens: `accepted` or, when null, either form (by rank); every
// slot inside a cache of num_blocks x block_size.
Status check_slot_mapping(const char* op, const TensorView& slot_mapping, const SlotMapping* accepted,
                          int64_t num_tokens, int64_t num_blocks, int64_t block_size);
// The flat slot of token t of a validated slot mapping.
int64_t slot_of(const TensorView& slot_mapping, int64_t t, int64_t block_size);

}  // namespace genbridge::ops::detail
