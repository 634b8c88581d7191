// Internal: max |x| of a run of fp32 / bf16 / fp16 values as an fp32 bit pattern, on Highway vectors. The
// integer order of |x| bit patterns is the order of the values, with NaN above inf, so any NaN gives a
// pattern above 0x7f800000. Max is exact, so the result is the same whatever the vector width.
// Per-target "-inl.h": included after hwy/foreach_target.h; lives in genbridge::simd::HWY_NAMESPACE.

#if defined(GENBRIDGE_OPS_QUANT_ABSMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GENBRIDGE_OPS_QUANT_ABSMAX_INL_H_
#undef GENBRIDGE_OPS_QUANT_ABSMAX_INL_H_
#else
#define GENBRIDGE_OPS_QUANT_ABSMAX_INL_H_
#endif

#include <bit>
#include <cstdint>

#include <hwy/highway.h>

#include "genbridge/core/formats.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Max of (x[i] & mask) over n unsigned lanes of type U: two chains of full vectors, then the tail.
template <typename U>
HWY_INLINE uint32_t MaxMasked(const U* x, int64_t n, U mask) {
  const hn::ScalableTag<U> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto vm = hn::Set(d, mask);
  auto m0 = hn::Zero(d), m1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, x + i), vm));
    m1 = hn::Max(m1, hn::And(hn::LoadU(d, x + i + N), vm));
  }
  if (i + N <= n) {
    m0 = hn::Max(m0, hn::And(hn::LoadU(d, x + i), vm));
    i += N;
  }
  uint32_t m = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1))));
  for (; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(x[i] & mask);
    m = v > m ? v : m;
  }
  return m;
}

HWY_INLINE uint32_t AbsMaxBits(const float* x, int64_t n) {
  return MaxMasked(reinterpret_cast<const uint32_t*>(x), n, 0x7fffffffu);
}
HWY_INLINE uint32_t AbsMaxBits(const bf16_t* x, int64_t n) {
  return MaxMasked(reinterpret_cast<const uint16_t*>(x), n, uint16_t{0x7fff}) << 16;  // bf16: fp32's top half
}
HWY_INLINE uint32_t AbsMaxBits(const fp16_t* x, int64_t n) {
  const uint32_t h = MaxMasked(reinterpret_cast<const uint16_t*>(x), n, uint16_t{0x7fff});
  if (h > 0x7c00u) return 0x7fc00000u;
  return std::bit_cast<uint32_t>(fp16_to_float(fp16_t{static_cast<uint16_t>(h)}));
}

// max |x[i]| over n fp32 values, NaNs skipped (0 when there is none): `a > m ? a : m` in any order.
HWY_INLINE float AbsMaxSkippingNaN(const float* x, int64_t n) {
  const hn::ScalableTag<uint32_t> d;
  const hn::RebindToSigned<decltype(d)> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto abs_mask = hn::Set(d, 0x7fffffffu);
  const auto inf = hn::Set(di, 0x7f800000);
  const auto* u = reinterpret_cast<const uint32_t*>(x);
  auto m = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto a = hn::And(hn::LoadU(d, u + i), abs_mask);
    m = hn::Max(m, hn::IfThenZeroElse(hn::RebindMask(d, hn::Gt(hn::BitCast(di, a), inf)), a));
  }
  uint32_t r = static_cast<uint32_t>(hn::GetLane(hn::MaxOfLanes(d, m)));
  for (; i < n; ++i) {
    const uint32_t a = u[i] & 0x7fffffffu;
    if (a <= 0x7f800000u && a > r) r = a;
  }
  return std::bit_cast<float>(r);
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
