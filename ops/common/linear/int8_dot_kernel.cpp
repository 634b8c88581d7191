// int8 x int8 -> int32 dot kernel (contract and paths: ops/common/linear/int8_dot_kernel.h). Integer
// arithmetic: the lane order, the tiling and the instruction path do not change the result.
#include "ops/common/linear/int8_dot_kernel.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/simd/dispatch.h"
#include "ops/common/linear/dot_kernel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Compiled once, for the baseline (before the per-target passes).
#ifndef GB_INT8_DOT_ONCE
#define GB_INT8_DOT_ONCE
// Full unrolling of the loops over a tile's rows (early, so the accumulator arrays live in registers).
#define GB_I8_UNROLL _Pragma("GCC unroll 16")
namespace genbridge::ops::detail {
namespace {
std::atomic<bool> g_vnni_allowed{true};
}  // namespace
void set_int8_vnni_allowed(bool allowed) { g_vnni_allowed.store(allowed, std::memory_order_relaxed); }
namespace int8_dot_internal {
bool vnni_allowed() { return g_vnni_allowed.load(std::memory_order_relaxed); }
}  // namespace int8_dot_internal
// The weight rows a tile prefetches: those about kInt8PrefetchBytes ahead of its own (the next tile's
// for rows of 4 KiB; 4 tiles ahead for rows of 1 KiB, where one tile's time would not cover the memory
// latency), within [0, n). Rows are often exactly one page: the hardware prefetchers stop at each.
inline constexpr int64_t kInt8PrefetchBytes = 16 << 10;
inline int64_t prefetch_row(int64_t c, int nr, int64_t n, int64_t ldb) {
  const int64_t ahead = std::max<int64_t>(nr, (kInt8PrefetchBytes / std::max<int64_t>(ldb, 1)) / nr * nr);
  return c + ahead + nr <= n ? c + ahead : std::max<int64_t>(c, n - nr);
}
// Input rows per block: the block's prepared activations stay in L2 while every weight tile is applied
// to all of its rows.
inline constexpr int64_t kInt8RowBlock = 64;
}  // namespace genbridge::ops::detail
#endif

#define HWY_TARGET_INCLUDE "ops/common/linear/int8_dot_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// ---- Every target: int16 widening, pairwise multiply-add into int32 lanes --------------------------------

// out[r, c] for MR rows of a16 (int16, widened, zero-padded to a multiple of the vector) and NR weight
// rows; pf: the weight rows to prefetch (the next tile's; the same rows for the last tile).
template <int MR, int NR>
HWY_NOINLINE void TileI16(const int16_t* HWY_RESTRICT a, int64_t lda, const int8_t* HWY_RESTRICT b, int64_t ldb,
                          int64_t K, const int8_t* pf, int32_t* HWY_RESTRICT out, int64_t ldo) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  using V32 = hn::Vec<decltype(d32)>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d16));
  V32 acc0[MR][NR], acc1[MR][NR];
  GB_I8_UNROLL for (int r = 0; r < MR; ++r) {
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) acc0[r][c] = acc1[r][c] = hn::Zero(d32);
  }
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    if ((k & 63) == 0) {
      GB_I8_UNROLL for (int c = 0; c < NR; ++c) __builtin_prefetch(pf + c * ldb + k, 0, 1);  // to L2
    }
    hn::Vec<decltype(d16)> av[MR];
    GB_I8_UNROLL for (int r = 0; r < MR; ++r) av[r] = hn::LoadU(d16, a + r * lda + k);
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
      const auto bv = hn::PromoteTo(d16, hn::LoadU(d8, b + c * ldb + k));
      GB_I8_UNROLL for (int r = 0; r < MR; ++r) acc0[r][c] =
          hn::ReorderWidenMulAccumulate(d32, av[r], bv, acc0[r][c], acc1[r][c]);
    }
  }
  GB_I8_UNROLL for (int r = 0; r < MR; ++r) {
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
      int32_t s = hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc0[r][c], acc1[r][c])));
      for (int64_t t = k; t < K; ++t) s += int32_t{a[r * lda + t]} * int32_t{b[c * ldb + t]};
      out[r * ldo + c] = s;
    }
  }
}

// Weight rows per column block: a block's rows stay in L2 while every input row tile passes over them.
inline int64_t ColBlock(int64_t K) {
  const int64_t c = (int64_t{256} << 10) / std::max<int64_t>(K, 1);
  return std::clamp<int64_t>(c / 4 * 4, 4, 256);
}

// Rows [0, m) of the prepared block against weight rows [0, n). Up to two input rows: tiles of 4 weight
// rows (streamed once, the next tile prefetched); more: per column block, tiles of 4 input rows x 2
// weight rows (AVX2 has 16 vector registers), the input tile in L1, the weight block in L2.
void DotI16Block(const int16_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K,
                 int32_t* out, int64_t ldo) {
  if (m <= 2) {
    constexpr int NR = 4;
    int64_t c = 0;
    for (; c + NR <= n; c += NR) {
      const int8_t* pf = b + prefetch_row(c, NR, n, ldb) * ldb;
      if (m == 2) {
        TileI16<2, NR>(a, lda, b + c * ldb, ldb, K, pf, out + c, ldo);
      } else {
        TileI16<1, NR>(a, lda, b + c * ldb, ldb, K, pf, out + c, ldo);
      }
    }
    for (; c < n; ++c) {
      if (m == 2) {
        TileI16<2, 1>(a, lda, b + c * ldb, ldb, K, b + c * ldb, out + c, ldo);
      } else {
        TileI16<1, 1>(a, lda, b + c * ldb, ldb, K, b + c * ldb, out + c, ldo);
      }
    }
    return;
  }
  constexpr int NR = 2;
  const int64_t cb = ColBlock(K);
  for (int64_t c0 = 0; c0 < n; c0 += cb) {
    const int64_t c1 = std::min(n, c0 + cb);
    auto row_tiles = [&](auto mr_tag, int64_t r) {
      constexpr int MR = decltype(mr_tag)::value;
      int64_t c = c0;
      for (; c + NR <= c1; c += NR) {
        const int8_t* pf = b + prefetch_row(c, NR, n, ldb) * ldb;
        TileI16<MR, NR>(a + r * lda, lda, b + c * ldb, ldb, K, pf, out + r * ldo + c, ldo);
      }
      for (; c < c1; ++c) TileI16<MR, 1>(a + r * lda, lda, b + c * ldb, ldb, K, b + c * ldb, out + r * ldo + c, ldo);
    };
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) row_tiles(std::integral_constant<int, 4>(), r);
    for (; r + 2 <= m; r += 2) row_tiles(std::integral_constant<int, 2>(), r);
    for (; r < m; ++r) row_tiles(std::integral_constant<int, 1>(), r);
  }
}

void DotI16(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K, int32_t* out,
            int64_t ldo) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d16));
  const int64_t ld16 = (K + L - 1) / L * L;
  const int64_t mb = std::min(m, kInt8RowBlock);
  int16_t* a16 = static_cast<int16_t*>(thread_scratch_bytes(4, static_cast<size_t>(mb * ld16) * sizeof(int16_t)));
  for (int64_t r0 = 0; r0 < m; r0 += kInt8RowBlock) {
    const int64_t mr = std::min(kInt8RowBlock, m - r0);
    for (int64_t i = 0; i < mr; ++i) {
      const int8_t* src = a + (r0 + i) * lda;
      int16_t* dst = a16 + i * ld16;
      int64_t k = 0;
      for (; k + L <= K; k += L) hn::StoreU(hn::PromoteTo(d16, hn::LoadU(d8, src + k)), d16, dst + k);
      for (; k < K; ++k) dst[k] = src[k];
      for (; k < ld16; ++k) dst[k] = 0;
    }
    DotI16Block(a16, ld16, mr, b, ldb, n, K, out + r0 * ldo, ldo);
  }
}

// ---- avx512 + AVX512-VNNI: vpdpbusd on (a + 128) minus 128 x the weight row sums --------------------------
// Raw intrinsics in functions compiled with the VNNI extension on top of the avx512 target; taken only
// when the CPU reports AVX512-VNNI (checked once per call).
#if HWY_TARGET == HWY_AVX3
#define GB_VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12 reports its own intrinsics' deliberately undefined pass-through operands as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"

// Sum of the 16 int32 lanes, modulo 2^32 (intrinsics: the hardware's wrapping adds).
GB_VNNI_ATTR HWY_INLINE int32_t VnniReduce(__m512i v) {
  __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  return _mm_cvtsi128_si32(s4);
}

// acc += the 4-byte dot products of a (u8) and w (s8) per int32 lane, in place. Inline assembly: with the
// intrinsic GCC 12 copies each accumulator to another register and back around every instruction.
GB_VNNI_ATTR HWY_INLINE void Dpbusd(__m512i& acc, __m512i a, __m512i w) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w));
}

// out[r, c] for MR rows of au (a + 128 as u8, padded to a multiple of 64) and NR weight rows. kSum: the
// weight row sums are accumulated in the same pass; otherwise wsum holds them.
template <int MR, int NR, bool kSum>
GB_VNNI_ATTR HWY_NOINLINE void TileVnni(const uint8_t* HWY_RESTRICT a, int64_t lda, const int8_t* HWY_RESTRICT b,
                                        int64_t ldb, int64_t K, const int8_t* pf, const int32_t* wsum,
                                        int32_t* HWY_RESTRICT out, int64_t ldo) {
  __m512i acc[MR][NR], s[NR];
  const __m512i ones = _mm512_set1_epi8(1);
  GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
    s[c] = _mm512_setzero_si512();
    GB_I8_UNROLL for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_setzero_si512();
  }
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512i av[MR];
    GB_I8_UNROLL for (int r = 0; r < MR; ++r) av[r] = _mm512_loadu_si512(a + r * lda + k);
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(pf + c * ldb + k), _MM_HINT_T1);  // to L2
      const __m512i w = _mm512_loadu_si512(b + c * ldb + k);
      if constexpr (kSum) Dpbusd(s[c], ones, w);
      GB_I8_UNROLL for (int r = 0; r < MR; ++r) Dpbusd(acc[r][c], av[r], w);
    }
  }
  if (k < K) {  // the tail: masked weight loads (the padded activations then multiply zeros)
    const __mmask64 mask = (__mmask64{1} << (K - k)) - 1;
    __m512i av[MR];
    GB_I8_UNROLL for (int r = 0; r < MR; ++r) av[r] = _mm512_loadu_si512(a + r * lda + k);
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
      const __m512i w = _mm512_maskz_loadu_epi8(mask, b + c * ldb + k);
      if constexpr (kSum) Dpbusd(s[c], ones, w);
      GB_I8_UNROLL for (int r = 0; r < MR; ++r) Dpbusd(acc[r][c], av[r], w);
    }
  }
  GB_I8_UNROLL for (int c = 0; c < NR; ++c) {
    // Lane-wise correction: 128 x the lane's weight sum (kSum), or 128 x the row's sum in lane 0.
    const __m512i corr = kSum ? _mm512_slli_epi32(s[c], 7)
                              : _mm512_maskz_set1_epi32(1, static_cast<int32_t>(static_cast<uint32_t>(wsum[c]) << 7));
    GB_I8_UNROLL for (int r = 0; r < MR; ++r) out[r * ldo + c] = VnniReduce(_mm512_sub_epi32(acc[r][c], corr));
  }
}

// The sums of NR weight rows.
template <int NR>
GB_VNNI_ATTR HWY_NOINLINE void RowSumsVnni(const int8_t* HWY_RESTRICT b, int64_t ldb, int64_t K, int32_t* wsum) {
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s[NR];
  GB_I8_UNROLL for (int c = 0; c < NR; ++c) s[c] = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) Dpbusd(s[c], ones, _mm512_loadu_si512(b + c * ldb + k));
  }
  if (k < K) {
    const __mmask64 mask = (__mmask64{1} << (K - k)) - 1;
    GB_I8_UNROLL for (int c = 0; c < NR; ++c) Dpbusd(s[c], ones, _mm512_maskz_loadu_epi8(mask, b + c * ldb + k));
  }
  GB_I8_UNROLL for (int c = 0; c < NR; ++c) wsum[c] = VnniReduce(s[c]);
}

// Up to 4 input rows: one tile of all of them, the weight sums in the same pass, 4 weight rows streamed
// at once and the next tile prefetched.
template <int MR>
void VnniGemv(const uint8_t* a, int64_t lda, const int8_t* b, int64_t ldb, int64_t n, int64_t K, int32_t* out,
              int64_t ldo) {
  constexpr int NR = 4;
  int64_t c = 0;
  for (; c + NR <= n; c += NR) {
    const int8_t* pf = b + prefetch_row(c, NR, n, ldb) * ldb;
    TileVnni<MR, NR, true>(a, lda, b + c * ldb, ldb, K, pf, nullptr, out + c, ldo);
  }
  for (; c < n; ++c) TileVnni<MR, 1, true>(a, lda, b + c * ldb, ldb, K, b + c * ldb, nullptr, out + c, ldo);
}

// More input rows: per column block (in L2), the block's weight row sums first, then tiles of 4 (2, 1)
// input rows (in L1) x 4 weight rows.
void VnniGemm(const uint8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K,
              int32_t* out, int64_t ldo) {
  constexpr int NR = 4;
  const int64_t cb = ColBlock(K);
  int32_t* ws = static_cast<int32_t*>(thread_scratch_bytes(5, static_cast<size_t>(cb) * sizeof(int32_t)));
  for (int64_t c0 = 0; c0 < n; c0 += cb) {
    const int64_t c1 = std::min(n, c0 + cb);
    int64_t c = c0;
    for (; c + NR <= c1; c += NR) RowSumsVnni<NR>(b + c * ldb, ldb, K, ws + (c - c0));
    for (; c < c1; ++c) RowSumsVnni<1>(b + c * ldb, ldb, K, ws + (c - c0));
    auto row_tiles = [&](auto mr_tag, int64_t r) {
      constexpr int MR = decltype(mr_tag)::value;
      int64_t c = c0;
      for (; c + NR <= c1; c += NR) {
        const int8_t* pf = b + prefetch_row(c, NR, n, ldb) * ldb;
        TileVnni<MR, NR, false>(a + r * lda, lda, b + c * ldb, ldb, K, pf, ws + (c - c0), out + r * ldo + c, ldo);
      }
      for (; c < c1; ++c) {
        TileVnni<MR, 1, false>(a + r * lda, lda, b + c * ldb, ldb, K, b + c * ldb, ws + (c - c0), out + r * ldo + c,
                               ldo);
      }
    };
    int64_t r = 0;
    for (; r + 4 <= m; r += 4) row_tiles(std::integral_constant<int, 4>(), r);
    for (; r + 2 <= m; r += 2) row_tiles(std::integral_constant<int, 2>(), r);
    for (; r < m; ++r) row_tiles(std::integral_constant<int, 1>(), r);
  }
}

GB_VNNI_ATTR void DotVnni(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K,
                          int32_t* out, int64_t ldo) {
  const int64_t ldu = (K + 63) / 64 * 64;
  const int64_t mb = std::min(m, kInt8RowBlock);
  uint8_t* au = static_cast<uint8_t*>(thread_scratch_bytes(4, static_cast<size_t>(mb * ldu)));
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t r0 = 0; r0 < m; r0 += kInt8RowBlock) {
    const int64_t mr = std::min(kInt8RowBlock, m - r0);
    for (int64_t i = 0; i < mr; ++i) {  // au = a + 128 (as u8) = a ^ 0x80; padding: 0x80 (a = 0)
      const int8_t* src = a + (r0 + i) * lda;
      uint8_t* dst = au + i * ldu;
      for (int64_t k = 0; k < K; k += 64) {
        const __mmask64 mask = K - k >= 64 ? ~__mmask64{0} : (__mmask64{1} << (K - k)) - 1;
        _mm512_storeu_si512(dst + k, _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, src + k), bias));
      }
    }
    int32_t* o = out + r0 * ldo;
    switch (mr) {
      case 1:
        VnniGemv<1>(au, ldu, b, ldb, n, K, o, ldo);
        break;
      case 2:
        VnniGemv<2>(au, ldu, b, ldb, n, K, o, ldo);
        break;
      case 3:
        VnniGemv<3>(au, ldu, b, ldb, n, K, o, ldo);
        break;
      case 4:
        VnniGemv<4>(au, ldu, b, ldb, n, K, o, ldo);
        break;
      default:
        VnniGemm(au, ldu, mr, b, ldb, n, K, o, ldo);
    }
  }
}

bool VnniUsable() {
  static const bool cpu = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  return cpu && int8_dot_internal::vnni_allowed();
}
#pragma GCC diagnostic pop
#undef GB_VNNI_ATTR
#endif  // HWY_TARGET == HWY_AVX3

void Int8DotRows(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n, int64_t K,
                 int32_t* out, int64_t ldo) {
  if (m <= 0 || n <= 0) return;
#if HWY_TARGET == HWY_AVX3
  if (VnniUsable()) return DotVnni(a, lda, m, b, ldb, n, K, out, ldo);
#endif
  DotI16(a, lda, m, b, ldb, n, K, out, ldo);
}

bool Int8VnniInUse() {
#if HWY_TARGET == HWY_AVX3
  return VnniUsable();
#else
  return false;
#endif
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(Int8DotRows);
HWY_EXPORT(Int8VnniInUse);

Int8DotRowsFn int8_dot_rows_fn() { return GB_DISPATCH(Int8DotRows); }
bool int8_vnni_in_use() { return GB_DISPATCH(Int8VnniInUse)(); }

}  // namespace genbridge::ops::detail
#endif
