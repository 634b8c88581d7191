// Common to every target: the MLA kernel in its shared-KV form; a generation answers Unimplemented for a
// representation it cannot read (kv_reads.h).
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"

#include "ops/common/attention/kv_reads.h"
#include "ops/common/attention/mla_attention.h"

namespace genbridge::ops {

Status sharedkv_sparse_attention(const TensorView& q_nope, const TensorView& q_rope, const MlaKvCache& window_cache,
                                 const TensorView& window_slots, const MlaKvCache& compressed_cache,
                                 const TensorView& compressed_slots, const TensorView& sinks, float softmax_scale,
                                 const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_kv_readable("sharedkv_sparse_attention", window_cache.format));
  if (compressed_slots.rank() == 2 && compressed_slots.dim(1) > 0) {
    GB_RETURN_IF_ERROR(detail::check_kv_readable("sharedkv_sparse_attention", compressed_cache.format));
  }
  detail::MlaAttentionCall call;
  call.op = "sharedkv_sparse_attention";
  call.q_latent = q_nope;
  call.q_rope = q_rope;
  call.cache = window_cache;
  call.sparse = true;
  call.topk_indices = window_slots;
  call.index_format = TopkIndexFormat::kFlatKvSlots;
  call.softmax_scale = softmax_scale;
  call.out = out;
  call.shared_kv = true;
  call.cache2 = compressed_cache;
  call.indices2 = compressed_slots;
  call.sinks = sinks;
  return detail::run_sharedkv_attention(call);
}

}  // namespace genbridge::ops
