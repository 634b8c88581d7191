#pragma once
// Internal: shared argument checks for the paged KV-cache operators (kv_cache/* writers and
// attention/paged_decode). Generic: formats only, no targets.

#include <cstdint>
#include <string>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops::detail {

// Shape of a validated cache, in the layout of KvCacheFormat (head-major inside a page).
struct KvGeometry {
  int64_t num_blocks = 0;
  int64_t num_kv_heads = 0;
  int64_t block_size = 0;
  int64_t head_dim = 0;
  int64_t row_bytes = 0;  // bytes of one (token, kv head) row in key_cache (packed scale included)
  int64_t num_slots() const { return num_blocks * block_size; }
  // Row index of (block, kv head, offset) in units of rows.
  int64_t row(int64_t block, int64_t head, int64_t offset) const {
    return (block * num_kv_heads + head) * block_size + offset;
  }
};

// Validates K/V (and scale) caches for `cache.format`: dtypes, rank-4 shapes, contiguity, host data,
// K and V alike. Returns the geometry or InvalidArgument naming `op`, the value and the rule.
Result<KvGeometry> check_kv_cache(const char* op, const PagedKvCache& cache);

// The MLA and indexer-key dimension rules of the representation table (ops::check_mla_kv_dims and
// ops::check_indexer_key_dims, kv_cache/kv_format.h): InvalidArgument naming the dimension and the rule.
Status check_mla_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim);
Status check_indexer_dims(IndexerKeyFormat f, int64_t index_head_dim);

// Checks an int32 tensor of the given rank (named in messages) and host data.
Status check_int32(const char* op, const char* name, const TensorView& t, int rank, const char* layout);

// query_start_loc: int32 [num_seqs + 1], 0 first, non-decreasing, num_tokens last (each sequence's query
// rows are [query_start_loc[s], query_start_loc[s + 1])).
Status check_query_start_loc(const char* op, const TensorView& query_start_loc, int64_t num_seqs,
                             int64_t num_tokens);

// Element i (logical, row-major) of an int32 tensor of rank 1 or 2.
inline int32_t at_i32(const TensorView& t, int64_t i) { return t.data_as<const int32_t>()[i * t.stride(0)]; }
inline int32_t at_i32(const TensorView& t, int64_t i, int64_t j) {
  return t.data_as<const int32_t>()[i * t.stride(0) + j * t.stride(1)];
}

}  // namespace genbridge::ops::detail
