// Ascend910 (A2/A3) provider: reads the bf16 and int8 MLA KV representations. The generation has no FP8
// data path, so an fp8 cache is the explicit unsupported case (Unimplemented, before any other check).
#include "genbridge/ops/attention/mla_decode.h"

#include "ops/detail/attention/mla_attention.h"

namespace genbridge::ops {

Status mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                  const TensorView& block_tables, const TensorView& context_lens, const TensorView& query_start_loc,
                  float softmax_scale, const TensorView& out) {
  if (cache.format == MlaKvFormat::kFp8TileScalePacked) {
    return unimplemented(
        "mla_decode: the fp8 MLA KV cache is not supported on Ascend910 (A2/A3 has no FP8 data path; its quantized MLA "
        "KV cache is int8 latent + fp16 scale with a separate bf16 rope cache)");
  }
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
