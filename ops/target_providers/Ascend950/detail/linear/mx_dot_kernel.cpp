// MX weight decode and fused decode + dot GEMV (contract: mx_dot_kernel.h). Each 16-element chunk of a
// weight row is decoded in registers from its codes with integer operations (fp8 e4m3fn: exponent and
// mantissa shifted into fp32 position and scaled by 2^120, subnormals included; fp4 e2m1: the eight magnitudes built
// from exponent and mantissa bits) and multiplied by its block's power-of-two scale (one IEEE multiplication, as the
// scalar decode), then used in the contract's FMA chain.
#include "ops/target_providers/Ascend950/detail/linear/mx_dot_kernel.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/target_providers/Ascend950/detail/linear/mx_dot_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace genbridge::simd::HWY_NAMESPACE;

// The fp32 bits the scalar decode table gives the positive e4m3fn NaN code.
HWY_INLINE uint32_t E4m3NanBits() {
  uint32_t bits;
  const float v = genbridge::detail::fp8_e4m3fn_decode_table()[0x7F];
  std::memcpy(&bits, &v, 4);
  return bits;
}

// fp8 e4m3fn codes (u32 lanes) -> fp32; nan_bits = E4m3NanBits(). The magnitude bits moved up by 20 are the
// fp32 pattern of value * 2^-120 for normal and subnormal codes alike (a subnormal e4m3 lands on an fp32
// subnormal), so one exact multiplication by 2^120 gives the value (subnormal inputs are not flushed: nothing
// in the process sets DAZ/FTZ).
HWY_INLINE VF DecodeE4m3(VU u, uint32_t nan_bits) {
  const DU du;
  const DI di;
  const DF df;
  const VU em = hn::And(u, hn::Set(du, 0x7Fu));
  const VU sign = hn::ShiftLeft<24>(hn::And(u, hn::Set(du, 0x80u)));
  const VU magnitude = hn::BitCast(du, hn::Mul(hn::BitCast(df, hn::ShiftLeft<20>(em)), hn::Set(df, 0x1p120f)));
  const VU bits = hn::IfThenElse(hn::RebindMask(du, hn::Eq(hn::BitCast(di, em), hn::Set(di, 0x7F))),
                                 hn::Set(du, nan_bits), magnitude);
  return hn::BitCast(df, hn::Or(bits, sign));
}

// fp4 e2m1 codes (u32 lanes, 0..15) -> fp32.
HWY_INLINE VF DecodeE2m1(VU c) {
  const DU du;
  const DI di;
  const DF df;
  const VU m = hn::And(c, hn::Set(du, 7u));
  const VU sign = hn::ShiftLeft<28>(hn::And(c, hn::Set(du, 8u)));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(hn::ShiftRight<1>(m), hn::Set(du, 126u))),
                           hn::ShiftLeft<22>(hn::And(m, hn::Set(du, 1u))));
  const VI mi = hn::BitCast(di, m);
  const VU small = hn::IfThenElseZero(hn::RebindMask(du, hn::Eq(mi, hn::Set(di, 1))), hn::Set(du, 0x3F000000u));
  const VU bits = hn::IfThenElse(hn::RebindMask(du, hn::Lt(mi, hn::Set(di, 2))), small, normal);
  return hn::BitCast(df, hn::Or(bits, sign));
}

// Elements [k, k + 16) of a row decoded and scaled (one IEEE multiplication by the block's scale).
template <bool kFp4>
HWY_INLINE V16 DecodeChunk(const uint8_t* HWY_RESTRICT q, int64_t k, float scale, uint32_t nan_bits) {
  const hn::Rebind<uint8_t, DU> d8;
  const DU du;
  V16 v;
  if constexpr (kFp4) {
    // The 16 nibbles in element order: byte i's low nibble is element 2i, its high nibble element 2i + 1.
    alignas(16) uint8_t codes[kLanes];
    const uint8_t* b = q + k / 2;
#if HWY_TARGET == HWY_SCALAR
    for (int i = 0; i < kLanes / 2; ++i) {
      codes[2 * i] = b[i] & 0xF;
      codes[2 * i + 1] = b[i] >> 4;
    }
#else
    const hn::FixedTag<uint8_t, 16> d16;
    uint64_t bytes;
    std::memcpy(&bytes, b, 8);
    const auto packed = hn::BitCast(d16, hn::Set(hn::FixedTag<uint64_t, 2>(), bytes));
    const auto lo = hn::And(packed, hn::Set(d16, uint8_t{0x0F}));
    const auto hi = hn::ShiftRight<4>(packed);
    hn::Store(hn::InterleaveLower(d16, lo, hi), d16, codes);
#endif
    GB_UNROLL for (int i = 0; i < kParts; ++i) v.p[i] = DecodeE2m1(hn::PromoteTo(du, hn::LoadU(d8, codes + i * kPart)));
  } else {
    GB_UNROLL for (int i = 0; i < kParts; ++i) {
      v.p[i] = DecodeE4m3(hn::PromoteTo(du, hn::LoadU(d8, q + k + i * kPart)), nan_bits);
    }
  }
  return Mul16(v, Set16(scale));
}

// The last n (< 16) elements from k, zero-padded, decoded with the scalar tables.
template <bool kFp4>
HWY_INLINE void DecodeTail(const uint8_t* q, int64_t k, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < kLanes; ++i) out[i] = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = k + i;
    float v;
    if constexpr (kFp4) {
      const uint8_t b = q[e / 2];
      v = genbridge::detail::kFp4E2M1Values[e % 2 ? b >> 4 : b & 0xF];
    } else {
      v = genbridge::detail::fp8_e4m3fn_decode_table()[q[e]];
    }
    out[i] = v * scale;
  }
}

template <bool kFp4>
void MxDecodeRows(const uint8_t* q, int64_t ldq, const uint8_t* scale, int64_t lds, int64_t n, int64_t K, float* out,
                  int64_t ldo) {
  const float* e8m0 = genbridge::detail::e8m0_decode_table();
  const uint32_t nan_bits = E4m3NanBits();
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* qr = q + r * ldq;
    const uint8_t* sr = scale + r * lds;
    float* o = out + r * ldo;
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) Store16(o + k, DecodeChunk<kFp4>(qr, k, e8m0[sr[k / 32]], nan_bits));
    if (k < K) {
      alignas(64) float tmp[kLanes];
      DecodeTail<kFp4>(qr, k, K - k, e8m0[sr[k / 32]], tmp);
      std::memcpy(o + k, tmp, static_cast<size_t>(K - k) * sizeof(float));
    }
  }
}

template <bool kFp4, int MR>
constexpr int MxGemvCols() {
  // Registers: the accumulators, a decoded weight, an input vector and about 8 decode constants.
  const int nr = (kVecRegs - 8 - 2 * kParts) / (MR * kParts);
  return nr < 1 ? 1 : nr > 4 ? 4 : nr;
}

template <bool kFp4, int MR, int NR>
HWY_NOINLINE void MxGemvTile(const float* HWY_RESTRICT a, int64_t lda, const uint8_t* HWY_RESTRICT q, int64_t ldq,
                             const uint8_t* HWY_RESTRICT scale, int64_t lds, int64_t K, float* HWY_RESTRICT out,
                             int64_t ldo) {
  const float* e8m0 = genbridge::detail::e8m0_decode_table();
  const uint32_t nan_bits = E4m3NanBits();
  V16 acc[MR][NR];
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) acc[r][c] = Zero16();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const V16 w = DecodeChunk<kFp4>(q + c * ldq, k, e8m0[scale[c * lds + k / 32]], nan_bits);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), w, acc[r][c]);
    }
  }
  if (k < K) {
    const int64_t n = K - k;
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      alignas(64) float tmp[kLanes];
      DecodeTail<kFp4>(q + c * ldq, k, n, e8m0[scale[c * lds + k / 32]], tmp);
      const V16 w = Load16(tmp);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(LoadTail16(a + r * lda + k, n), w, acc[r][c]);
    }
  }
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) out[r * ldo + c] =
      ReduceAdd16(acc[r][c]);
}

template <bool kFp4, int MR>
void MxGemvRows(const float* a, int64_t lda, const uint8_t* q, int64_t ldq, const uint8_t* scale, int64_t lds,
                int64_t n, int64_t K, float* out, int64_t ldo) {
  constexpr int NR = MxGemvCols<kFp4, MR>();
  int64_t c = 0;
  for (; c + NR <= n; c += NR)
    MxGemvTile<kFp4, MR, NR>(a, lda, q + c * ldq, ldq, scale + c * lds, lds, K, out + c, ldo);
  for (; c < n; ++c) MxGemvTile<kFp4, MR, 1>(a, lda, q + c * ldq, ldq, scale + c * lds, lds, K, out + c, ldo);
}

template <bool kFp4>
void MxGemv(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* scale, int64_t lds,
            int64_t n, int64_t K, float* out, int64_t ldo) {
  switch (m) {
    case 1:
      return MxGemvRows<kFp4, 1>(a, lda, q, ldq, scale, lds, n, K, out, ldo);
    case 2:
      return MxGemvRows<kFp4, 2>(a, lda, q, ldq, scale, lds, n, K, out, ldo);
    case 3:
      return MxGemvRows<kFp4, 3>(a, lda, q, ldq, scale, lds, n, K, out, ldo);
    default:
      return MxGemvRows<kFp4, 4>(a, lda, q, ldq, scale, lds, n, K, out, ldo);
  }
}

void MxDecodeRowsFp8(const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds, int64_t n, int64_t K, float* out,
                     int64_t ldo) {
  MxDecodeRows<false>(q, ldq, s, lds, n, K, out, ldo);
}
void MxDecodeRowsFp4(const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds, int64_t n, int64_t K, float* out,
                     int64_t ldo) {
  MxDecodeRows<true>(q, ldq, s, lds, n, K, out, ldo);
}
void MxGemvFp8(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds,
               int64_t n, int64_t K, float* out, int64_t ldo) {
  MxGemv<false>(a, lda, m, q, ldq, s, lds, n, K, out, ldo);
}
void MxGemvFp4(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds,
               int64_t n, int64_t K, float* out, int64_t ldo) {
  MxGemv<true>(a, lda, m, q, ldq, s, lds, n, K, out, ldo);
}

}  // namespace HWY_NAMESPACE
}  // namespace genbridge::ops::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(MxDecodeRowsFp8);
HWY_EXPORT(MxDecodeRowsFp4);
HWY_EXPORT(MxGemvFp8);
HWY_EXPORT(MxGemvFp4);

MxDecodeRowsFn mx_decode_rows_fn(bool fp4) { return fp4 ? GB_DISPATCH(MxDecodeRowsFp4) : GB_DISPATCH(MxDecodeRowsFp8); }
MxGemvFn mx_gemv_fn(bool fp4) { return fp4 ? GB_DISPATCH(MxGemvFp4) : GB_DISPATCH(MxGemvFp8); }

}  // namespace genbridge::ops::detail
#endif
