#include "ops/common/kv_cache/kv_layout.h"

#include <string>

#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail {
namespace {

struct FormatInfo {
  DType dtype;
  std::string row_layout;  // names the last dimension
  int64_t extra;           // row elements beyond head_dim
};

// From the representation table (kv_cache/kv_format.h): a row with packed scale bytes is stored as uint8.
FormatInfo info(KvCacheFormat f) {
  const KvRepresentation& r = kv_representation(f);
  if (r.scale_placement == KvScalePlacement::kPackedInRow) {
    const int64_t extra = gqa_kv_row_bytes(f, 0).main;
    return {DType::kU8, "head_dim + " + std::to_string(extra), extra};
  }
  return {r.element, "head_dim", 0};
}

Status check_scale_cache(const char* op, const char* name, const TensorView& t, const KvGeometry& g) {
  if (t.dtype() != DType::kF16) {
    return invalid_argument(s(op) + ": " + name + " has dtype " + s(dtype_name(t.dtype())) +
                            " but the int8 KV cache keeps its scales in fp16");
  }
  if (t.rank() != 3 || t.dim(0) != g.num_blocks || t.dim(1) != g.num_kv_heads || t.dim(2) != g.block_size) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() +
                            " but must be [num_blocks, num_kv_heads, block_size] = [" + std::to_string(g.num_blocks) +
                            ", " + std::to_string(g.num_kv_heads) + ", " + std::to_string(g.block_size) + "]");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, name, t));
  if (!t.is_contiguous()) return invalid_argument(s(op) + ": " + name + " is not contiguous; KV caches must be contiguous");
  return ok_status();
}

}  // namespace

Result<KvGeometry> check_kv_cache(const char* op, const PagedKvCache& cache) {
  const FormatInfo fi = info(cache.format);
  const std::string fmt = s(kv_cache_format_name(cache.format));
  const TensorView& k = cache.key_cache;
  if (k.dtype() != fi.dtype) {
    return invalid_argument(s(op) + ": key_cache has dtype " + s(dtype_name(k.dtype())) + " but the " + fmt +
                            " KV cache stores " + s(dtype_name(fi.dtype)));
  }
  if (k.rank() != 4) {
    return invalid_argument(s(op) + ": key_cache has shape " + k.shape_string() +
                            " but must have rank 4 [num_blocks, num_kv_heads, block_size, " + fi.row_layout + "]");
  }
  if (k.dim(1) < 1 || k.dim(2) < 1 || k.dim(3) < fi.extra + 1) {
    return invalid_argument(s(op) + ": key_cache has shape " + k.shape_string() + "; num_kv_heads, block_size and " +
                            "head_dim must be >= 1");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "key_cache", k));
  if (!k.is_contiguous()) return invalid_argument(s(op) + ": key_cache is not contiguous; KV caches must be contiguous");
  GB_RETURN_IF_ERROR(check_same_shape_dtype(op, "value_cache", cache.value_cache, "key_cache", k));
  if (!cache.value_cache.is_contiguous()) {
    return invalid_argument(s(op) + ": value_cache is not contiguous; KV caches must be contiguous");
  }
  KvGeometry g;
  g.num_blocks = k.dim(0);
  g.num_kv_heads = k.dim(1);
  g.block_size = k.dim(2);
  g.head_dim = k.dim(3) - fi.extra;
  g.row_bytes = k.dim(3) * static_cast<int64_t>(dtype_size(fi.dtype));
  if (cache.format == KvCacheFormat::kInt8Fp16Scale) {
    GB_RETURN_IF_ERROR(check_scale_cache(op, "key_scale_cache", cache.key_scale_cache, g));
    GB_RETURN_IF_ERROR(check_scale_cache(op, "value_scale_cache", cache.value_scale_cache, g));
  }
  return g;
}

Status check_int32(const char* op, const char* name, const TensorView& t, int rank, const char* layout) {
  if (t.dtype() != DType::kI32) {
    return invalid_argument(s(op) + ": " + name + " has dtype " + s(dtype_name(t.dtype())) + " but must be int32");
  }
  if (t.rank() != rank) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() + " but must have rank " +
                            std::to_string(rank) + " " + layout);
  }
  return check_host_data(op, name, t);
}

Status check_query_start_loc(const char* op, const TensorView& query_start_loc, int64_t num_seqs,
                             int64_t num_tokens) {
  GB_RETURN_IF_ERROR(check_int32(op, "query_start_loc", query_start_loc, 1, "[num_seqs + 1]"));
  if (query_start_loc.dim(0) != num_seqs + 1) {
    return invalid_argument(s(op) + ": query_start_loc has shape " + query_start_loc.shape_string() +
                            " but must be [" + n(num_seqs + 1) + "] (num_seqs + 1)");
  }
  if (at_i32(query_start_loc, 0) != 0) {
    return invalid_argument(s(op) + ": query_start_loc[0] is " + n(at_i32(query_start_loc, 0)) + " but must be 0");
  }
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t b = at_i32(query_start_loc, q), e = at_i32(query_start_loc, q + 1);
    if (e < b) {
      return invalid_argument(s(op) + ": query_start_loc[" + n(q + 1) + "] = " + n(e) + " is less than query_start_loc[" +
                              n(q) + "] = " + n(b) + "; it must be non-decreasing");
    }
  }
  if (at_i32(query_start_loc, num_seqs) != num_tokens) {
    return invalid_argument(s(op) + ": query_start_loc[" + n(num_seqs) + "] is " + n(at_i32(query_start_loc, num_seqs)) +
                            " but must equal the number of query tokens " + n(num_tokens));
  }
  return ok_status();
}

Status check_mla_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
  const KvRepresentation& r = kv_representation(f);
  if (kv_lora_rank < 1) {
    return invalid_argument("kv_lora_rank=" + std::to_string(kv_lora_rank) + " must be >= 1 for an MLA KV cache");
  }
  if (rope_dim < 0) {
    return invalid_argument("qk_rope_head_dim=" + std::to_string(rope_dim) + " must be >= 0 for an MLA KV cache");
  }
  if (r.scale_group > 0 && kv_lora_rank % r.scale_group != 0) {
    return invalid_argument("kv_lora_rank=" + std::to_string(kv_lora_rank) + " is not a multiple of " +
                            std::to_string(r.scale_group) + ", which the " + std::string(r.name) +
                            " MLA KV cache requires (one scale per tile of " + std::to_string(r.scale_group) +
                            " latent elements)");
  }
  return ok_status();
}

Status check_indexer_dims(IndexerKeyFormat f, int64_t index_head_dim) {
  const KvRepresentation& r = kv_representation(f);
  if (index_head_dim < 1) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) +
                            " must be >= 1 for an indexer key cache");
  }
  if (r.hadamard_rotated && (index_head_dim & (index_head_dim - 1)) != 0) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) + " is not a power of two, which the " +
                            std::string(r.name) + " indexer key cache requires (Walsh-Hadamard rotation)");
  }
  return ok_status();
}

}  // namespace genbridge::ops::detail
