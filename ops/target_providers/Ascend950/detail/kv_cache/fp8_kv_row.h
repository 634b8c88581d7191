#pragma once
// Internal: the fp8 KV-cache row encoder behind kv_cache/fp8_kv_write, private to this generation (the
// only one with an FP8 data path): only this target's library compiles it.

#include <cstdint>

namespace genbridge::ops::detail {

// Encodes one row of head_dim values as fp8 e4m3fn codes followed by the row's fp32 scale (4 bytes):
// scale = max(amax(|x|), kFp8KvScaleTinyAmax) / 448 (NaNs skipped), code i = e4m3fn(x[i] / scale), saturating.
using Fp8KvRowEncoder = void (*)(const float* x, int64_t head_dim, uint8_t* row);

// The encoder compiled for the CPU target in use (core/simd/): chosen once per op call.
Fp8KvRowEncoder fp8_kv_row_encoder();

}  // namespace genbridge::ops::detail
