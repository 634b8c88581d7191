// Internal: 16-lane encoders for int8 and the 8-bit / 4-bit minifloats (fp8 e4m3fn, fp8 e5m2, fp4 e2m1) on
// Highway vectors, and the byte / nibble stores their codes need. Each lane gives exactly what the scalar
// codec in genbridge/core/formats.h gives (saturating mode) on every CPU target: only integer operations,
// comparisons and single IEEE additions, no target-dependent rounding. tests/core/formats8_test.cpp checks
// every code and a dense sweep of fp32 inputs under every CPU target.
//
// Per-target "-inl.h" (Highway's include guard convention), included after hwy/foreach_target.h and
// core/simd/vec16-inl.h; everything lives in genbridge::simd::HWY_NAMESPACE.

#if defined(GENBRIDGE_CORE_SIMD_FORMATS8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GENBRIDGE_CORE_SIMD_FORMATS8_INL_H_
#undef GENBRIDGE_CORE_SIMD_FORMATS8_INL_H_
#else
#define GENBRIDGE_CORE_SIMD_FORMATS8_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- bit casts and lane-wise integer helpers on the 16-lane contract vectors ----

HWY_INLINE U16 AsU16(V16 v) {
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::BitCast(DU(), v.p[i]);
  return r;
}
HWY_INLINE V16 AsF16(U16 u) {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::BitCast(DF(), u.p[i]);
  return r;
}
HWY_INLINE U16 AndU16(U16 a, uint32_t m) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) a.p[i] = hn::And(a.p[i], hn::Set(DU(), m));
  return a;
}
// Unsigned 32-bit lanes of 16 consecutive values.
HWY_INLINE U16 LoadU16(const uint32_t* p) {
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::LoadU(DU(), p + i * kPart);
  return r;
}
HWY_INLINE void StoreU16(uint32_t* p, U16 u) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::StoreU(u.p[i], DU(), p + i * kPart);
}
// Lane-wise maximum of unsigned lanes (exact: any order gives the same result).
HWY_INLINE U16 MaxU16(U16 a, U16 b) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) a.p[i] = hn::Max(a.p[i], b.p[i]);
  return a;
}
// Maximum over the 16 lanes.
HWY_INLINE uint32_t ReduceMaxU16(U16 a) {
  VU m = a.p[0];
  GB_UNROLL for (int i = 1; i < kParts; ++i) m = hn::Max(m, a.p[i]);
  return hn::GetLane(hn::MaxOfLanes(DU(), m));
}

// Magnitude code of a minifloat with M mantissa bits and exponent bias B, rounding to nearest even and
// saturating at the largest finite magnitude kMaxBits (its fp32 bit pattern). `a` holds |x| bits and must
// not be NaN. Two paths, selected per lane:
//   normal:    re-bias the exponent and round the mantissa with the usual add-half-minus-one-plus-lsb
//   subnormal: add 2^(Emin - M + 23), whose ulp is the format's subnormal quantum, so the fp32 adder
//              rounds to the grid (ties to even); the integer difference is the code.
template <int M, int B, uint32_t kMaxBits>
HWY_INLINE VU MinifloatMagnitude(VU a) {
  constexpr int kEmin = 1 - B;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(kEmin + 127) << 23;
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(kEmin - M + 23 + 127) << 23;
  constexpr int kShift = 23 - M;
  const DU du;
  const DI di;
  // Clamp first (rounding max stays max). Signed compares: `a` has no sign bit.
  const VI ai = hn::BitCast(di, a);
  const VU c = hn::BitCast(du, hn::Min(ai, hn::Set(di, static_cast<int32_t>(kMaxBits))));
  const VU bias = hn::Set(du, (static_cast<uint32_t>(127 - B) << 23) - ((1u << (kShift - 1)) - 1u));
  const VU lsb = hn::And(hn::ShiftRight<kShift>(c), hn::Set(du, 1u));
  const VU normal = hn::ShiftRight<kShift>(hn::Add(hn::Sub(c, bias), lsb));
  const VF magic = hn::BitCast(DF(), hn::Set(du, kMagicBits));
  const VU sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(DF(), c), magic)), hn::Set(du, kMagicBits));
  const auto is_sub = hn::RebindMask(du, hn::Lt(hn::BitCast(di, c), hn::Set(di, static_cast<int32_t>(kMinNormalBits))));
  return hn::IfThenElse(is_sub, sub, normal);
}

// Minifloat codes (low bits of each lane) of 16 fp32 lanes. kNaNCode < 0: NaN encodes as +0 (fp4);
// else NaN encodes as sign | kNaNCode. The code's sign bit is bit 31 - kSignShift.
template <int M, int B, uint32_t kMaxBits, int kSignShift, int32_t kNaNCode, bool kFinite>
HWY_INLINE U16 EncodeMinifloat16(V16 v) {
  const DU du;
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VU u = hn::BitCast(du, v.p[i]);
    const VU a = hn::And(u, hn::Set(du, 0x7fffffffu));
    // The code's sign bit, 31 - kSignShift, from the fp32 sign by two shifts (no constant register).
    const VU sign = hn::ShiftLeft<31 - kSignShift>(hn::ShiftRight<31>(u));
    const VU mag = MinifloatMagnitude<M, B, kMaxBits>(a);
    if constexpr (kFinite) {
      r.p[i] = hn::Or(sign, mag);
    } else {
      const auto nan = hn::RebindMask(du, hn::IsNaN(v.p[i]));
      if constexpr (kNaNCode < 0) {
        r.p[i] = hn::IfThenZeroElse(nan, hn::Or(sign, mag));
      } else {
        r.p[i] = hn::Or(sign, hn::IfThenElse(nan, hn::Set(du, static_cast<uint32_t>(kNaNCode)), mag));
      }
    }
  }
  return r;
}

// fp8 e4m3fn codes; NaN -> S.1111.111, +-inf and overflow -> +-448.
HWY_INLINE U16 EncodeFp8E4M3FN16(V16 v) { return EncodeMinifloat16<3, 7, 0x43e00000u, 24, 0x7f, false>(v); }
// fp8 e5m2 codes; NaN -> S.11111.10, +-inf and overflow -> +-57344.
HWY_INLINE U16 EncodeFp8E5M2_16(V16 v) { return EncodeMinifloat16<2, 15, 0x47600000u, 24, 0x7e, false>(v); }
// fp4 e2m1 nibbles; NaN -> +0, +-inf and overflow -> +-6.
HWY_INLINE U16 EncodeFp4E2M1_16(V16 v) { return EncodeMinifloat16<1, 1, 0x40c00000u, 28, -1, false>(v); }
// Finite-input encoders (the MX kernels, whose NaN/inf blocks never reach an encoder): the same codes as
// above for every finite lane, without the NaN select.
HWY_INLINE U16 EncodeFp8E4M3FNFinite16(V16 v) { return EncodeMinifloat16<3, 7, 0x43e00000u, 24, 0, true>(v); }
HWY_INLINE U16 EncodeFp8E5M2Finite16(V16 v) { return EncodeMinifloat16<2, 15, 0x47600000u, 24, 0, true>(v); }
HWY_INLINE U16 EncodeFp4E2M1Finite16(V16 v) { return EncodeMinifloat16<1, 1, 0x40c00000u, 28, 0, true>(v); }

// int8 values of already-divided lanes: RNE, clamp to +-127, NaN -> 0 (as the low byte of each lane).
HWY_INLINE U16 EncodeInt8_16(V16 t) {
  const DU du;
  const VF hi = hn::Set(DF(), 127.f), lo = hn::Set(DF(), -127.f);
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    VF c = hn::IfThenElse(hn::Gt(t.p[i], hi), hi, t.p[i]);
    c = hn::IfThenElse(hn::Lt(c, lo), lo, c);
    // 1.5 * 2^23: the adder rounds |c| <= 127 to an integer, ties to even.
    const VF rounded = hn::Add(c, hn::Set(DF(), 12582912.f));
    const VU q = hn::Sub(hn::BitCast(du, rounded), hn::Set(du, 0x4b400000u));
    r.p[i] = hn::IfThenElseZero(hn::RebindMask(du, hn::Eq(t.p[i], t.p[i])), q);
  }
  return r;
}

// Stores the low byte of each of the 16 lanes as 16 consecutive bytes.
HWY_INLINE void StoreBytes16(uint8_t* p, U16 codes) {
  const hn::Rebind<uint8_t, DU> d8;
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::StoreU(hn::TruncateTo(d8, codes.p[i]), d8, p + i * kPart);
}
HWY_INLINE void StoreBytes16(int8_t* p, U16 codes) { StoreBytes16(reinterpret_cast<uint8_t*>(p), codes); }

// Packs 16 nibbles into 8 bytes, lane 2i in the low nibble of byte i.
HWY_INLINE void StoreNibblePairs16(uint8_t* p, U16 nibbles) {
  if constexpr (kPart >= 2) {
    const hn::Repartition<uint64_t, DU> d64;
    const hn::Rebind<uint8_t, decltype(d64)> d8;
    GB_UNROLL for (int i = 0; i < kParts; ++i) {
      const auto w = hn::BitCast(d64, nibbles.p[i]);  // lane pair (2j, 2j+1) = low / high half of word j
      const auto packed = hn::And(hn::Or(w, hn::ShiftRight<28>(w)), hn::Set(d64, 0xffu));
      hn::StoreU(hn::TruncateTo(d8, packed), d8, p + i * (kPart / 2));
    }
  } else {
    alignas(64) uint32_t t[kLanes];
    StoreU16(t, nibbles);
    for (int j = 0; j < kLanes / 2; ++j) p[j] = static_cast<uint8_t>(t[2 * j] | (t[2 * j + 1] << 4));
  }
}

// Tails (n < 16 values): the same 16-lane encoders on a zero-padded vector (LoadTail16), then the first n
// codes. Lanes are independent, so the codes are those of the full-vector path; one code path for every
// length, and no scalar loop for the compiler to vectorize again.
HWY_INLINE void StoreBytesTail16(uint8_t* p, U16 codes, int64_t n) {
  alignas(16) uint8_t t[kLanes];
  StoreBytes16(t, codes);
  std::memcpy(p, t, static_cast<size_t>(n));
}
HWY_INLINE void StoreBytesTail16(int8_t* p, U16 codes, int64_t n) {
  StoreBytesTail16(reinterpret_cast<uint8_t*>(p), codes, n);
}
// n (even, < 16) nibbles packed into n / 2 bytes.
HWY_INLINE void StoreNibblePairsTail16(uint8_t* p, U16 nibbles, int64_t n) {
  alignas(16) uint8_t t[kLanes / 2];
  StoreNibblePairs16(t, nibbles);
  std::memcpy(p, t, static_cast<size_t>(n / 2));
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
