// Internal: the 16-lane fp32 vector every host kernel's reduction-order contract is written in, on top of
// Google Highway. Included once per CPU target from a kernel source compiled with hwy/foreach_target.h
// (per-target include guard below, Highway's convention for "-inl.h" headers), so everything here lives
// in genbridge::simd::HWY_NAMESPACE and each target gets its own copy.
//
// The lane count is fixed at 16 whatever the vector width: a V16 is 1 x 16 lanes on AVX-512, 2 x 8 on
// AVX2, 4 x 4 on SSE4 and NEON, 16 x 1 on the scalar fallback (Highway's SCALAR with GCC < 12.3, else
// EMU128: 4 x 4). Lane l of part i is contract lane
// i * kPart + l, so every lane-wise operation and the fixed pairwise reduction give the same bits on
// every target. Fma16 is a fused multiply-add (one rounding) on every target: targets without FMA
// instructions (sse4, scalar) compute it exactly with std::fma, slower but the same bits.
//
// Loops over parts are unrolled (GB_UNROLL) so that a V16 lives in registers, not on the stack.

#if defined(GENBRIDGE_CORE_SIMD_VEC16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GENBRIDGE_CORE_SIMD_VEC16_INL_H_
#undef GENBRIDGE_CORE_SIMD_VEC16_INL_H_
#else
#define GENBRIDGE_CORE_SIMD_VEC16_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "genbridge/core/formats.h"

#ifndef GB_UNROLL
#define GB_UNROLL _Pragma("GCC unroll 16")
#endif

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr int kLanes = 16;
using DF = hn::CappedTag<float, kLanes>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;
using MF = hn::Mask<DF>;
// Lanes per hardware vector, and hardware vectors per V16.
inline constexpr int kPart = static_cast<int>(hn::MaxLanes(DF()));
inline constexpr int kParts = kLanes / kPart;
static_assert(kLanes % kPart == 0, "a V16 must be whole hardware vectors");

// True on targets whose MulAdd is a fused multiply-add.
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
inline constexpr bool kNativeFma = false;
#else
inline constexpr bool kNativeFma = true;
#endif
// True on targets with fp16 conversion instructions (F16C, NEON): exact widening, and narrowing that
// rounds to nearest even with subnormals.
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
inline constexpr bool kNativeF16Demote = true;
#else
inline constexpr bool kNativeF16Demote = false;
#endif

// Architectural vector registers of the target: what register-blocked tiles are sized from.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SVE || \
    HWY_TARGET == HWY_SVE2
inline constexpr int kVecRegs = 32;
#else
inline constexpr int kVecRegs = 16;
#endif

// The constructors are written out (not implicit) so that they are compiled with this target's options:
// GCC 12 gives implicitly-defined members of a class declared under "#pragma GCC target" the translation
// unit's options, and inlining Highway's vector constructors into them then fails on aarch64 (NEON is
// "+crypto" there).
struct V16 {
  HWY_INLINE V16() {}
  VF p[kParts];
};
struct U16 {
  HWY_INLINE U16() {}
  VU p[kParts];
};
struct I16 {
  HWY_INLINE I16() {}
  VI p[kParts];
};
struct M16 {
  HWY_INLINE M16() {}
  MF p[kParts];
};

// ---- construction, loads and stores (16 consecutive elements; unaligned) ----

HWY_INLINE V16 Zero16() {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::Zero(DF());
  return r;
}
HWY_INLINE V16 Set16(float x) {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::Set(DF(), x);
  return r;
}
HWY_INLINE U16 SetU16(uint32_t x) {
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::Set(DU(), x);
  return r;
}
HWY_INLINE V16 Load16(const float* x) {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::LoadU(DF(), x + i * kPart);
  return r;
}
// bf16 widens exactly (a shift).
HWY_INLINE V16 Load16(const bf16_t* x) {
  const hn::Rebind<hwy::bfloat16_t, DF> db;
  const auto* px = reinterpret_cast<const hwy::bfloat16_t*>(x);
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::PromoteTo(DF(), hn::LoadU(db, px + i * kPart));
  return r;
}
// fp16 widens exactly (subnormals, infinities and NaN payloads included; a signalling NaN becomes quiet,
// as F16C does). Highway's emulation on targets without a conversion instruction mishandles infinities
// and NaNs, so those targets use the scalar codec.
HWY_INLINE V16 Load16(const fp16_t* x) {
  if constexpr (kNativeF16Demote) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* px = reinterpret_cast<const hwy::float16_t*>(x);
    V16 r;
    GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = hn::PromoteTo(DF(), hn::LoadU(dh, px + i * kPart));
    return r;
  } else {
    alignas(64) float tmp[kLanes];
    for (int i = 0; i < kLanes; ++i) tmp[i] = fp16_to_float(x[i]);
    return Load16(static_cast<const float*>(tmp));
  }
}
HWY_INLINE void Store16(float* y, V16 v) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::StoreU(v.p[i], DF(), y + i * kPart);
}
// One part's bf16 bits as uint16 lanes: round to nearest even; NaN -> quiet NaN with the payload's top bits
// (float_to_bf16's bits). Store16 and the streaming stores write them.
HWY_INLINE auto Bf16BitsPart(VF f) {
  const VU u = hn::BitCast(DU(), f);
  const VU hi = hn::ShiftRight<16>(u);
  const VU rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(DU(), 0x7fffu)), hn::And(hi, hn::Set(DU(), 1u))));
  const VU quiet = hn::Or(hi, hn::Set(DU(), 0x40u));
  const auto is_nan = hn::RebindMask(DU(), hn::Gt(hn::BitCast(DI(), hn::And(u, hn::Set(DU(), 0x7fffffffu))),
                                                   hn::Set(DI(), 0x7f800000)));
  return hn::DemoteTo(hn::Rebind<uint16_t, DI>(), hn::BitCast(DI(), hn::IfThenElse(is_nan, quiet, rounded)));
}
HWY_INLINE void Store16(bf16_t* y, V16 v) {
  const hn::Rebind<uint16_t, DI> d16;
  auto* py = reinterpret_cast<uint16_t*>(y);
  GB_UNROLL for (int i = 0; i < kParts; ++i) hn::StoreU(Bf16BitsPart(v.p[i]), d16, py + i * kPart);
}
// Round to nearest even with subnormals; overflow -> inf; NaN -> quiet NaN (float_to_fp16's bits).
HWY_INLINE void Store16(fp16_t* y, V16 v) {
  if constexpr (kNativeF16Demote) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    auto* py = reinterpret_cast<hwy::float16_t*>(y);
    GB_UNROLL for (int i = 0; i < kParts; ++i) hn::StoreU(hn::DemoteTo(dh, v.p[i]), dh, py + i * kPart);
  } else {
    alignas(64) float tmp[kLanes];
    Store16(tmp, v);
    for (int i = 0; i < kLanes; ++i) y[i] = float_to_fp16(tmp[i]);
  }
}
// The first n (< 16) elements of x, zero-padded to 16 lanes.
template <typename T>
HWY_INLINE V16 LoadTail16(const T* x, int64_t n) {
  T tmp[kLanes];
  std::memset(static_cast<void*>(tmp), 0, sizeof tmp);
  std::memcpy(static_cast<void*>(tmp), x, static_cast<size_t>(n) * sizeof(T));
  return Load16(tmp);
}
// Lane i of v (slow: for tails and tests).
HWY_INLINE float Lane16(V16 v, int i) {
  alignas(64) float tmp[kLanes];
  Store16(tmp, v);
  return tmp[i];
}

// ---- lane-wise arithmetic: one IEEE operation each ----

#define GB_V16_BINARY(NAME, OP)                                  \
  HWY_INLINE V16 NAME(V16 a, V16 b) {                           \
    GB_UNROLL for (int i = 0; i < kParts; ++i) a.p[i] = OP(a.p[i], b.p[i]); \
    return a;                                                   \
  }
GB_V16_BINARY(Add16, hn::Add)
GB_V16_BINARY(Sub16, hn::Sub)
GB_V16_BINARY(Mul16, hn::Mul)
GB_V16_BINARY(Div16, hn::Div)
#undef GB_V16_BINARY

HWY_INLINE V16 operator+(V16 a, V16 b) { return Add16(a, b); }
HWY_INLINE V16 operator-(V16 a, V16 b) { return Sub16(a, b); }
HWY_INLINE V16 operator*(V16 a, V16 b) { return Mul16(a, b); }
HWY_INLINE V16 operator/(V16 a, V16 b) { return Div16(a, b); }

// a * b + c with one rounding, on every target.
HWY_INLINE V16 Fma16(V16 a, V16 b, V16 c) {
  if constexpr (kNativeFma) {
    GB_UNROLL for (int i = 0; i < kParts; ++i) c.p[i] = hn::MulAdd(a.p[i], b.p[i], c.p[i]);
    return c;
  } else {
    alignas(64) float ta[kLanes], tb[kLanes], tc[kLanes];
    Store16(ta, a);
    Store16(tb, b);
    Store16(tc, c);
    for (int i = 0; i < kLanes; ++i) tc[i] = std::fma(ta[i], tb[i], tc[i]);
    return Load16(tc);
  }
}

// Lane-wise a > b ? a : b (the second operand when unordered), as `a > b ? a : b` in scalar code.
HWY_INLINE V16 MaxGt16(V16 a, V16 b) {
  GB_UNROLL for (int i = 0; i < kParts; ++i) a.p[i] = hn::IfThenElse(hn::Gt(a.p[i], b.p[i]), a.p[i], b.p[i]);
  return a;
}

// ---- reductions in the contract's fixed order ----

// Sum of the 16 lanes: s8[i] = v[i] + v[i + 8], s4[i] = s8[i] + s8[i + 4], then (s4[0] + s4[2]) + (s4[1] + s4[3]).
// (A template so that only the branch for this target's part width is compiled.)
template <int P = kPart>
HWY_INLINE float ReduceAdd16(V16 v) {
#if HWY_TARGET == HWY_SCALAR  // one lane per part: Highway's fallback where GCC < 12.3 cannot use EMU128
  alignas(64) float t[kLanes];
  Store16(t, v);
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = t[i] + t[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
#else
  if constexpr (P == 16) {
    const hn::Half<DF> d8;
    const hn::Half<decltype(d8)> d4;
    const auto s8 = hn::Add(hn::LowerHalf(d8, v.p[0]), hn::UpperHalf(d8, v.p[0]));
    const auto s4 = hn::Add(hn::LowerHalf(d4, s8), hn::UpperHalf(d4, s8));
    alignas(16) float t[4];
    hn::Store(s4, d4, t);
    return (t[0] + t[2]) + (t[1] + t[3]);
  } else if constexpr (P == 8) {
    const hn::Half<DF> d4;
    const VF s8 = hn::Add(v.p[0], v.p[1]);
    const auto s4 = hn::Add(hn::LowerHalf(d4, s8), hn::UpperHalf(d4, s8));
    alignas(16) float t[4];
    hn::Store(s4, d4, t);
    return (t[0] + t[2]) + (t[1] + t[3]);
  } else {
    static_assert(P == 4, "V16 parts of 4, 8 or 16 lanes");
    const VF s4 = hn::Add(hn::Add(v.p[0], v.p[2]), hn::Add(v.p[1], v.p[3]));
    alignas(16) float t[4];
    hn::Store(s4, DF(), t);
    return (t[0] + t[2]) + (t[1] + t[3]);
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::simd
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
