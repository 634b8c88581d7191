#include "ops/target_providers/Ascend950/kv_cache/fp8_rows.h"

#include <cstring>
#include <vector>

#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "genbridge/ops/kv_cache/kv_format.h"
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"
#include "ops/common/attention/hadamard.h"

// ---- per CPU target (every target gives the same bits) ----
#define HWY_TARGET_INCLUDE "ops/target_providers/Ascend950/kv_cache/fp8_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "core/simd/formats8-inl.h"
#include "ops/common/quant/absmax-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();

// codes of x[0, n) / scale, scale = max(amax, tiny) / 448; returns the scale.
HWY_NOINLINE float EncodeFp8Group(const float* x, int64_t n, uint8_t* codes) {
  const float amax = AbsMaxSkippingNaN(x, n);
  const float scale = (amax > kFp8KvScaleTinyAmax ? amax : kFp8KvScaleTinyAmax) / 448.0f;
  const V16 vs = Set16(scale);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBytes16(codes + i, EncodeFp8E4M3FN16(Load16(x + i) / vs));
  if (i < n) StoreBytesTail16(codes + i, EncodeFp8E4M3FN16(LoadTail16(x + i, n - i) / vs), n - i);
  return scale;
}

void EncodeFp8KvRow(const float* x, int64_t d, uint8_t* row) {
  const float scale = EncodeFp8Group(x, d, row);
  std::memcpy(row + d, &scale, sizeof scale);
}

void EncodeFp8MlaRow(const float* x, int64_t width, const float* rope, int64_t rope_dim, uint8_t* row) {
  uint8_t* scales = row + width;
  for (int64_t t = 0; t < width / kMlaKvScaleTile; ++t) {
    const float scale = EncodeFp8Group(x + t * kMlaKvScaleTile, kMlaKvScaleTile, row + t * kMlaKvScaleTile);
    std::memcpy(scales + 4 * t, &scale, sizeof scale);
  }
  bf16_t* r = reinterpret_cast<bf16_t*>(scales + 4 * (width / kMlaKvScaleTile));
  // The rope part may be unaligned for bf16 stores only if width were odd; width is a multiple of 128.
  ConvertRow(rope, r, rope_dim);
}

// The E8M0 byte of a group whose amax (NaNs skipped) is `amax`: 2^(byte - 127) is the smallest power of
// two >= max(amax, floor) / 448 (kv_cache/mxfp8_mla_kv_write.h), at most 2^127.
inline uint8_t Mxfp8ScaleByte(float amax) {
  const float v = (amax > kMxfp8KvAmaxFloor ? amax : kMxfp8KvAmaxFloor) / 448.0f;
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t e = ((bits >> 23) & 0xFFu) + ((bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  return static_cast<uint8_t>(e < 254u ? e : 254u);
}

void EncodeMxfp8MlaRow(const float* x, int64_t width, const float* rope, int64_t rope_dim, uint8_t* row) {
  ConvertRow(rope, reinterpret_cast<bf16_t*>(row), rope_dim);
  uint8_t* codes = row + 2 * rope_dim;
  uint8_t* scales = codes + width;
  for (int64_t g = 0; g < width / kMxKvScaleGroup; ++g) {
    const float* xg = x + g * kMxKvScaleGroup;
    const uint8_t byte = Mxfp8ScaleByte(AbsMaxSkippingNaN(xg, kMxKvScaleGroup));
    scales[g] = byte;
    const V16 vs = Set16(e8m0_to_float(e8m0_t{byte}));
    for (int64_t i = 0; i < kMxKvScaleGroup; i += kLanes) {
      StoreBytes16(codes + g * kMxKvScaleGroup + i, EncodeFp8E4M3FN16(Load16(xg + i) / vs));
    }
  }
  const int64_t used = 2 * rope_dim + width + width / kMxKvScaleGroup;
  const int64_t total = mla_kv_row_bytes(MlaKvFormat::kMxfp8RopeFirstPacked, width, rope_dim).main;
  std::memset(row + used, 0, static_cast<size_t>(total - used));
}

void EncodeFp8IndexerRow(const float* x, int64_t width, const float*, int64_t, uint8_t* row) {
  thread_local std::vector<float> y;
  if (y.size() < static_cast<size_t>(width)) y.resize(static_cast<size_t>(width));
  std::memcpy(y.data(), x, static_cast<size_t>(width) * sizeof(float));
  hadamard_rotate(y.data(), width);
  const float scale = EncodeFp8Group(y.data(), width, row);
  std::memcpy(row + width, &scale, sizeof scale);
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(EncodeFp8KvRow);
HWY_EXPORT(EncodeFp8MlaRow);
HWY_EXPORT(EncodeFp8IndexerRow);
HWY_EXPORT(EncodeMxfp8MlaRow);

Fp8KvRowEncoder fp8_kv_row_encoder() { return &GB_DISPATCH(EncodeFp8KvRow); }
TokenRowEncoder fp8_mla_row_encoder() { return &GB_DISPATCH(EncodeFp8MlaRow); }
TokenRowEncoder mxfp8_mla_row_encoder() { return &GB_DISPATCH(EncodeMxfp8MlaRow); }
TokenRowEncoder fp8_indexer_row_encoder() { return &GB_DISPATCH(EncodeFp8IndexerRow); }

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
