#include "ops/target_providers/Ascend950/detail/kv_cache/fp8_kv_row.h"

#include <cstring>

#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"

// ---- per CPU target (every target gives the same bits) ----
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/target_providers/Ascend950/detail/kv_cache/fp8_kv_row.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/formats8-inl.h"
#include "core/simd/vec16-inl.h"
#include "ops/detail/quant/absmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::detail::HWY_NAMESPACE {
using namespace ::genbridge::simd::HWY_NAMESPACE;  // NOLINT

void EncodeFp8KvRow(const float* x, int64_t d, uint8_t* row) {
  const float amax = AbsMaxSkippingNaN(x, d);
  const float scale = (amax > kFp8KvScaleTinyAmax ? amax : kFp8KvScaleTinyAmax) / 448.0f;
  const V16 vs = Set16(scale);
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) StoreBytes16(row + i, EncodeFp8E4M3FN16(Load16(x + i) / vs));
  if (i < d) StoreBytesTail16(row + i, EncodeFp8E4M3FN16(LoadTail16(x + i, d - i) / vs), d - i);
  std::memcpy(row + d, &scale, sizeof scale);
}

}  // namespace genbridge::ops::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(EncodeFp8KvRow);

Fp8KvRowEncoder fp8_kv_row_encoder() { return &GB_DISPATCH(EncodeFp8KvRow); }

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
