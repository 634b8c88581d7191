// The dot-product kernel behind linear/linear and moe/expert_ffn (contract: ops/common/linear/dot_kernel.h),
// compiled once per CPU target (Highway) and dispatched at run time.
//
// GEMV (m < kGemmMinRows input rows, decode; above 7 rows in chunks): a tile of MR input rows x NR weight rows, one
// 16-lane V16 accumulator per output; each weight vector is widened once and used against every input row (fp32 input
// rows come straight from memory as FMA operands), weight rows are streamed once, and the next tile's rows are
// prefetched at the same K offset (the hardware prefetchers do not cross 4 KiB pages, and a weight row is often exactly
// one page). NR per target so the accumulators fit the registers.
//
// GEMM (m >= kGemmMinRows): per panel of kNC weight rows, the weights are widened to fp32 once into a per-thread
// buffer laid out [lane l][j][column] (k = 16 j + l, zero-padded to a multiple of 16), the input rows
// likewise [row tile][l][j][row]. The micro-kernel keeps kMR x kNV hardware vectors of accumulators,
// each holding contract lane l of kW consecutive columns for one row: for each l it runs the chain
// k = l, l+16, ... (FMA from +0, increasing k, padded steps included) as a broadcast of a[r, k] times
// the packed weights, and stores the 16 lanes' partials; the partials are then reduced per column in
// the contract's pairwise order, vectorised over columns. Same operations per output as GEMV.
#include "ops/common/linear/dot_kernel.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "core/simd/dispatch.h"
#include "core/simd/flush_denormals.h"
#include "ops/common/linear/bf16_dot.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"

#define HWY_TARGET_INCLUDE "ops/common/linear/dot_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

template <typename T>
HWY_INLINE void PrefetchL2(const T* base, int64_t i) {
  // Integer arithmetic: the address may lie past the end of the array (prefetches never fault).
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + i * sizeof(T)), 0, 1);
}

// ---------------------------------------------------------------------------------------------------
// GEMV

// Weight rows per tile for MR input rows: MR * NR accumulators (kParts registers each) plus one
// widened weight vector fit the registers.
template <int MR>
constexpr int GemvCols() {
  const int nr = (kVecRegs - kParts) / (MR * kParts);
  return nr < 1 ? 1 : nr > 4 ? 4 : nr;
}

template <typename BT, int MR, int NR>
HWY_NOINLINE void GemvTile(const float* HWY_RESTRICT a, int64_t lda, const BT* HWY_RESTRICT b, int64_t ldb, int64_t K,
                           float* HWY_RESTRICT out, int64_t ldo) {
  V16 acc[MR][NR];
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) acc[r][c] = Zero16();
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    GB_UNROLL for (int c = 0; c < NR; ++c) PrefetchL2(b, (c + NR) * ldb + k);
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const V16 bv = Load16(b + c * ldb + k);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), bv, acc[r][c]);
    }
  }
  if (k < K) {
    const int64_t n = K - k;
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      const V16 bv = LoadTail16(b + c * ldb + k, n);
      GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(LoadTail16(a + r * lda + k, n), bv, acc[r][c]);
    }
  }
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) out[r * ldo + c] =
      ReduceAdd16(acc[r][c]);
}

template <typename BT, int MR>
void GemvRows(const float* a, int64_t lda, const BT* b, int64_t ldb, int64_t n, int64_t K, float* out, int64_t ldo) {
  for_column_tiles<GemvCols<MR>()>(
      n, [&]<int NR>(int64_t c) HWY_ATTR { GemvTile<BT, MR, NR>(a, lda, b + c * ldb, ldb, K, out + c, ldo); });
}

template <typename BT>
void GemvTile7(const float* a, int64_t lda, int64_t m, const BT* b, int64_t ldb, int64_t n, int64_t K, float* out,
               int64_t ldo) {
  switch (m) {
    case 1:
      return GemvRows<BT, 1>(a, lda, b, ldb, n, K, out, ldo);
    case 2:
      return GemvRows<BT, 2>(a, lda, b, ldb, n, K, out, ldo);
    case 3:
      return GemvRows<BT, 3>(a, lda, b, ldb, n, K, out, ldo);
    case 4:
      return GemvRows<BT, 4>(a, lda, b, ldb, n, K, out, ldo);
    case 5:
      return GemvRows<BT, 5>(a, lda, b, ldb, n, K, out, ldo);
    case 6:
      return GemvRows<BT, 6>(a, lda, b, ldb, n, K, out, ldo);
    default:
      return GemvRows<BT, 7>(a, lda, b, ldb, n, K, out, ldo);
  }
}

// More than 7 rows (below kGemmMinRows): rows in even chunks of at most 7, per block of kGemvBlockCols
// weight rows, so a block's weights stay in L2 while every chunk passes.
inline constexpr int64_t kGemvBlockCols = 64;
template <typename BT>
void Gemv(const float* a, int64_t lda, int64_t m, const BT* b, int64_t ldb, int64_t n, int64_t K, float* out,
          int64_t ldo) {
  if (m <= 7) return GemvTile7<BT>(a, lda, m, b, ldb, n, K, out, ldo);
  const int64_t chunks = (m + 6) / 7, rows = (m + chunks - 1) / chunks;
  for (int64_t c0 = 0; c0 < n; c0 += kGemvBlockCols) {
    const int64_t nc = std::min(kGemvBlockCols, n - c0);
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
      GemvTile7<BT>(a + r0 * lda, lda, std::min(rows, m - r0), b + c0 * ldb, ldb, nc, K, out + r0 * ldo + c0, ldo);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// bf16 weights: the pair contract (dot_kernel.h). Lane l's steps take, per block of 32 elements, the odd element of
// its pair (k = 32 s + 2 l + 1) and then the even one (k = 32 s + 2 l); a 32-bit word of bf16 weights is one pair
// (low half even, high half odd), so one mask gives the odd weights and one shift the even ones as fp32. The input
// rows are copied once per call in "pair order" (per block of 32: the 16 odd elements, then the 16 even ones), so
// that the fp32 paths below (GEMV, GEMM, packed) run the contract's steps as 16 consecutive floats each.

inline constexpr int64_t kPairBlock = 32;
HWY_INLINE int64_t PairPadded(int64_t K) { return (K + kPairBlock - 1) / kPairBlock * kPairBlock; }

// dst[r * K32 + 32 s + 16 h + l] = a[r * lda + 32 s + 2 l + 1 - h] (zero past K), K32 = PairPadded(K).
void PairRows(const float* HWY_RESTRICT a, int64_t lda, int64_t m, int64_t K, float* HWY_RESTRICT dst) {
  const int64_t K32 = PairPadded(K);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t k = 0; k < K; k += kPairBlock) {
      uint32_t u[kPairBlock] = {};  // the block, zero past K
      std::memcpy(u, a + r * lda + k, static_cast<size_t>(std::min(kPairBlock, K - k)) * sizeof(float));
      float* d = dst + r * K32 + k;
      for (int l = 0; l < 16; ++l) {
        std::memcpy(d + l, &u[2 * l + 1], sizeof(float));
        std::memcpy(d + 16 + l, &u[2 * l], sizeof(float));
      }
    }
  }
}

// The 16 pairs at p (32 bf16): odd and even elements as fp32.
HWY_INLINE void LoadPairs16(const bf16_t* p, V16& odd, V16& even) {
  const DU du;
  const auto* w = reinterpret_cast<const uint32_t*>(p);
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VU u = hn::LoadU(du, w + i * kPart);
    odd.p[i] = hn::BitCast(DF(), hn::And(u, hn::Set(du, 0xFFFF0000u)));
    even.p[i] = hn::BitCast(DF(), hn::ShiftLeft<16>(u));
  }
}
// The same for the n < 32 elements at p, zero-padded.
HWY_INLINE void LoadPairsTail16(const bf16_t* p, int64_t n, V16& odd, V16& even) {
  alignas(64) bf16_t t[kPairBlock] = {};
  std::memcpy(t, p, static_cast<size_t>(n) * sizeof(bf16_t));
  LoadPairs16(t, odd, even);
}

// Weight rows per GEMV tile for MR input rows: MR * NR accumulators plus the two widened halves of a weight vector.
template <int MR>
constexpr int GemvPairCols() {
  const int nr = (kVecRegs - 2 * kParts) / (MR * kParts);
  return nr < 1 ? 1 : nr > 4 ? 4 : nr;
}

// a: input rows in pair order (PairRows, K32 elements each); b: bf16 weight rows of K elements.
template <int MR, int NR>
HWY_NOINLINE void GemvPairTile(const float* HWY_RESTRICT a, int64_t lda, const bf16_t* HWY_RESTRICT b, int64_t ldb,
                               int64_t K, float* HWY_RESTRICT out, int64_t ldo) {
  V16 acc[MR][NR];
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) acc[r][c] = Zero16();
  auto step = [&](int c, const V16& odd, const V16& even, int64_t k) HWY_ATTR {
    GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k), odd, acc[r][c]);
    GB_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = Fma16(Load16(a + r * lda + k + 16), even, acc[r][c]);
  };
  int64_t k = 0;
  for (; k + kPairBlock <= K; k += kPairBlock) {
    GB_UNROLL for (int c = 0; c < NR; ++c) PrefetchL2(b, (c + NR) * ldb + k);
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      V16 odd, even;
      LoadPairs16(b + c * ldb + k, odd, even);
      step(c, odd, even, k);
    }
  }
  if (k < K) {
    GB_UNROLL for (int c = 0; c < NR; ++c) {
      V16 odd, even;
      LoadPairsTail16(b + c * ldb + k, K - k, odd, even);
      step(c, odd, even, k);
    }
  }
  GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int c = 0; c < NR; ++c) out[r * ldo + c] =
      ReduceAdd16(acc[r][c]);
}

template <int MR>
void GemvPairRows(const float* a, int64_t lda, const bf16_t* b, int64_t ldb, int64_t n, int64_t K, float* out,
                  int64_t ldo) {
  for_column_tiles<GemvPairCols<MR>()>(
      n, [&]<int NR>(int64_t c) HWY_ATTR { GemvPairTile<MR, NR>(a, lda, b + c * ldb, ldb, K, out + c, ldo); });
}

template <int... MRs>
void GemvPairRowsFor(int64_t m, const float* a, int64_t lda, const bf16_t* b, int64_t ldb, int64_t n, int64_t K,
                     float* out, int64_t ldo, std::integer_sequence<int, MRs...>) {
  ((m == MRs + 1 ? GemvPairRows<MRs + 1>(a, lda, b, ldb, n, K, out, ldo) : void()), ...);
}

// GEMV over m rows in even chunks of at most 7 (more: per block of kGemvBlockCols weight rows, so that a block's
// weights stay in L2 while every chunk passes): tile(r0, rows, c0, nc).
template <typename Tile>
void GemvChunks(int64_t m, int64_t n, Tile&& tile) {
  const int64_t chunks = (m + 6) / 7, rows = (m + chunks - 1) / chunks;
  const int64_t block = m <= 7 ? n : kGemvBlockCols;
  for (int64_t c0 = 0; c0 < n; c0 += block)
    for (int64_t r0 = 0; r0 < m; r0 += rows) tile(r0, std::min(rows, m - r0), c0, std::min(block, n - c0));
}

// m < kGemmMinRows rows in pair order.
void GemvPair(const float* a, int64_t lda, int64_t m, const bf16_t* b, int64_t ldb, int64_t n, int64_t K, float* out,
              int64_t ldo) {
  GemvChunks(m, n, [&](int64_t r0, int64_t rows, int64_t c0, int64_t nc) {
    GemvPairRowsFor(rows, a + r0 * lda, lda, b + c0 * ldb, ldb, nc, K, out + r0 * ldo + c0, ldo,
                    std::make_integer_sequence<int, 7>());
  });
}

// Rows of bf16 values as pair words (bf16_dot.h), PairPadded(K) / 2 per row (row r at dst + r * ldd), zero-padded;
// stored in float storage (bit patterns, copied, never computed with) so that PackLaneMajor can lay them out. A word
// is the high halves of two consecutive fp32 values: the odd 16-bit halves of the row, in order. Returns whether
// every value is a bf16 (its low half zero), checked as it goes: at the first row that is not, it stops and returns
// false (dst then holds nothing to use), so fp32 rows cost one row.
bool PairWords(const float* HWY_RESTRICT a, int64_t lda, int64_t m, int64_t K, float* HWY_RESTRICT dst, int64_t ldd) {
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<uint16_t> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d16));  // elements per step: two vectors in, one out
#endif
  const int64_t words = PairPadded(K) / 2;
  for (int64_t r = 0; r < m; ++r) {
    const auto* src = reinterpret_cast<const uint16_t*>(a + r * lda);
    auto* out = reinterpret_cast<uint16_t*>(dst + r * ldd);
    int64_t k = 0;
    uint16_t low = 0;
#if HWY_TARGET != HWY_SCALAR
    auto low_v = hn::Zero(d16);
    for (; k + N <= K; k += N) {
      const auto lo = hn::LoadU(d16, src + 2 * k), hi = hn::LoadU(d16, src + 2 * k + N);
      hn::StoreU(hn::ConcatOdd(d16, hi, lo), d16, out + k);
      low_v = hn::Or(low_v, hn::ConcatEven(d16, hi, lo));
    }
    if (!hn::AllTrue(d16, hn::Eq(low_v, hn::Zero(d16)))) return false;
#endif
    for (; k < K; ++k) {
      out[k] = src[2 * k + 1];
      low |= src[2 * k];
    }
    if (low != 0) return false;
    for (; k < 2 * words; ++k) out[k] = 0;
  }
  return true;
}

// The targets whose copies may call the bf16 dot instruction's kernels (bf16_dot.h).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr bool kBf16DotTarget = true;
#else
inline constexpr bool kBf16DotTarget = false;
#endif
// Whether the instruction's kernels may run here (then PairWords says whether the rows let them).
HWY_INLINE bool Bf16DotHere() { return kBf16DotTarget && ::genbridge::simd::bf16_dot_enabled(); }

// ---------------------------------------------------------------------------------------------------
// GEMM

using DV = hn::ScalableTag<float>;
using VV = hn::Vec<DV>;
inline constexpr int kW = static_cast<int>(hn::MaxLanes(DV()));  // lanes per hardware vector

// Micro-kernel tile: kMR rows x kNV hardware vectors of columns (kMR * kNV accumulators, kNV weight
// vectors and one broadcast in the registers).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int kMR = 12, kNV = 2;  // 24 + 2 + 1 of 32 zmm
#elif HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2
inline constexpr int kMR = 6, kNV = 4;  // 24 + 4 + 1 of 32; 16 columns, so panels of 64 hold whole tiles
#elif HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
inline constexpr int kMR = 6, kNV = 2;  // 12 + 2 + 1 of 16
#else
inline constexpr int kMR = 4, kNV = 2;
#endif
inline constexpr int kNC = kNV * kW;  // columns per panel
static_assert(kPanelCols % kNC == 0 || kNC > kPanelCols, "work items are whole panels");

// a * b + c with one rounding (hn::MulAdd is not fused on targets without FMA instructions).
HWY_INLINE VV FmaV(VV a, VV b, VV c) {
  if constexpr (kNativeFma) {
    return hn::MulAdd(a, b, c);
  } else {
    alignas(64) float ta[kW], tb[kW], tc[kW];
    hn::Store(a, DV(), ta);
    hn::Store(b, DV(), tb);
    hn::Store(c, DV(), tc);
    for (int i = 0; i < kW; ++i) tc[i] = std::fma(ta[i], tb[i], tc[i]);
    return hn::Load(DV(), tc);
  }
}

// ap: [16][J][kMR] (one row tile), bp: [16][J][kNC] (one panel); part: [16][kMR][kNC] lane partials.
HWY_NOINLINE void GemmMicro(const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp, int64_t J,
                            float* HWY_RESTRICT part) {
  const DV d;
  for (int l = 0; l < kLanes; ++l) {
    VV acc[kMR][kNV];
    GB_UNROLL for (int r = 0; r < kMR; ++r) GB_UNROLL for (int v = 0; v < kNV; ++v) acc[r][v] = hn::Zero(d);
    const float* al = ap + l * J * kMR;
    const float* bl = bp + l * J * kNC;
    for (int64_t j = 0; j < J; ++j) {
      VV bv[kNV];
      GB_UNROLL for (int v = 0; v < kNV; ++v) bv[v] = hn::Load(d, bl + j * kNC + v * kW);
      GB_UNROLL for (int r = 0; r < kMR; ++r) {
        const VV av = hn::Set(d, al[j * kMR + r]);
        GB_UNROLL for (int v = 0; v < kNV; ++v) acc[r][v] = FmaV(av, bv[v], acc[r][v]);
      }
    }
    float* pl = part + l * kMR * kNC;
    GB_UNROLL for (int r = 0; r < kMR; ++r) GB_UNROLL for (int v = 0; v < kNV; ++v)
        hn::Store(acc[r][v], d, pl + r * kNC + v * kW);
  }
}

// tile[r * kNC + c] = the contract's pairwise sum of part[l][r][c] over l.
HWY_INLINE void ReduceLanes(const float* HWY_RESTRICT part, float* HWY_RESTRICT tile) {
  const DV d;
  for (int r = 0; r < kMR; ++r) {
    GB_UNROLL for (int v = 0; v < kNV; ++v) {
      const float* p = part + r * kNC + v * kW;
      constexpr int64_t kStride = int64_t{kMR} * kNC;  // between lanes
      VV s8[8];
      GB_UNROLL for (int i = 0; i < 8; ++i) s8[i] =
          hn::Add(hn::Load(d, p + i * kStride), hn::Load(d, p + (i + 8) * kStride));
      VV s4[4];
      GB_UNROLL for (int i = 0; i < 4; ++i) s4[i] = hn::Add(s8[i], s8[i + 4]);
      hn::Store(hn::Add(hn::Add(s4[0], s4[2]), hn::Add(s4[1], s4[3])), d, tile + r * kNC + v * kW);
    }
  }
}

// 8 x 8 transposition with 256-bit vectors where the target has them (AVX2, AVX-512):
// dst[q * ld_dst + i] = src[i * ld_src + q] for i, q < 8.
using D8 = hn::CappedTag<float, 8>;
#if HWY_TARGET == HWY_SCALAR
inline constexpr bool kTranspose8 = false;
template <class D>
HWY_INLINE void Transpose8x8(D, const float*, int64_t, float*, int64_t) {}
#else
inline constexpr bool kTranspose8 = hn::MaxLanes(D8()) == 8 && kNC % 8 == 0;
// (A template on the tag so that targets without 8-lane vectors never instantiate it.)
template <class D>
HWY_INLINE void Transpose8x8(D d, const float* HWY_RESTRICT src, int64_t ld_src, float* HWY_RESTRICT dst,
                             int64_t ld_dst) {
  {
    const hn::Repartition<uint64_t, D> du;
    using V8 = hn::Vec<D>;
    V8 r[8];
    GB_UNROLL for (int i = 0; i < 8; ++i) r[i] = hn::LoadU(d, src + i * ld_src);
    // Per 128-bit block: 32-bit interleave, then 64-bit interleave, then the blocks are recombined.
    V8 t[8];
    GB_UNROLL for (int i = 0; i < 4; ++i) {
      t[2 * i] = hn::InterleaveLower(d, r[2 * i], r[2 * i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
      t[2 * i + 1] = hn::InterleaveUpper(d, r[2 * i], r[2 * i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
    }
    auto il = [&](V8 a, V8 b) {
      return hn::BitCast(d, hn::InterleaveLower(du, hn::BitCast(du, a), hn::BitCast(du, b)));
    };
    auto iu = [&](V8 a, V8 b) {
      return hn::BitCast(d, hn::InterleaveUpper(du, hn::BitCast(du, a), hn::BitCast(du, b)));
    };
    const V8 u0 = il(t[0], t[2]), u1 = iu(t[0], t[2]), u2 = il(t[1], t[3]), u3 = iu(t[1], t[3]);  // a..d
    const V8 v0 = il(t[4], t[6]), v1 = iu(t[4], t[6]), v2 = il(t[5], t[7]), v3 = iu(t[5], t[7]);  // e..h
    hn::StoreU(hn::ConcatLowerLower(d, v0, u0), d, dst + 0 * ld_dst);
    hn::StoreU(hn::ConcatLowerLower(d, v1, u1), d, dst + 1 * ld_dst);
    hn::StoreU(hn::ConcatLowerLower(d, v2, u2), d, dst + 2 * ld_dst);
    hn::StoreU(hn::ConcatLowerLower(d, v3, u3), d, dst + 3 * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d, v0, u0), d, dst + 4 * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d, v1, u1), d, dst + 5 * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d, v2, u2), d, dst + 6 * ld_dst);
    hn::StoreU(hn::ConcatUpperUpper(d, v3, u3), d, dst + 7 * ld_dst);
  }
}
#endif

// Packs one panel of nc <= kNC weight rows into bp [16][J][kNC], zero-padded in k and in columns: per 16-wide k
// block, fill(k, t) writes the rows' fp32 elements [k, k + 16) (zero past K) into a small transposition buffer
// t[c * 16 + l] (c < nc), which is then written to the packed panel block by block (the panel does not fit L1).
template <typename Fill>
void PackPanel(int64_t nc, int64_t J, Fill&& fill, float* HWY_RESTRICT bp) {
  alignas(64) float t[kNC * kLanes];
  if (nc < kNC) std::memset(t, 0, sizeof t);
  for (int64_t j = 0; j < J; ++j) {
    fill(j * kLanes, t);
    float* dst = bp + j * kNC;
    if constexpr (kTranspose8) {
      GB_UNROLL for (int c0 = 0; c0 < kNC; c0 += 8) {
        Transpose8x8(D8(), t + c0 * kLanes, kLanes, dst + c0, J * kNC);
        Transpose8x8(D8(), t + c0 * kLanes + 8, kLanes, dst + 8 * J * kNC + c0, J * kNC);
      }
    } else {
      GB_UNROLL for (int l = 0; l < kLanes; ++l) {
        for (int c = 0; c < kNC; ++c) dst[l * J * kNC + c] = t[c * kLanes + l];
      }
    }
  }
}

// Widens b's rows [0, nc) into a packed panel.
template <typename BT>
void PackB(const BT* b, int64_t ldb, int64_t nc, int64_t K, int64_t J, float* HWY_RESTRICT bp) {
  PackPanel(
      nc, J,
      [&](int64_t k, float* HWY_RESTRICT t) {
        if (k + kLanes <= K) {
          // The next panel's rows at the same offsets (as GEMV does: rows start cold at page boundaries).
          for (int64_t c = 0; c < kNC; ++c) PrefetchL2(b, (c + kNC) * ldb + k);
          for (int64_t c = 0; c < nc; ++c) Store16(t + c * kLanes, Load16(b + c * ldb + k));
        } else {
          for (int64_t c = 0; c < nc; ++c) Store16(t + c * kLanes, LoadTail16(b + c * ldb + k, K - k));
        }
      },
      bp);
}

// Widens bf16 rows [0, nc) of K elements into a packed panel in pair order (J = PairPadded(K) / 16 steps: step
// 2 s holds the odd elements of block s, step 2 s + 1 the even ones).
void PackBPairs(const bf16_t* b, int64_t ldb, int64_t nc, int64_t K, int64_t J, float* HWY_RESTRICT bp) {
  PackPanel(
      nc, J,
      [&](int64_t k, float* HWY_RESTRICT t) {
        const int64_t k0 = k / kPairBlock * kPairBlock;
        const bool odd_step = k == k0;
        V16 odd, even;
        if (k0 + kPairBlock <= K) {
          if (odd_step)
            for (int64_t c = 0; c < kNC; ++c) PrefetchL2(b, (c + kNC) * ldb + k0);
          for (int64_t c = 0; c < nc; ++c) {
            LoadPairs16(b + c * ldb + k0, odd, even);
            Store16(t + c * kLanes, odd_step ? odd : even);
          }
        } else {
          for (int64_t c = 0; c < nc; ++c) {
            LoadPairsTail16(b + c * ldb + k0, K - k0, odd, even);
            Store16(t + c * kLanes, odd_step ? odd : even);
          }
        }
      },
      bp);
}

// Copies rows [0, mr) of a into ap [16][J][R] (R >= mr values per lane and step: lane l of step j holds
// a[r][16 j + l]; rows [mr, R) and k >= K zero) with 8 x 8 transpositions where the target has 8-lane vectors
// (overlapping row groups when R is not a multiple of 8): straight from a for whole steps of whole tiles, else
// from the rows staged zero-padded in a small buffer. The GEMM packs its rows once per call; a scalar copy with
// strided reads cost a third of the micro-kernel's time in a 256-token prefill (profile, AVX-512).
inline constexpr int kMaxPackRows = 12;
void PackLaneMajor(const float* a, int64_t lda, int64_t mr, int64_t R, int64_t K, int64_t J, float* HWY_RESTRICT ap) {
  alignas(64) float t[kMaxPackRows * kLanes];
  const int64_t ld = J * R;  // between lanes in ap
  for (int64_t j = 0; j < J; ++j) {
    const int64_t k = j * kLanes;
    // The step's rows: straight from a, or staged (zero-padded) in t; row r at src + r * ld_src.
    const float* src = a + k;
    int64_t ld_src = lda;
    if (mr != R || k + kLanes > K) {
      for (int64_t r = 0; r < R; ++r) {
        if (r >= mr) {
          Store16(t + r * kLanes, Zero16());
        } else if (k + kLanes <= K) {
          Store16(t + r * kLanes, Load16(a + r * lda + k));
        } else {
          Store16(t + r * kLanes, LoadTail16(a + r * lda + k, K - k));
        }
      }
      src = t;
      ld_src = kLanes;
    }
    float* dst = ap + j * R;
    if constexpr (kTranspose8) {
      if (R >= 8) {
        for (int64_t r = 0; r < R; r += 8) {
          const int64_t r0 = std::min<int64_t>(r, R - 8);
          Transpose8x8(D8(), src + r0 * ld_src, ld_src, dst + r0, ld);
          Transpose8x8(D8(), src + r0 * ld_src + 8, ld_src, dst + 8 * ld + r0, ld);
        }
        continue;
      }
    }
    for (int l = 0; l < kLanes; ++l)
      for (int64_t r = 0; r < R; ++r) dst[l * ld + r] = src[r * ld_src + l];
  }
}
static_assert(kMR <= kMaxPackRows, "a row tile fits PackLaneMajor's buffer");

// Copies rows [0, mr) (mr <= kMR) of a into ap [16][J][kMR], zero-padded in k and in rows.
void PackA(const float* a, int64_t lda, int64_t mr, int64_t K, int64_t J, float* HWY_RESTRICT ap) {
  PackLaneMajor(a, lda, mr, kMR, K, J, ap);
}

// pack(c0, nc, J, bp) packs weight rows [c0, c0 + nc) into bp.
template <typename Pack>
void GemmPanels(const float* a, int64_t lda, int64_t m, Pack&& pack, int64_t n, int64_t K, float* out, int64_t ldo) {
  const int64_t J = (K + kLanes - 1) / kLanes;
  const int64_t row_tiles = (m + kMR - 1) / kMR;
  const size_t a_tile = static_cast<size_t>(kLanes * J * kMR);
  float* ap = static_cast<float*>(thread_scratch_bytes(4, a_tile * row_tiles * sizeof(float)));
  float* bp = static_cast<float*>(thread_scratch_bytes(5, static_cast<size_t>(kLanes * J * kNC) * sizeof(float)));
  float* part = static_cast<float*>(thread_scratch_bytes(6, static_cast<size_t>(kLanes * kMR * kNC) * sizeof(float)));
  alignas(64) float tile[kMR * kNC];
  for (int64_t t = 0; t < row_tiles; ++t)
    PackA(a + t * kMR * lda, lda, std::min<int64_t>(kMR, m - t * kMR), K, J, ap + t * a_tile);
  for (int64_t c0 = 0; c0 < n; c0 += kNC) {
    const int64_t nc = std::min<int64_t>(kNC, n - c0);
    pack(c0, nc, J, bp);
    for (int64_t t = 0; t < row_tiles; ++t) {
      GemmMicro(ap + t * a_tile, bp, J, part);
      ReduceLanes(part, tile);
      const int64_t mr = std::min<int64_t>(kMR, m - t * kMR);
      for (int64_t r = 0; r < mr; ++r)
        std::memcpy(out + (t * kMR + r) * ldo + c0, tile + r * kNC, static_cast<size_t>(nc) * sizeof(float));
    }
  }
}

template <typename BT>
void Gemm(const float* a, int64_t lda, int64_t m, const BT* b, int64_t ldb, int64_t n, int64_t K, float* out,
          int64_t ldo) {
  GemmPanels(
      a, lda, m, [&](int64_t c0, int64_t nc, int64_t J, float* bp) { PackB(b + c0 * ldb, ldb, nc, K, J, bp); }, n, K,
      out, ldo);
}

// The GEMM with weight chunks from the caller (dot_kernel.h: GemmChunksFn).
void GemmChunks(const float* a, int64_t lda, int64_t m, WeightChunkFn chunk, const void* ctx, int64_t n, int64_t K,
                float* out, int64_t ldo) {
  GemmPanels(
      a, lda, m,
      [&](int64_t c0, int64_t nc, int64_t J, float* bp) {
        PackPanel(
            nc, J, [&](int64_t k, float* HWY_RESTRICT t) { chunk(ctx, c0, nc, k, K, t); }, bp);
      },
      n, K, out, ldo);
}

// ---------------------------------------------------------------------------------------------------
// Packed bf16 weights (dot_kernel.h: pack_bf16_panels): per panel of kPackedCols weight rows, lane l's words
// [jp][c] hold steps j = 2 jp (low half) and 2 jp + 1 (high half), so a word widens to two fp32 weights with one
// shift and one mask and every lane's chain reads its panel bytes front to back. The input rows are copied per
// row tile into [16][J][MR] (zero-padded in k), as the GEMM's PackA does; the micro-kernel keeps MR rows x LL
// lanes of accumulators (LL > 1 when few rows leave registers free, so that enough FMA chains run at once) and
// stores the lanes' partials, which are then reduced in the contract's order. Same operations per output as GEMV.

using DU32 = hn::RebindToUnsigned<DV>;
inline constexpr int kPNV = kPackedCols / kW > 0 ? kPackedCols / kW : 1;  // hardware vectors per panel row
static_assert(kPackedCols % kW == 0, "a packed panel is whole hardware vectors");
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int kPackedMaxMR = 12, kPackedAcc = 24;
#elif HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SVE || HWY_TARGET == HWY_SVE2
inline constexpr int kPackedMaxMR = 4, kPackedAcc = 16;
#elif HWY_TARGET == HWY_AVX2
inline constexpr int kPackedMaxMR = 6, kPackedAcc = 12;
#else
inline constexpr int kPackedMaxMR = 2, kPackedAcc = 8;
#endif
static_assert(kPackedMaxMR <= kMaxPackRows, "a row tile fits PackLaneMajor's buffer");

// Rows from which the packed weights are widened per panel for the GEMM micro-kernel, per target (measured, linear
// bench, one thread; docs/bench/targets.md). AVX2: the packed micro-kernel is 1.2-1.3x the unpacked kernel at 8-32 rows
// but 0.95x at 64 and 0.7-0.8x at 256, where the widened panels give 1.2x and 1.03-1.06x. AVX-512 (Zen 4): the
// packed micro-kernel is 1.25x the widened panels at 64 rows and 1.0-1.15x at 128, even at 256, behind from 512.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr int64_t kPackedGemmRows = 256;
#else
inline constexpr int64_t kPackedGemmRows = 64;
#endif

// Lanes run at once for mr rows: a power of two dividing 16.
constexpr int PackedLanesFor(int mr) {
  int ll = 1;
  while (ll < 8 && 2 * ll * mr * kPNV <= kPackedAcc) ll *= 2;
  return ll;
}
template <int MR>
constexpr int PackedLanes() {
  return PackedLanesFor(MR);
}

// Lanes [l0, l0 + LL) of MR rows: ap [16][J][MR] (the row tile), bp the panel ([16][JP][kPackedCols] words);
// part[l][r][c] receives the lane partials.
template <int MR, int LL>
HWY_NOINLINE void PackedMicro(const float* HWY_RESTRICT ap, const uint32_t* HWY_RESTRICT bp, int64_t J, int l0,
                              float* HWY_RESTRICT part) {
  const DV d;
  const DU32 du;
  const int64_t JP = J / 2;  // J is even (the pair contract's steps come in pairs)
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  VV acc[LL][MR][kPNV];
  GB_UNROLL for (int i = 0; i < LL; ++i) GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int v = 0; v < kPNV; ++v)
      acc[i][r][v] = hn::Zero(d);
  auto step = [&](int i, const uint32_t* w, const float* a) HWY_ATTR {
    VV odd[kPNV];
    GB_UNROLL for (int v = 0; v < kPNV; ++v) odd[v] = hn::BitCast(d, hn::And(hn::Load(du, w + v * kW), hi_mask));
    GB_UNROLL for (int r = 0; r < MR; ++r) {
      const VV av = hn::Set(d, a[r]);
      GB_UNROLL for (int v = 0; v < kPNV; ++v) acc[i][r][v] = FmaV(av, odd[v], acc[i][r][v]);
    }
    VV even[kPNV];
    GB_UNROLL for (int v = 0; v < kPNV; ++v) even[v] = hn::BitCast(d, hn::ShiftLeft<16>(hn::Load(du, w + v * kW)));
    GB_UNROLL for (int r = 0; r < MR; ++r) {
      const VV av = hn::Set(d, a[MR + r]);
      GB_UNROLL for (int v = 0; v < kPNV; ++v) acc[i][r][v] = FmaV(av, even[v], acc[i][r][v]);
    }
  };
  for (int64_t jp = 0; jp < JP; ++jp) {
    GB_UNROLL for (int i = 0; i < LL; ++i) {
      // The next lane group's line at the same step (past lane 15: the next panel's first lanes), as GEMV
      // prefetches its next tile's rows: the hardware prefetchers alone leave the loads waiting.
      __builtin_prefetch(bp + ((l0 + i + LL) * JP + jp) * kPackedCols, 0, 1);
      step(i, bp + ((l0 + i) * JP + jp) * kPackedCols, ap + ((l0 + i) * J + 2 * jp) * MR);
    }
  }
  GB_UNROLL for (int i = 0; i < LL; ++i) GB_UNROLL for (int r = 0; r < MR; ++r) GB_UNROLL for (int v = 0; v < kPNV; ++v)
      hn::Store(acc[i][r][v], d, part + ((l0 + i) * MR + r) * kPackedCols + v * kW);
}

// tile[r * kPackedCols + c] = the contract's pairwise sum of part[l][r][c] over l, for mr rows.
void ReducePackedLanes(const float* HWY_RESTRICT part, int64_t mr, float* HWY_RESTRICT tile) {
  const DV d;
  const int64_t stride = mr * kPackedCols;  // between lanes
  for (int64_t r = 0; r < mr; ++r) {
    GB_UNROLL for (int v = 0; v < kPNV; ++v) {
      const float* p = part + r * kPackedCols + v * kW;
      VV s8[8];
      GB_UNROLL for (int i = 0; i < 8; ++i) s8[i] =
          hn::Add(hn::Load(d, p + i * stride), hn::Load(d, p + (i + 8) * stride));
      VV s4[4];
      GB_UNROLL for (int i = 0; i < 4; ++i) s4[i] = hn::Add(s8[i], s8[i + 4]);
      hn::Store(hn::Add(hn::Add(s4[0], s4[2]), hn::Add(s4[1], s4[3])), d, tile + r * kPackedCols + v * kW);
    }
  }
}

// Copies rows [0, mr) of a into ap [16][J][mr], zero-padded in k.
void PackRowsLaneMajor(const float* a, int64_t lda, int64_t mr, int64_t K, int64_t J, float* HWY_RESTRICT ap) {
  PackLaneMajor(a, lda, mr, mr, K, J, ap);
}

// Lanes [lb, lb + kPackedLaneBlock) of a row tile: every tile passes over a block's weights while they are in L1.
inline constexpr int kPackedLaneBlock = 8;
static_assert(PackedLanes<1>() <= kPackedLaneBlock, "a lane block holds whole lane groups");
template <int MR>
void PackedTile(const float* ap, const uint32_t* bp, int64_t J, int lb, float* part) {
  constexpr int LL = PackedLanes<MR>();
  for (int l0 = lb; l0 < lb + kPackedLaneBlock; l0 += LL) PackedMicro<MR, LL>(ap, bp, J, l0, part);
}

template <int... MRs>
void PackedTileFor(int64_t mr, const float* ap, const uint32_t* bp, int64_t J, int lb, float* part,
                   std::integer_sequence<int, MRs...>) {
  ((mr == MRs + 1 ? PackedTile<MRs + 1>(ap, bp, J, lb, part) : void()), ...);
}

// Widens packed weight rows [c0, c0 + nc) (c0 a multiple of kPackedCols) into the GEMM's fp32 panel bp
// [16][J][kNC]: one shift or mask per 16 weights, read and written front to back.
void WidenPackedPanel(const uint32_t* HWY_RESTRICT packed, int64_t c0, int64_t nc, int64_t J, float* HWY_RESTRICT bp) {
  const DV d;
  const DU32 du;
  const int64_t JP = J / 2, panel_words = int64_t{kLanes} * JP * kPackedCols;
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  for (int64_t cc = 0; cc < kNC; cc += kPackedCols) {
    const uint32_t* src = packed + (c0 + cc) / kPackedCols * panel_words;
    if (cc >= nc) {  // columns past n: zero, as PackB's padding
      for (int64_t l = 0; l < kLanes; ++l)
        for (int64_t j = 0; j < J; ++j)
          GB_UNROLL for (int v = 0; v < kPNV; ++v) hn::Store(hn::Zero(d), d, bp + (l * J + j) * kNC + cc + v * kW);
      continue;
    }
    for (int64_t l = 0; l < kLanes; ++l) {
      for (int64_t jp = 0; jp < JP; ++jp) {
        const uint32_t* w = src + (l * JP + jp) * kPackedCols;
        float* lo = bp + (l * J + 2 * jp) * kNC + cc;
        GB_UNROLL for (int v = 0; v < kPNV; ++v) {
          const auto u = hn::Load(du, w + v * kW);
          hn::Store(hn::BitCast(d, hn::And(u, hi_mask)), d, lo + v * kW);
          hn::Store(hn::BitCast(d, hn::ShiftLeft<16>(u)), d, lo + kNC + v * kW);
        }
      }
    }
  }
}

void DotPackedBF16(const float* a_in, int64_t lda_in, int64_t m, const uint32_t* packed, int64_t n, int64_t K_in,
                   float* out, int64_t ldo) {
  const ::genbridge::simd::FlushDenormals flush;
  const int64_t K = PairPadded(K_in), lda = K;
  float* a = static_cast<float*>(thread_scratch_bytes(7, static_cast<size_t>(m * K) * sizeof(float)));
  // One input row is bound by the weight stream either way, and the fp32 micro-kernel streams the panels faster there
  // (measured, linear bench, Zen 5: 0.167 vs 0.19 ms at 2048 x 2048; docs/bench/targets.md).
  const bool instr = m >= 2 && Bf16DotHere() && PairWords(a_in, lda_in, m, K_in, a, K / 2);
  if (!instr) PairRows(a_in, lda_in, m, K_in, a);
  if (!instr && m >= kPackedGemmRows && kNC % kPackedCols == 0) {
    // Many rows: the GEMM's micro-kernel on panels widened from the packed weights (no transposition).
    GemmPanels(
        a, lda, m, [&](int64_t c0, int64_t nc, int64_t J, float* bp) { WidenPackedPanel(packed, c0, nc, J, bp); }, n, K,
        out, ldo);
    return;
  }
  const int64_t J = K / kLanes, JP = J / 2;
  const int64_t tiles = (m + kPackedMaxMR - 1) / kPackedMaxMR, rows = (m + tiles - 1) / tiles;
  // Per row tile, lane-major: fp32 values [16][J][rows] (one per step), or for the instruction pair words
  // [16][JP][rows] (one per pair of steps).
  const int64_t steps = instr ? JP : J, row_len = instr ? K / 2 : K;
  const size_t tile_floats = static_cast<size_t>(kLanes * steps * rows);
  float* ap = static_cast<float*>(thread_scratch_bytes(4, tile_floats * tiles * sizeof(float)));
  const size_t part_floats = static_cast<size_t>(kLanes * rows * kPackedCols);
  // Per row tile, the lanes' partials of up to two panels.
  float* part = static_cast<float*>(thread_scratch_bytes(6, 2 * part_floats * tiles * sizeof(float)));
  alignas(64) float tile[kPackedMaxMR * kPackedCols];
  for (int64_t t = 0; t < tiles; ++t) {
    PackRowsLaneMajor(a + t * rows * row_len, row_len, std::min(rows, m - t * rows), row_len, steps,
                      ap + t * tile_floats);
  }
  const int64_t panel_words = int64_t{kLanes} * JP * kPackedCols;
  // Reduces panel p's partials (p = 0 or 1 of the step) into columns [c0, c0 + nc).
  const auto write_out = [&](int p, int64_t c0, int64_t nc) {
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t mr = std::min(rows, m - t * rows);
      ReducePackedLanes(part + (2 * t + p) * part_floats, mr, tile);
      for (int64_t r = 0; r < mr; ++r)
        std::memcpy(out + (t * rows + r) * ldo + c0, tile + r * kPackedCols, static_cast<size_t>(nc) * sizeof(float));
    }
  };
  // The instruction takes two panels per step where two remain.
  const int64_t step_cols = instr ? 2 * kPackedCols : kPackedCols;
  for (int64_t c0 = 0; c0 < n; c0 += step_cols) {
    const uint32_t* bp = packed + (c0 / kPackedCols) * panel_words;
    const int64_t nc = std::min<int64_t>(kPackedCols, n - c0);
    const bool two = instr && c0 + kPackedCols < n;
    for (int lb = 0; lb < kLanes; lb += kPackedLaneBlock) {
      for (int64_t t = 0; t < tiles; ++t) {
        const int mr = static_cast<int>(std::min(rows, m - t * rows));
        float* pt = part + 2 * t * part_floats;
        const auto* at = reinterpret_cast<const uint32_t*>(ap + t * tile_floats);
        if (two) {
          for (int l = lb; l < lb + kPackedLaneBlock; ++l)
            bf16_dot_packed_micro2(mr, at, bp, bp + panel_words, JP, l, pt, pt + part_floats);
        } else if (instr) {
          const int ll = PackedLanesFor(mr);
          for (int l0 = lb; l0 < lb + kPackedLaneBlock; l0 += ll) bf16_dot_packed_micro(mr, ll, at, bp, JP, l0, pt);
        } else {
          PackedTileFor(mr, ap + t * tile_floats, bp, J, lb, pt, std::make_integer_sequence<int, kPackedMaxMR>());
        }
      }
    }
    write_out(0, c0, nc);
    if (two) write_out(1, c0 + kPackedCols, std::min<int64_t>(kPackedCols, n - c0 - kPackedCols));
  }
}

// ---------------------------------------------------------------------------------------------------
// Entry points (one per weight dtype).

template <typename BT>
void DotRowsT(const float* a, int64_t lda, int64_t m, const void* b, int64_t ldb, int64_t n, int64_t K, float* out,
              int64_t ldo) {
  const BT* bt = static_cast<const BT*>(b);
  if (m >= kGemmMinRows) {
    Gemm<BT>(a, lda, m, bt, ldb, n, K, out, ldo);
  } else {
    Gemv<BT>(a, lda, m, bt, ldb, n, K, out, ldo);
  }
}
void DotRowsF32(const float* a, int64_t lda, int64_t m, const void* b, int64_t ldb, int64_t n, int64_t K, float* out,
                int64_t ldo) {
  DotRowsT<float>(a, lda, m, b, ldb, n, K, out, ldo);
}
// bf16 weights: the pair contract, under the bf16 dot instruction's denormal mode.
void DotRowsBF16(const float* a, int64_t lda, int64_t m, const void* b, int64_t ldb, int64_t n, int64_t K, float* out,
                 int64_t ldo) {
  const ::genbridge::simd::FlushDenormals flush;
  const int64_t K32 = PairPadded(K);
  // Pair-word rows one cache line longer than the words: rows a power of two apart would share L1 sets (and
  // K32 / 2 + 16 <= K32 words: the pair-order rows' buffer holds them).
  const int64_t ldw = K32 / 2 + 16;
  float* ap = static_cast<float*>(thread_scratch_bytes(7, static_cast<size_t>(m * K32) * sizeof(float)));
  const bf16_t* bt = static_cast<const bf16_t*>(b);
  if (Bf16DotHere() && PairWords(a, lda, m, K, ap, ldw)) {
    // The instruction streams the weight rows as they are, for any number of input rows (no widening to amortize).
    const auto* xw = reinterpret_cast<const uint32_t*>(ap);
    GemvChunks(m, n, [&](int64_t r0, int64_t rows, int64_t c0, int64_t nc) {
      // A block's first row chunk brings its weights from memory; the later chunks find them in cache.
      bf16_dot_gemv(xw + r0 * ldw, ldw, rows, bt + c0 * ldb, ldb, nc, K, out + r0 * ldo + c0, ldo, r0 == 0);
    });
    return;
  }
  PairRows(a, lda, m, K, ap);
  if (m >= kGemmMinRows) {
    GemmPanels(
        ap, K32, m, [&](int64_t c0, int64_t nc, int64_t J, float* bp) { PackBPairs(bt + c0 * ldb, ldb, nc, K, J, bp); },
        n, K32, out, ldo);
  } else {
    GemvPair(ap, K32, m, bt, ldb, n, K, out, ldo);
  }
}
void DotRowsF16(const float* a, int64_t lda, int64_t m, const void* b, int64_t ldb, int64_t n, int64_t K, float* out,
                int64_t ldo) {
  DotRowsT<fp16_t>(a, lda, m, b, ldb, n, K, out, ldo);
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {

HWY_EXPORT(DotRowsF32);
HWY_EXPORT(DotRowsBF16);
HWY_EXPORT(DotRowsF16);
HWY_EXPORT(GemmChunks);
HWY_EXPORT(DotPackedBF16);

DotPackedFn dot_packed_fn() { return GB_DISPATCH(DotPackedBF16); }

constexpr int64_t kLanes = 16;  // the contract's lanes

size_t packed_bf16_words(int64_t n, int64_t K) {
  const int64_t J = (K + kLanes - 1) / kLanes, JP = (J + 1) / 2;
  return static_cast<size_t>((n + kPackedCols - 1) / kPackedCols * kLanes * JP * kPackedCols);
}

void pack_bf16_panels(const bf16_t* b, int64_t ldb, int64_t n, int64_t K, uint32_t* dst) {
  const int64_t J = (K + kLanes - 1) / kLanes, JP = (J + 1) / 2;
  const int64_t panels = (n + kPackedCols - 1) / kPackedCols;
  auto at = [&](int64_t row, int64_t k) -> uint32_t { return row < n && k < K ? b[row * ldb + k].bits : 0u; };
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t l = 0; l < kLanes; ++l)
      for (int64_t jp = 0; jp < JP; ++jp) {
        uint32_t* w = dst + ((p * kLanes + l) * JP + jp) * kPackedCols;
        const int64_t k0 = 2 * (jp * kLanes + l);
        for (int64_t c = 0; c < kPackedCols; ++c) {
          const int64_t row = p * kPackedCols + c;
          w[c] = at(row, k0) | at(row, k0 + 1) << 16;
        }
      }
}

GemmChunksFn gemm_chunks_fn() { return GB_DISPATCH(GemmChunks); }

DotRowsFn dot_rows_fn(DType w) {
  switch (w) {
    case DType::kF32:
      return GB_DISPATCH(DotRowsF32);
    case DType::kBF16:
      return GB_DISPATCH(DotRowsBF16);
    case DType::kF16:
      return GB_DISPATCH(DotRowsF16);
    default:
      GB_CHECK(false, "dot_rows_fn: weights must be fp32, fp16 or bf16 (validate before dispatching)");
  }
  return nullptr;
}

namespace {
struct alignas(64) Line {
  float f[16];
};
}  // namespace

void* thread_scratch_bytes(int slot, size_t bytes) {
  thread_local std::unique_ptr<Line[]> bufs[8];
  thread_local size_t sizes[8] = {};
  GB_CHECK(slot >= 0 && slot < 8, "thread_scratch_bytes: slot out of range");
  const size_t n = (bytes + sizeof(Line) - 1) / sizeof(Line);
  if (sizes[slot] < n) {
    bufs[slot].reset(new Line[n]);
    sizes[slot] = n;
  }
  return bufs[slot].get();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
