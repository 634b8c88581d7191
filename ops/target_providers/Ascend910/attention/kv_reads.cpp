// Ascend910 (A2/A3): the generation has no FP8 data path, so every fp8 KV representation is the attention
// ops' explicit unsupported case (Unimplemented, before any other check: the op does not exist for that
// representation here).
#include "ops/common/attention/kv_reads.h"

#include <string>

namespace genbridge::ops::detail {

Status check_kv_readable(const char* op, KvCacheFormat format) {
  if (format != KvCacheFormat::kFp8Fp32PackedScale) return ok_status();
  return unimplemented(std::string(op) +
                       ": the fp8_e4m3fn+packed fp32 scale KV cache is not supported on Ascend910 (A2/A3 has no FP8 "
                       "data path; its quantized KV cache is int8+fp16 scale)");
}

Status check_kv_readable(const char* op, MlaKvFormat format) {
  if (format == MlaKvFormat::kMxfp8RopeFirstPacked) {
    return unimplemented(std::string(op) +
                         ": the MXFP8 (E8M0 per 64) KV cache is not supported on Ascend910 (A2/A3 has no FP8 data "
                         "path; its KV rows are bf16 or int8 + fp16 scale)");
  }
  if (format != MlaKvFormat::kFp8TileScalePacked) return ok_status();
  return unimplemented(std::string(op) +
                       ": the fp8 MLA KV cache is not supported on Ascend910 (A2/A3 has no FP8 data path; its "
                       "quantized MLA KV cache is int8 latent + fp16 scale with a separate bf16 rope cache)");
}

Status check_kv_readable(const char* op, IndexerKeyFormat format) {
  if (format != IndexerKeyFormat::kFp8HadamardPackedScale) return ok_status();
  return unimplemented(std::string(op) +
                       ": fp8 indexer keys are not supported on Ascend910 (A2/A3 has no FP8 data path; its indexer "
                       "keys are bf16)");
}

}  // namespace genbridge::ops::detail
