// Internal: contiguous row conversions between fp32 and fp32 / fp16 / bf16 on the 16-lane contract vectors
// (exact widening; narrowing rounds to nearest even as the scalar codecs do), for kernels compiled per CPU
// target. Per-target "-inl.h": included after hwy/foreach_target.h; lives in genbridge::simd::HWY_NAMESPACE.

#if defined(GENBRIDGE_OPS_COMMON_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GENBRIDGE_OPS_COMMON_ROWS_INL_H_
#undef GENBRIDGE_OPS_COMMON_ROWS_INL_H_
#else
#define GENBRIDGE_OPS_COMMON_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/simd/vec16-inl.h"
#include "ops/common/tensor/rows.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd {
namespace HWY_NAMESPACE {

// dst[i] = src[i] converted (From or To is float).
template <typename From, typename To>
HWY_INLINE void ConvertRow(const From* src, To* dst, int64_t n) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) Store16(dst + c, Load16(src + c));
  for (; c < n; ++c) dst[c] = ops::detail::from_f32<To>(ops::detail::to_f32(src[c]));
}

// One contiguous row of a float dtype (fp32, fp16, bf16) as fp32, and back.
HWY_INLINE void LoadRowF32Contiguous(DType d, const void* src, int64_t n, float* out) {
  switch (d) {
    case DType::kF32: ConvertRow(static_cast<const float*>(src), out, n); return;
    case DType::kF16: ConvertRow(static_cast<const fp16_t*>(src), out, n); return;
    default: ConvertRow(static_cast<const bf16_t*>(src), out, n); return;
  }
}
HWY_INLINE void StoreRowF32Contiguous(DType d, void* dst, int64_t n, const float* in) {
  switch (d) {
    case DType::kF32: ConvertRow(in, static_cast<float*>(dst), n); return;
    case DType::kF16: ConvertRow(in, static_cast<fp16_t*>(dst), n); return;
    default: ConvertRow(in, static_cast<bf16_t*>(dst), n); return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
