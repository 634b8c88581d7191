// MX weight decode, the fused decode + dot GEMV and the GEMM's weight chunks (contract: mx_dot_kernel.h). Each
// 16-element chunk of a weight row is decoded in registers and used in the contract's FMA chain. Two decodes give
// the same values: the exact one (every code and scale: the element built from its bits, then one IEEE
// multiplication by 2^(s - 127), as the scalar decode tables do), and the fast one the kernels run (below: fp8 in
// one multiplication by 2^(s - 7) when that is a normal fp32 and no NaN code is present, tiles or chunks that do
// not qualify redone exactly; fp4 through a per-block scaled table and a lane permutation on AVX2 / AVX-512).
#include "ops/target_providers/Ascend950/linear/mx_dot_kernel.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "ops/common/linear/dot_kernel.h"

#define HWY_TARGET_INCLUDE "ops/target_providers/Ascend950/linear/mx_dot_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// The fp32 bits the scalar decode table gives the e4m3fn NaN codes (0x7F and 0xFF alike).
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
  // Both NaN codes decode to the table's NaN (the positive quiet NaN: the sign is not kept).
  return hn::BitCast(df, hn::IfThenElse(hn::RebindMask(du, hn::Eq(hn::BitCast(di, em), hn::Set(di, 0x7F))),
                                        hn::Set(du, nan_bits), hn::Or(magnitude, sign)));
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

// ---------------------------------------------------------------------------------------------------
// Fast decode (the GEMV's and the GEMM panels' common case). Same values as the exact decode above:
//
// fp8 e4m3fn: the sign-extended byte shifted left by 20 and masked with 0x87F00000 is the fp32 pattern of
// element * 2^-120 (sign at bit 31, exponent and mantissa at bits 20..26; an e4m3 subnormal lands on an fp32
// subnormal), so ONE multiplication by 2^(s - 7) gives fl32(element * 2^(s - 127)) (the product of two exact
// values, rounded once) as long as 2^(s - 7) is a normal fp32, i.e. s <= kFp8FastMaxScale. A tile that meets a
// larger scale (or the NaN codes S.1111.111, which this decode would turn into finite numbers) is computed
// again with the exact decode; both are detected cheaply (a scalar max of the scales, a byte max of the codes
// with the sign bit set: 0xFF only for a NaN code).
//
// fp4 e2m1 (x86 with AVX2 / AVX-512): the block's table of the 16 code values (AVX-512; AVX2: two tables of 8, the
// positive and the negative codes) is scaled once per block (one multiplication per entry: exactly
// fl32(value * 2^(s - 127)), every scale, NaN included), then each code is looked up with a lane permutation
// (vpermps) whose index is the nibble itself, shifted into the lane by a variable shift of the broadcast codes (AVX2:
// the code's sign bit, shifted to bit 31, selects the table). On AVX-512 the 64-bit shift puts element q in
// lane 2q and element 8 + q in lane 2q + 1, so the input rows are permuted the same way once per call and the
// accumulator lanes are put back in contract order before the reduction (each lane's chain is unchanged).

inline constexpr uint32_t kFp8FastMaxScale = 134;

// 2^(s - 7) (biased exponent s + 120) for s <= kFp8FastMaxScale; garbage above (those tiles are redone).
HWY_INLINE VF Fp8FastMultiplier(uint32_t s) { return hn::BitCast(DF(), hn::Set(DU(), (s + 120u) << 23)); }
// Nonzero (bit 8 and up) once a scale above kFp8FastMaxScale was or-ed in.
HWY_INLINE uint32_t Fp8ScaleOver(uint32_t s) { return s + (255u - kFp8FastMaxScale); }

HWY_INLINE V16 DecodeE4m3Fast16(const uint8_t* HWY_RESTRICT p, VF mult) {
  const hn::Rebind<int8_t, DI> d8;
  const DI di;
  V16 v;
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VI sx = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p) + i * kPart));
    const VI bits = hn::And(hn::ShiftLeft<20>(sx), hn::Set(di, static_cast<int32_t>(0x87F00000u)));
    v.p[i] = hn::Mul(hn::BitCast(DF(), bits), mult);
  }
  return v;
}

// NaN codes: a running byte maximum of codes | 0x80 reaches 0xFF iff a code is S.1111.111.
using DB = hn::CappedTag<uint8_t, 64>;
using VB = hn::Vec<DB>;
template <int kBytes>  // a multiple of the vector width
HWY_INLINE VB NanScan(VB acc, const uint8_t* HWY_RESTRICT p) {
  constexpr int kW = static_cast<int>(hn::MaxLanes(DB()));
  static_assert(kBytes % kW == 0, "whole vectors");
  const DB db;
  GB_UNROLL for (int i = 0; i < kBytes / kW; ++i) acc =
      hn::Max(acc, hn::Or(hn::LoadU(db, p + i * kW), hn::Set(db, uint8_t{0x80})));
  return acc;
}
HWY_INLINE bool NanSeen(VB acc) { return !hn::AllFalse(DB(), hn::Eq(acc, hn::Set(DB(), uint8_t{0xFF}))); }
// The same for 16 codes (the chunks after the last whole 64).
HWY_INLINE bool NanIn16(const uint8_t* HWY_RESTRICT p) {
  const hn::CappedTag<uint8_t, 16> d;
  constexpr int kW = static_cast<int>(hn::MaxLanes(d));
  bool nan = false;
  GB_UNROLL for (int i = 0; i < 16 / kW; ++i) nan |=
      !hn::AllFalse(d, hn::Eq(hn::Or(hn::LoadU(d, p + i * kW), hn::Set(d, uint8_t{0x80})), hn::Set(d, uint8_t{0xFF})));
  return nan;
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_AVX2
inline constexpr bool kFp4Fast = true;
#else
inline constexpr bool kFp4Fast = false;
#endif
// AVX-512: lanes of a decoded fp4 chunk are permuted (element q in lane 2q, 8 + q in lane 2q + 1).
inline constexpr bool kFp4Permuted = kFp4Fast && kPart == 16;

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
using D64 = hn::Repartition<uint64_t, DF>;
struct Fp4Consts {
  hn::Vec<D64> shifts;  // 4 q in 64-bit lane q
};
HWY_INLINE Fp4Consts MakeFp4Consts() { return {hn::ShiftLeft<2>(hn::Iota(D64(), 0))}; }
// The block's table: lane c = fl32(value(c) * scale), c = 0..15.
HWY_INLINE V16 Fp4Table(float scale) {
  V16 t;
  t.p[0] = hn::Mul(hn::LoadU(DF(), genbridge::detail::kFp4E2M1Values), hn::Set(DF(), scale));
  return t;
}
HWY_INLINE V16 DecodeE2m1Fast16(const uint8_t* HWY_RESTRICT p, const V16& table, const Fp4Consts& c) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  const auto idx = hn::Shr(hn::Set(D64(), w), c.shifts);
  V16 v;
  v.p[0] = VF{_mm512_permutexvar_ps(idx.raw, table.p[0].raw)};  // uses the low 4 bits of each 32-bit lane
  return v;
}
// Contract lane l of a permuted accumulator, and the permutation applied to the input rows.
HWY_INLINE V16 Fp4Unpermute(V16 v) {
  alignas(64) static constexpr int32_t kIdx[16] = {0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15};
  v.p[0] = hn::TableLookupLanes(v.p[0], hn::SetTableIndices(DF(), kIdx));
  return v;
}
HWY_INLINE V16 Fp4Permute(V16 v) {
  alignas(64) static constexpr int32_t kIdx[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
  v.p[0] = hn::TableLookupLanes(v.p[0], hn::SetTableIndices(DF(), kIdx));
  return v;
}
#elif HWY_TARGET == HWY_AVX2
struct Fp4Consts {
  VU shifts;  // 4 j in lane j
};
HWY_INLINE Fp4Consts MakeFp4Consts() { return {hn::ShiftLeft<2>(hn::Iota(DU(), 0))}; }
// The block's tables: lane c = fl32(value(c) * scale) for the positive codes c = 0..7 (p[0]) and the negative
// codes 8 + c (p[1]), each one IEEE multiplication as the scalar decode does (a NaN scale keeps its own sign).
HWY_INLINE V16 Fp4Table(float scale) {
  V16 t;
  GB_UNROLL for (int i = 0; i < 2; ++i) t.p[i] =
      hn::Mul(hn::LoadU(DF(), genbridge::detail::kFp4E2M1Values + 8 * i), hn::Set(DF(), scale));
  return t;
}
HWY_INLINE V16 DecodeE2m1Fast16(const uint8_t* HWY_RESTRICT p, const V16& table, const Fp4Consts& c) {
  V16 v;
  GB_UNROLL for (int i = 0; i < 2; ++i) {
    uint32_t w;  // (a separate 4-byte load per part: a broadcast load, not a load through a general register)
    std::memcpy(&w, p + 4 * i, 4);
    const VU idx = hn::Shr(hn::Set(DU(), w), c.shifts);  // nibble j in the low bits of lane j
    // vpermps uses the low 3 bits; the sign (bit 3) moved to bit 31 selects the table.
    const VF pos = VF{_mm256_permutevar8x32_ps(table.p[0].raw, idx.raw)};
    const VF neg = VF{_mm256_permutevar8x32_ps(table.p[1].raw, idx.raw)};
    v.p[i] = hn::IfNegativeThenElse(hn::BitCast(DF(), hn::ShiftLeft<28>(idx)), neg, pos);
  }
  return v;
}
HWY_INLINE V16 Fp4Unpermute(V16 v) { return v; }
HWY_INLINE V16 Fp4Permute(V16 v) { return v; }
#else  // never called (kFp4Fast is false): declarations for the templates below
struct Fp4Consts {};
HWY_INLINE Fp4Consts MakeFp4Consts() { return {}; }
HWY_INLINE V16 Fp4Table(float) { return Zero16(); }
HWY_INLINE V16 DecodeE2m1Fast16(const uint8_t*, const V16&, const Fp4Consts&) { return Zero16(); }
HWY_INLINE V16 Fp4Unpermute(V16 v) { return v; }
HWY_INLINE V16 Fp4Permute(V16 v) { return v; }
#endif

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

template <typename T>
HWY_INLINE void PrefetchL2(const T* base, int64_t i) {
  // Integer arithmetic: the address may lie past the end of the array (prefetches never fault).
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + i * sizeof(T)), 0, 1);
}

// Weight rows per fast GEMV tile for MR input rows: MR * NR accumulators plus the decode's constants and
// temporaries fit the registers.
template <int MR>
constexpr int FastGemvCols() {
  const int nr = (kVecRegs - 8) / (MR * kParts);
  return nr < 1 ? 1 : nr > 4 ? 4 : nr;
}

// fp8 GEMV tile with the fast decode. Returns false (outputs not written) when the tile met a scale above
// kFp8FastMaxScale or a NaN code: the caller computes it again with the exact decode.
template <int MR, int NR>
HWY_NOINLINE bool Fp8GemvTileFast(const float* HWY_RESTRICT a, int64_t lda, const uint8_t* HWY_RESTRICT q, int64_t ldq,
                                  const uint8_t* HWY_RESTRICT scale, int64_t lds, int64_t K, float* HWY_RESTRICT out,
                                  int64_t ldo) {
  V16 acc[MR][NR];
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) acc[r][c] = Zero16();
  VB nan = hn::Zero(DB());
  bool nan16 = false;
  uint32_t over = 0;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    GB_UNROLL for (int c = 0; c < NR; ++c) PrefetchL2(q, (c + NR) * ldq + k);
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const uint8_t* qc = q + c * ldq + k;
      const uint32_t s0 = scale[c * lds + k / 32], s1 = scale[c * lds + k / 32 + 1];
      over |= Fp8ScaleOver(s0) | Fp8ScaleOver(s1);
      const VF m0 = Fp8FastMultiplier(s0), m1 = Fp8FastMultiplier(s1);
      nan = NanScan<64>(nan, qc);
      GB_UNROLL for (int h = 0; h < 4; ++h) {
        const V16 w = DecodeE4m3Fast16(qc + 16 * h, h < 2 ? m0 : m1);
        GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k + 16 * h), w, acc[r][c]);
      }
    }
  }
  for (; k + kLanes <= K; k += kLanes) {
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const uint32_t s = scale[c * lds + k / 32];
      over |= Fp8ScaleOver(s);
      nan16 |= NanIn16(q + c * ldq + k);
      const V16 w = DecodeE4m3Fast16(q + c * ldq + k, Fp8FastMultiplier(s));
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), w, acc[r][c]);
    }
  }
  if (k < K) {  // exact scalar decode of the last elements
    const float* e8m0 = genbridge::detail::e8m0_decode_table();
    const int64_t n = K - k;
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      alignas(64) float tmp[kLanes];
      DecodeTail<false>(q + c * ldq, k, n, e8m0[scale[c * lds + k / 32]], tmp);
      const V16 w = Load16(tmp);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(LoadTail16(a + r * lda + k, n), w, acc[r][c]);
    }
  }
  if ((over >> 8) != 0 || nan16 || NanSeen(nan)) return false;
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) out[r * ldo + c] =
      ReduceAdd16(acc[r][c]);
  return true;
}

// fp4 GEMV tile with the table decode (kFp4Fast targets). `a`: the input rows, permuted per 16 elements like
// the decoded chunks (kFp4Permuted) and zero-padded to a multiple of 16 elements.
template <int MR, int NR>
HWY_NOINLINE void Fp4GemvTileFast(const float* HWY_RESTRICT a, int64_t lda, const uint8_t* HWY_RESTRICT q, int64_t ldq,
                                  const uint8_t* HWY_RESTRICT scale, int64_t lds, int64_t K, float* HWY_RESTRICT out,
                                  int64_t ldo) {
  const float* e8m0 = genbridge::detail::e8m0_decode_table();
  const Fp4Consts cst = MakeFp4Consts();
  V16 acc[MR][NR];
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) acc[r][c] = Zero16();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if (k % 128 == 0) GB_UNROLL for (int c = 0; c < NR; ++c) PrefetchL2(q, (c + NR) * ldq + k / 2);
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const V16 table = Fp4Table(e8m0[scale[c * lds + k / 32]]);
      GB_UNROLL for (int h = 0; h < 2; ++h) {
        const V16 w = DecodeE2m1Fast16(q + c * ldq + k / 2 + 8 * h, table, cst);
        GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k + 16 * h), w, acc[r][c]);
      }
    }
  }
  for (; k + kLanes <= K; k += kLanes) {
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const V16 w = DecodeE2m1Fast16(q + c * ldq + k / 2, Fp4Table(e8m0[scale[c * lds + k / 32]]), cst);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), w, acc[r][c]);
    }
  }
  if (k < K) {
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      alignas(64) float tmp[kLanes];
      DecodeTail<true>(q + c * ldq, k, K - k, e8m0[scale[c * lds + k / 32]], tmp);
      const V16 w = Fp4Permute(Load16(tmp));
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), w, acc[r][c]);
    }
  }
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) out[r * ldo + c] =
      ReduceAdd16(Fp4Unpermute(acc[r][c]));
}

template <bool kFp4, int MR, int NR>
HWY_INLINE void MxGemvTileAny(const float* a, int64_t lda, const uint8_t* q, int64_t ldq, const uint8_t* scale,
                              int64_t lds, int64_t K, float* out, int64_t ldo) {
  if constexpr (kFp4) {
    if constexpr (kFp4Fast) {
      Fp4GemvTileFast<MR, NR>(a, lda, q, ldq, scale, lds, K, out, ldo);
    } else {
      MxGemvTile<true, MR, NR>(a, lda, q, ldq, scale, lds, K, out, ldo);
    }
  } else {
    if (!Fp8GemvTileFast<MR, NR>(a, lda, q, ldq, scale, lds, K, out, ldo))
      MxGemvTile<false, MR, NR>(a, lda, q, ldq, scale, lds, K, out, ldo);
  }
}

template <bool kFp4, int MR>
void MxGemvRows(const float* a, int64_t lda, const uint8_t* q, int64_t ldq, const uint8_t* scale, int64_t lds,
                int64_t n, int64_t K, float* out, int64_t ldo) {
  constexpr int NR = FastGemvCols<MR>();
  int64_t c = 0;
  for (; c + NR <= n; c += NR)
    MxGemvTileAny<kFp4, MR, NR>(a, lda, q + c * ldq, ldq, scale + c * lds, lds, K, out + c, ldo);
  for (; c < n; ++c) MxGemvTileAny<kFp4, MR, 1>(a, lda, q + c * ldq, ldq, scale + c * lds, lds, K, out + c, ldo);
}

template <bool kFp4>
void MxGemv(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* scale, int64_t lds,
            int64_t n, int64_t K, float* out, int64_t ldo) {
  if constexpr (kFp4 && kFp4Fast) {
    // The input rows permuted like the decoded chunks, zero-padded to whole chunks (thread scratch slot 3).
    const int64_t kp = (K + kLanes - 1) / kLanes * kLanes;
    float* xp = static_cast<float*>(thread_scratch<3>(static_cast<size_t>(m * kp) * sizeof(float)));
    for (int64_t r = 0; r < m; ++r) {
      int64_t k = 0;
      for (; k + kLanes <= K; k += kLanes) Store16(xp + r * kp + k, Fp4Permute(Load16(a + r * lda + k)));
      if (k < K) Store16(xp + r * kp + k, Fp4Permute(LoadTail16(a + r * lda + k, K - k)));
    }
    a = xp;
    lda = kp;
  }
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

// GEMM weight chunks (dot_kernel.h WeightChunkFn): rows [c0, c0 + nc) of *ctx (MxWeightRows), elements
// [k, k + 16), decoded with the fast decodes (a fp8 chunk with a scale above kFp8FastMaxScale or a NaN code with
// the exact one) into t[c * 16 + l], in contract lane order.
template <bool kFp4>
void MxChunk(const void* ctx, int64_t c0, int64_t nc, int64_t k, int64_t K, float* HWY_RESTRICT t) {
  const MxWeightRows& w = *static_cast<const MxWeightRows*>(ctx);
  const float* e8m0 = genbridge::detail::e8m0_decode_table();
  const uint8_t* q = w.q + c0 * w.ldq;
  const uint8_t* sc = w.scale + c0 * w.lds + k / 32;
  if (k + kLanes > K) {
    for (int64_t c = 0; c < nc; ++c) DecodeTail<kFp4>(q + c * w.ldq, k, K - k, e8m0[sc[c * w.lds]], t + c * kLanes);
    return;
  }
  const int64_t kb = kFp4 ? k / 2 : k;  // byte offset of the chunk in a row
  if (kb % 64 == 0) {
    for (int64_t c = 0; c < nc; ++c) PrefetchL2(q, (c + nc) * w.ldq + kb);  // the next panel's rows
  }
  for (int64_t c = 0; c < nc; ++c) {
    const uint8_t* qr = q + c * w.ldq;
    const uint32_t s = sc[c * w.lds];
    V16 v;
    if constexpr (kFp4) {
      if constexpr (kFp4Fast) {
        v = Fp4Unpermute(DecodeE2m1Fast16(qr + kb, Fp4Table(e8m0[s]), MakeFp4Consts()));
      } else {
        v = DecodeChunk<true>(qr, k, e8m0[s], 0);
      }
    } else {
      if (HWY_LIKELY(s <= kFp8FastMaxScale && !NanIn16(qr + kb))) {
        v = DecodeE4m3Fast16(qr + kb, Fp8FastMultiplier(s));
      } else {
        v = DecodeChunk<false>(qr, k, e8m0[s], E4m3NanBits());
      }
    }
    Store16(t + c * kLanes, v);
  }
}

void MxChunkFp8(const void* ctx, int64_t c0, int64_t nc, int64_t k, int64_t K, float* t) {
  MxChunk<false>(ctx, c0, nc, k, K, t);
}
void MxChunkFp4(const void* ctx, int64_t c0, int64_t nc, int64_t k, int64_t K, float* t) {
  MxChunk<true>(ctx, c0, nc, k, K, t);
}
void MxGemvFp8(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds,
               int64_t n, int64_t K, float* out, int64_t ldo) {
  MxGemv<false>(a, lda, m, q, ldq, s, lds, n, K, out, ldo);
}
void MxGemvFp4(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* s, int64_t lds,
               int64_t n, int64_t K, float* out, int64_t ldo) {
  MxGemv<true>(a, lda, m, q, ldq, s, lds, n, K, out, ldo);
}

// Rows up to which the fused GEMV runs (in chunks of kMxGemvMaxRows, decoding the weights once per chunk) instead
// of the GEMM (decoding each weight panel once, then transposing it for the FMA micro-kernel). AVX-512, measured
// (quant_linear bench, 4096 x 4096, Zen 5, 2 threads, docs/bench/targets.md): at 64 rows the fused GEMV takes
// 0.66-0.9x the GEMM's time for MXFP4 and 0.94-0.98x for MXFP8; at 256 rows MXFP4's are even and MXFP8's GEMM is
// 1.2x faster; MXFP4's limit sits between the two. Other targets: not measured, the GEMM from kGemmMinRows.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
int64_t MxFusedMaxRowsFp8() { return 64; }
int64_t MxFusedMaxRowsFp4() { return 128; }
#else
int64_t MxFusedMaxRowsFp8() { return kGemmMinRows - 1; }
int64_t MxFusedMaxRowsFp4() { return kGemmMinRows - 1; }
#endif

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(MxChunkFp8);
HWY_EXPORT(MxChunkFp4);
HWY_EXPORT(MxGemvFp8);
HWY_EXPORT(MxGemvFp4);
HWY_EXPORT(MxFusedMaxRowsFp8);
HWY_EXPORT(MxFusedMaxRowsFp4);

WeightChunkFn mx_chunk_fn(bool fp4) { return fp4 ? GB_DISPATCH(MxChunkFp4) : GB_DISPATCH(MxChunkFp8); }
MxGemvFn mx_gemv_fn(bool fp4) { return fp4 ? GB_DISPATCH(MxGemvFp4) : GB_DISPATCH(MxGemvFp8); }
int64_t mx_fused_max_rows(bool fp4) { return fp4 ? GB_DISPATCH(MxFusedMaxRowsFp4)() : GB_DISPATCH(MxFusedMaxRowsFp8)(); }

}  // namespace genbridge::ops::detail
#endif
