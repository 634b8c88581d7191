// Ascend910 (A2/A3) provider: reads the bf16 and int8 + fp16-scale KV representations. The generation
// has no FP8 data path, so an fp8 cache is the explicit unsupported case (Unimplemented, before any
// other check: the op does not exist for that representation here).
#include "genbridge/ops/attention/paged_decode.h"

#include "ops/detail/attention/paged_attention.h"

namespace genbridge::ops {

Status paged_decode(const TensorView& query, const PagedKvCache& cache, const TensorView& block_tables,
                    const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                    const TensorView& out) {
  if (cache.format == KvCacheFormat::kFp8Fp32PackedScale) {
    return unimplemented(
        "paged_decode: the fp8_e4m3fn+packed fp32 scale KV cache is not supported on Ascend910 (A2/A3 has no FP8 "
        "data path; its quantized KV cache is int8+fp16 scale)");
  }
  return detail::run_paged_decode({"paged_decode", query, cache, block_tables, context_lens, query_start_loc,
                                   softmax_scale, out});
}

}  // namespace genbridge::ops
