// The dimension rules of the representation table (kv_cache/kv_format.h; the table itself is constexpr
// data in the header, so compile-time row sizes come from it too).
#include "genbridge/ops/kv_cache/kv_format.h"

#include <string>

namespace genbridge::ops {

Status check_mla_kv_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
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

Status check_indexer_key_dims(IndexerKeyFormat f, int64_t index_head_dim) {
  const KvRepresentation& r = kv_representation(f);
  if (index_head_dim < 1) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) + " must be >= 1 for an indexer key cache");
  }
  if (r.hadamard_rotated && (index_head_dim & (index_head_dim - 1)) != 0) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) + " is not a power of two, which the " +
                            std::string(r.name) + " indexer key cache requires (Walsh-Hadamard rotation)");
  }
  return ok_status();
}

}  // namespace genbridge::ops
