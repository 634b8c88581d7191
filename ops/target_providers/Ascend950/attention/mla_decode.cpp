// Ascend950 (A5) provider: reads every MLA KV representation, the packed fp8 one included.
#include "genbridge/ops/attention/mla_decode.h"

#include "ops/detail/attention/mla_attention.h"

namespace genbridge::ops {

Status mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                  const TensorView& block_tables, const TensorView& context_lens, const TensorView& query_start_loc,
                  float softmax_scale, const TensorView& out) {
  detail::MlaAttentionCall c;
  c.op = "mla_decode";
  c.q_latent = q_latent;
  c.q_rope = q_rope;
  c.cache = cache;
  c.block_tables = block_tables;
  c.context_lens = context_lens;
  c.query_start_loc = query_start_loc;
  c.softmax_scale = softmax_scale;
  c.out = out;
  return detail::run_mla_attention(c);
}

}  // namespace genbridge::ops
