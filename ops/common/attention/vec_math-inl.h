// Internal: vector math for the attention kernels on the 16-lane contract vector (core/simd/vec16-inl.h),
// compiled once per CPU target (Highway's per-target include guard below; include it after
// hwy/foreach_target.h and hwy/highway.h). Every function is a fixed sequence of IEEE operations (no
// FMA), and lane l of a result is computed the same way whatever the hardware vector width, so results
// are the same bits on every target and thread count.

#if defined(GENBRIDGE_OPS_ATTENTION_VEC_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GENBRIDGE_OPS_ATTENTION_VEC_MATH_INL_H_
#undef GENBRIDGE_OPS_ATTENTION_VEC_MATH_INL_H_
#else
#define GENBRIDGE_OPS_ATTENTION_VEC_MATH_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace ::genbridge::simd::HWY_NAMESPACE;  // V16, DF, kPart, ...

// exp(x) for x <= 0 (softmax weights after subtracting the running maximum). Cody-Waite range
// reduction x = n*ln2 + r, |r| <= ln2/2, then the degree-7 Taylor-like minimax polynomial of Cephes'
// expf; about 2 ulp. Exact at the two points the online softmax relies on: exp(0) = 1 and
// exp(-inf) = 0 (also for every x < -87, which flushes to 0 instead of producing subnormals).
HWY_INLINE V16 ExpNonpositive16(V16 x) {
  const DF df;
  const DU du;
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VF v = x.p[i];
    const MF underflow = hn::Lt(v, hn::Set(df, -87.0f));
    const VF xc = hn::IfThenZeroElse(underflow, v);
    // n = round-to-nearest-even(x / ln2) via the 1.5 * 2^23 shifter; |x / ln2| < 126 here.
    const VF shifted = hn::Add(hn::Mul(xc, hn::Set(df, 1.44269504088896341f)), hn::Set(df, 12582912.0f));
    const VF n = hn::Sub(shifted, hn::Set(df, 12582912.0f));
    const VF r = hn::Sub(hn::Sub(xc, hn::Mul(n, hn::Set(df, 0.693359375f))), hn::Mul(n, hn::Set(df, -2.12194440e-4f)));
    VF p = hn::Set(df, 1.9875691500e-4f);
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 1.3981999507e-3f));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 8.3334519073e-3f));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 4.1665795894e-2f));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 1.6666665459e-1f));
    p = hn::Add(hn::Mul(p, r), hn::Set(df, 5.0000001201e-1f));
    p = hn::Add(hn::Add(hn::Mul(p, hn::Mul(r, r)), r), hn::Set(df, 1.0f));
    // 2^n from the integer n held in the low bits of `shifted` (n in [-126, 0]); wrapping integer adds.
    const VU ni = hn::Sub(hn::BitCast(du, shifted), hn::Set(du, 0x4b400000u));
    const VU pow2 = hn::ShiftLeft<23>(hn::Add(ni, hn::Set(du, 127u)));
    const VF e = hn::Mul(p, hn::BitCast(df, pow2));
    x.p[i] = hn::IfThenZeroElse(underflow, e);
  }
  return x;
}

// The largest lane, scanned in lane order as `m = v[i] > m ? v[i] : m` (m starts at lane 0).
HWY_INLINE float ReduceMaxSeq16(V16 v) {
  alignas(64) float t[kLanes];
  Store16(t, v);
  float m = t[0];
  for (int i = 1; i < kLanes; ++i) m = t[i] > m ? t[i] : m;
  return m;
}

// Four keys' 16-lane dot-product partials with one query row (len a multiple of 16): for key t < 4 and lane
// l < 16, part[16 * t + l] = the sum of q[i] * keys[t * stride + i] over i < len with i % 16 == l; each key
// its own accumulator, fused multiply-adds in index order (the same operations as one key at a time).
// len 0 stores zeros.
HWY_INLINE void DotFourKeys16(const float* HWY_RESTRICT q, const float* HWY_RESTRICT keys, int64_t stride, int64_t len,
                              float* HWY_RESTRICT part) {
  V16 d0 = Zero16(), d1 = Zero16(), d2 = Zero16(), d3 = Zero16();
  for (int64_t i = 0; i < len; i += kLanes) {
    const V16 qv = Load16(q + i);
    d0 = Fma16(qv, Load16(keys + i), d0);
    d1 = Fma16(qv, Load16(keys + stride + i), d1);
    d2 = Fma16(qv, Load16(keys + 2 * stride + i), d2);
    d3 = Fma16(qv, Load16(keys + 3 * stride + i), d3);
  }
  Store16(part, d0);
  Store16(part + 16, d1);
  Store16(part + 32, d2);
  Store16(part + 48, d3);
}

// out[k] = the sum of the 16 lanes of part[16 * k .. 16 * k + 16), for 16 vectors k at once, in the
// contract's fixed pairwise order: s8[i] = v[i] + v[i + 8], s4[i] = s8[i] + s8[i + 4],
// s2[i] = s4[i] + s4[i + 2], sum = s2[0] + s2[1]. Each level is one vector add over several keys; only the
// lanes' positions differ between targets (shuffles move values, never round them).
HWY_INLINE void ReduceKeys16(const float* HWY_RESTRICT part, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  for (int k = 0; k < 16; ++k) {
    const float* v = part + 16 * k;
    float s8[8], s4[4];
    for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
    out[k] = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  }
#else
  if constexpr (kPart >= 8) {
    // 8-lane vectors. Keys enter in the slot order 0 4 2 6 1 5 3 7 so that they leave in natural order:
    // level 2 (ConcatLowerLower + ConcatUpperUpper) packs two keys per vector, levels 3 and 4
    // (InterleaveLower + InterleaveUpper within 128-bit blocks) leave key slots 0 4 2 6 | 1 5 3 7.
    const hn::CappedTag<float, 8> d8;
    constexpr int kSlot[8] = {0, 4, 2, 6, 1, 5, 3, 7};
    GB_UNROLL for (int g = 0; g < 2; ++g) {
      decltype(hn::Zero(d8)) s8[8], x[4], y[2];
      GB_UNROLL for (int s = 0; s < 8; ++s) {
        const float* v = part + 16 * (8 * g + kSlot[s]);
        s8[s] = hn::Add(hn::LoadU(d8, v), hn::LoadU(d8, v + 8));
      }
      GB_UNROLL for (int i = 0; i < 4; ++i) {
        x[i] = hn::Add(hn::ConcatLowerLower(d8, s8[2 * i + 1], s8[2 * i]),
                       hn::ConcatUpperUpper(d8, s8[2 * i + 1], s8[2 * i]));
      }
      GB_UNROLL for (int i = 0; i < 2; ++i) {
        y[i] =
            hn::Add(hn::InterleaveLower(d8, x[2 * i], x[2 * i + 1]), hn::InterleaveUpper(d8, x[2 * i], x[2 * i + 1]));
      }
      hn::StoreU(hn::Add(hn::InterleaveLower(d8, y[0], y[1]), hn::InterleaveUpper(d8, y[0], y[1])), d8, out + 8 * g);
    }
  } else {
    // 4-lane vectors: s4 per key, then keys (0, 2) and (1, 3) interleaved twice leave keys in order.
    const hn::CappedTag<float, 4> d4;
    GB_UNROLL for (int g = 0; g < 4; ++g) {
      decltype(hn::Zero(d4)) s4[4];
      GB_UNROLL for (int k = 0; k < 4; ++k) {
        const float* v = part + 16 * (4 * g + k);
        const auto lo = hn::Add(hn::LoadU(d4, v), hn::LoadU(d4, v + 8));       // s8[0..3]
        const auto hi = hn::Add(hn::LoadU(d4, v + 4), hn::LoadU(d4, v + 12));  // s8[4..7]
        s4[k] = hn::Add(lo, hi);
      }
      const auto y0 = hn::Add(hn::InterleaveLower(d4, s4[0], s4[2]), hn::InterleaveUpper(d4, s4[0], s4[2]));
      const auto y1 = hn::Add(hn::InterleaveLower(d4, s4[1], s4[3]), hn::InterleaveUpper(d4, s4[1], s4[3]));
      hn::StoreU(hn::Add(hn::InterleaveLower(d4, y0, y1), hn::InterleaveUpper(d4, y0, y1)), d4, out + 4 * g);
    }
  }
#endif
}

// ---- KV element decoders: kPart consecutive codes to fp32 (exact on every target) ----

// int8 codes -> fp32.
HWY_INLINE VF LoadI8Part(const uint8_t* p) {
  const hn::Rebind<int8_t, DI> d8;
  return hn::ConvertTo(DF(), hn::PromoteTo(DI(), hn::LoadU(d8, reinterpret_cast<const int8_t*>(p))));
}

// fp8 e4m3fn codes -> fp32 value * 2^-8, exactly. Where the target converts fp16 in hardware (F16C, NEON),
// the code moves into an fp16 (bias 15 instead of 7 divides by 2^8; subnormals stay subnormals) and is
// widened: two constants, so the tiles that call it keep their accumulators in registers. Elsewhere:
// normal codes (exponent e > 0) become the fp32 with exponent e + 112 and the 3 mantissa bits on top;
// subnormals (m * 2^-17) are (2^-14 + m * 2^-17) - 2^-14. Either way the NaN code S.1111.111 becomes the
// quiet NaN 0x7ff00000 with its sign. Callers fold the 2^8 into the row scale.
HWY_INLINE VF LoadFp8ScaledPart(const uint8_t* p) {
  const DF df;
  if constexpr (kNativeF16Demote) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto h = hn::PromoteTo(d16, hn::LoadU(hn::Rebind<uint8_t, DF>(), p));
    const auto mag = hn::And(h, hn::Set(d16, uint16_t{0x7f}));
    const auto sign = hn::ShiftLeft<8>(hn::Xor(h, mag));
    const auto nan = hn::IfThenElseZero(hn::Eq(mag, hn::Set(d16, uint16_t{0x7f})), hn::Set(d16, uint16_t{0x7e00}));
    const auto bits = hn::Or(hn::Or(sign, hn::ShiftLeft<7>(mag)), nan);
    return hn::PromoteTo(df, hn::BitCast(dh, bits));
  } else {
    const DU du;
    const DI di;
    const VU b = hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, DU>(), p));
    const VU mag = hn::And(b, hn::Set(du, 0x7fu));
    const VU bits = hn::ShiftLeft<20>(mag);
    const VF normal = hn::BitCast(df, hn::Add(bits, hn::Set(du, 0x38000000u)));
    const VF sub = hn::Sub(hn::BitCast(df, hn::Add(bits, hn::Set(du, 0x38800000u))), hn::Set(df, 6.103515625e-05f));
    const VI magi = hn::BitCast(di, mag);
    VF v = hn::IfThenElse(hn::RebindMask(df, hn::Lt(magi, hn::Set(di, 8))), sub, normal);
    v = hn::IfThenElse(hn::RebindMask(df, hn::Eq(magi, hn::Set(di, 0x7f))), hn::BitCast(df, hn::Set(du, 0x7ff00000u)),
                       v);
    return hn::Or(v, hn::BitCast(df, hn::ShiftLeft<24>(hn::Xor(b, mag))));  // b ^ mag = the sign bit
  }
}

// 16 consecutive fp8 e4m3fn codes as one contract vector, value * 2^-8 (LoadFp8ScaledPart per part).
HWY_INLINE V16 LoadFp8Scaled16(const uint8_t* p) {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = LoadFp8ScaledPart(p + i * kPart);
  return r;
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::ops::detail
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
