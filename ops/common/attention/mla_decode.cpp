// Common to every target: the kernel reads every MLA KV representation; a generation without one answers
// Unimplemented for it (kv_reads.h).
#include "genbridge/ops/attention/mla_decode.h"

#include "ops/common/attention/kv_reads.h"
#include "ops/common/attention/mla_attention.h"

namespace genbridge::ops {

Status mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                  const TensorView& block_tables, const TensorView& context_lens, const TensorView& query_start_loc,
                  float softmax_scale, const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_kv_readable("mla_decode", cache.format));
  return detail::run_mla_attention({.op = "mla_decode",
                                    .q_latent = q_latent,
                                    .q_rope = q_rope,
                                    .cache = cache,
                                    .block_tables = block_tables,
                                    .context_lens = context_lens,
                                    .query_start_loc = query_start_loc,
                                    .softmax_scale = softmax_scale,
                                    .out = out});
}

}  // namespace genbridge::ops
