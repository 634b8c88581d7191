#include "ops/common/kv_cache/mla_layout.h"

#include <string>

#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail {
namespace {

// A contiguous host view of `dtype` with shape [nb, bs] + tail (tail < 0: rank 2).
Status check_view(const char* op, const char* name, const TensorView& t, DType dtype, int64_t nb, int64_t bs,
                  int64_t tail, std::string_view what) {
  if (t.dtype() != dtype) {
    return invalid_argument(s(op) + ": " + name + " has dtype " + s(dtype_name(t.dtype())) + " but the " + s(what) +
                            " cache stores " + s(dtype_name(dtype)));
  }
  const int rank = tail < 0 ? 2 : 3;
  bool ok = t.rank() == rank && (nb < 0 || t.dim(0) == nb) && (bs < 0 || t.dim(1) == bs) &&
            (rank == 2 || t.dim(2) == tail);
  if (!ok) {
    std::string want = "[" + (nb < 0 ? s("num_blocks") : n(nb)) + ", " + (bs < 0 ? s("block_size") : n(bs));
    if (rank == 3) want += ", " + n(tail);
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() + " but must be " + want + "]");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, name, t));
  if (!t.is_contiguous()) {
    return invalid_argument(s(op) + ": " + name + " is not contiguous; KV caches must be contiguous");
  }
  if (t.dim(0) < 1 || t.dim(1) < 1) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() +
                            "; num_blocks and block_size must be >= 1");
  }
  return ok_status();
}

DType storage_dtype(const KvRepresentation& r) {
  return r.scale_placement == KvScalePlacement::kPackedInRow ? DType::kU8 : r.element;
}

}  // namespace

Result<TokenCacheGeometry> check_mla_cache(const char* op, const MlaKvCache& c) {
  if (Status st = check_mla_dims(c.format, c.kv_lora_rank, c.rope_dim); !st.ok()) {
    return invalid_argument(s(op) + ": " + s(st.message()));
  }
  const KvRepresentation& r = kv_representation(c.format);
  const KvRowBytes rb = mla_kv_row_bytes(c.format, c.kv_lora_rank, c.rope_dim);
  const DType dt = storage_dtype(r);
  const int64_t row_elems = rb.main / static_cast<int64_t>(dtype_size(dt));
  GB_RETURN_IF_ERROR(check_view(op, "kv_cache", c.kv_cache, dt, -1, -1, row_elems, r.name));
  TokenCacheGeometry g;
  g.num_blocks = c.kv_cache.dim(0);
  g.block_size = c.kv_cache.dim(1);
  g.width = c.kv_lora_rank;
  g.rope_dim = c.rope_dim;
  g.row_bytes = rb.main;
  if (r.scale_placement == KvScalePlacement::kSeparateCache) {
    GB_RETURN_IF_ERROR(check_view(op, "scale_cache", c.scale_cache, r.scale, g.num_blocks, g.block_size, -1, r.name));
  }
  if (r.rope_placement == KvRopePlacement::kSeparateCache) {
    GB_RETURN_IF_ERROR(
        check_view(op, "rope_cache", c.rope_cache, DType::kBF16, g.num_blocks, g.block_size, c.rope_dim, r.name));
  }
  return g;
}

Result<TokenCacheGeometry> check_indexer_cache(const char* op, const IndexerKeyCache& c) {
  if (Status st = check_indexer_dims(c.format, c.head_dim); !st.ok()) {
    return invalid_argument(s(op) + ": " + s(st.message()));
  }
  const KvRepresentation& r = kv_representation(c.format);
  const KvRowBytes rb = indexer_key_row_bytes(c.format, c.head_dim);
  const DType dt = storage_dtype(r);
  GB_RETURN_IF_ERROR(check_view(op, "key_cache", c.key_cache, dt, -1, -1,
                                rb.main / static_cast<int64_t>(dtype_size(dt)), r.name));
  TokenCacheGeometry g;
  g.num_blocks = c.key_cache.dim(0);
  g.block_size = c.key_cache.dim(1);
  g.width = c.head_dim;
  g.row_bytes = rb.main;
  return g;
}

Status check_attention_batch(const char* op, const TensorView& block_tables, const TensorView& context_lens,
                             const TensorView& query_start_loc, int64_t num_tokens, int64_t num_blocks,
                             int64_t block_size) {
  GB_RETURN_IF_ERROR(check_int32(op, "block_tables", block_tables, 2, "[num_seqs, max_blocks_per_seq]"));
  const int64_t num_seqs = block_tables.dim(0), max_blocks = block_tables.dim(1);
  GB_RETURN_IF_ERROR(check_int32(op, "context_lens", context_lens, 1, "[num_seqs]"));
  if (context_lens.dim(0) != num_seqs) {
    return invalid_argument(s(op) + ": context_lens has shape " + context_lens.shape_string() + " but must be [" +
                            n(num_seqs) + "] (num_seqs, the rows of block_tables)");
  }
  GB_RETURN_IF_ERROR(check_query_start_loc(op, query_start_loc, num_seqs, num_tokens));
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t q_len = at_i32(query_start_loc, q + 1) - at_i32(query_start_loc, q);
    const int64_t ctx = at_i32(context_lens, q);
    if (ctx < q_len) {
      return invalid_argument(s(op) + ": sequence " + n(q) + " has " + n(q_len) + " query tokens but context length " +
                              n(ctx) + "; the context includes the query tokens");
    }
    if (ctx > max_blocks * block_size) {
      return invalid_argument(s(op) + ": sequence " + n(q) + " has context length " + n(ctx) + " but block_tables holds " +
                              n(max_blocks) + " blocks of " + n(block_size) + " tokens (" + n(max_blocks * block_size) +
                              ")");
    }
    if (q_len == 0) continue;
    const int64_t used = (ctx + block_size - 1) / block_size;
    for (int64_t b = 0; b < used; ++b) {
      const int64_t block = at_i32(block_tables, q, b);
      if (block < 0 || block >= num_blocks) {
        return invalid_argument(s(op) + ": block_tables[" + n(q) + "][" + n(b) + "] = " + n(block) +
                                " is not a block of the KV cache (num_blocks = " + n(num_blocks) + ")");
      }
    }
  }
  return ok_status();
}

Status check_slot_mapping(const char* op, const TensorView& sm, const SlotMapping* accepted, int64_t num_tokens,
                          int64_t num_blocks, int64_t block_size) {
  const char* want = accepted == nullptr                       ? "[num_tokens] (flat slots) or [num_tokens, 2] ([block, offset] pairs)"
                     : *accepted == SlotMapping::kFlat ? "[num_tokens] (flat slots)"
                                                       : "[num_tokens, 2] ([block, offset] pairs)";
  if (sm.dtype() != DType::kI32) {
    return invalid_argument(s(op) + ": slot_mapping has dtype " + s(dtype_name(sm.dtype())) + " but must be int32");
  }
  const bool flat_ok = (accepted == nullptr || *accepted == SlotMapping::kFlat) && sm.rank() == 1 &&
                       sm.dim(0) == num_tokens;
  const bool pairs_ok = (accepted == nullptr || *accepted == SlotMapping::kBlockOffsetPairs) && sm.rank() == 2 &&
                        sm.dim(0) == num_tokens && sm.dim(1) == 2;
  if (!flat_ok && !pairs_ok) {
    return invalid_argument(s(op) + ": slot_mapping has shape " + sm.shape_string() + " but must be " + want +
                            " with num_tokens = " + n(num_tokens));
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "slot_mapping", sm));
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (flat_ok) {
      const int64_t slot = at_i32(sm, t);
      if (slot < 0 || slot >= num_blocks * block_size) {
        return invalid_argument(s(op) + ": slot_mapping[" + n(t) + "] = " + n(slot) + " is outside the cache's " +
                                n(num_blocks * block_size) + " slots (num_blocks * block_size)");
      }
    } else {
      const int64_t b = at_i32(sm, t, 0), o = at_i32(sm, t, 1);
      if (b < 0 || b >= num_blocks || o < 0 || o >= block_size) {
        return invalid_argument(s(op) + ": slot_mapping[" + n(t) + "] = [" + n(b) + ", " + n(o) +
                                "] is outside the cache: block must be in [0, " + n(num_blocks) +
                                ") and offset in [0, " + n(block_size) + ")");
      }
    }
  }
  return ok_status();
}

int64_t slot_of(const TensorView& sm, int64_t t, int64_t block_size) {
  if (sm.rank() == 1) return at_i32(sm, t);
  return int64_t{at_i32(sm, t, 0)} * block_size + at_i32(sm, t, 1);
}

}  // namespace genbridge::ops::detail
