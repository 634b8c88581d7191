#pragma once
// Internal: the batch-invariant dot-product tile kernel behind linear/linear and moe/expert_ffn.
//
// The reduction order is the contract every caller shares; it makes each output element a pure
// function of its own input row and weight row, whatever the batch size, the tiling, the thread
// count or the op that computes it:
//   one 16-lane fp32 accumulator per output element, starting at +0; lane l accumulates a[k]*b[k] for
//   k = l, l+16, l+32, ... in increasing k with fused multiply-add (one rounding per step); a partial
//   last block is zero-padded; the lanes are then summed by vec::reduce_add (fixed pairwise order).
// Tiles only decide how many such independent chains run side by side, never their arithmetic.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/parallel.h"
#include "core/vec.h"
#include "genbridge/core/threading.h"

namespace genbridge::ops::detail {

using vec::f32x16;

// Lane-wise a*b + c with a single rounding. The portable branch gives the same bits (std::fma is exact).
inline f32x16 fma16(f32x16 a, f32x16 b, f32x16 c) {
#if defined(__AVX512F__)
  return reinterpret_cast<f32x16>(
      _mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#else
  f32x16 r;
  for (int i = 0; i < vec::kLanes; ++i) r[i] = std::fma(a[i], b[i], c[i]);
  return r;
#endif
}

// 16 consecutive elements widened to fp32 (exact). Same values as vec::load; on AVX-512 the 16-bit
// formats widen with one 512-bit instruction instead of the two 256-bit halves GCC emits for vec::load.
inline f32x16 load16(const float* p) { return vec::load(p); }
inline f32x16 load16(const bf16_t* p) {
#if defined(__AVX512F__)
  // maskz forms: same instructions, but GCC 12 warns about the undefined source of the plain ones.
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<f32x16>(_mm512_maskz_slli_epi32(0xffff, w, 16));
#else
  return vec::load(p);
#endif
}
inline f32x16 load16(const fp16_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<f32x16>(
      _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#else
  return vec::load(p);
#endif
}

// vec::reduce_add with vector instructions: the same pairings in the same order (lane i + lane i+8,
// then + lane i+4, then (0 + 2) + (1 + 3)), so the same bits.
inline float reduce16(f32x16 v) {
  typedef float f32x8 __attribute__((vector_size(32)));
  typedef float f32x4 __attribute__((vector_size(16)));
  const f32x8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  const f32x4 s2 = s4 + __builtin_shufflevector(s4, s4, 2, 3, 2, 3);  // [s4[0] + s4[2], s4[1] + s4[3], ..]
  return s2[0] + s2[1];
}

// Prefetches base[i] towards L2. Integer arithmetic: the address may lie past the end of the array
// (prefetches never fault).
template <typename T>
inline void prefetch_l2(const T* base, int64_t i) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) + i * sizeof(T)), 0, 1);
}

// The first n (< 16) elements of p, zero-padded to 16 lanes.
template <typename T>
inline f32x16 load_tail(const T* p, int64_t n) {
  T tmp[vec::kLanes];
  std::memset(static_cast<void*>(tmp), 0, sizeof tmp);
  std::memcpy(static_cast<void*>(tmp), p, static_cast<size_t>(n) * sizeof(T));
  return load16(tmp);
}

// Tile shape: up to kTileRows input rows against kTileCols weight rows at once (kTileRows * kTileCols
// accumulators plus kTileCols weight vectors must fit the 32 vector registers).
inline constexpr int kTileRows = 8;
inline constexpr int kTileCols = 3;
// K is walked in blocks of kKBlock (a multiple of 16) so that a tile's input rows stay in L1 while
// every weight tile of a block passes by; the 16-lane accumulators are saved between blocks, exactly,
// so blocking changes nothing in the arithmetic.
inline constexpr int64_t kKBlock = 1024;
static_assert(kKBlock % vec::kLanes == 0, "K blocks must hold whole 16-lane steps");

// One tile over one K block: acc[r * acc_ld + c] (r < MR, c < NR) continue the accumulation of
// dot(a[r * lda + 0:K], b[c * ldb + 0:K]) (first: start from +0 instead of loading acc). When `last`,
// the lanes are reduced into out[r * NR + c] instead of being saved. K need not be a multiple of 16
// only in the last block (the tail is zero-padded). While it runs, the next NR weight rows (the next
// tile's, rows being adjacent) are prefetched at the same K offsets: a weight row is often exactly one
// 4 KiB page, and the hardware prefetchers do not cross pages, so without this every new row starts cold.
template <typename BT, int MR, int NR>
void dot_tile(const float* a, int64_t lda, const BT* b, int64_t ldb, int64_t K, f32x16* acc_mem, int64_t acc_ld,
              bool first, bool last, float* out) {
  f32x16 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) acc[r][c] = first ? f32x16{} : acc_mem[r * acc_ld + c];

  int64_t k = 0;
  for (; k + vec::kLanes <= K; k += vec::kLanes) {
    f32x16 bv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) prefetch_l2(b, (c + NR) * ldb + k);
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) bv[c] = load16(b + c * ldb + k);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const f32x16 av = load16(a + r * lda + k);
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) acc[r][c] = fma16(av, bv[c], acc[r][c]);
    }
  }
  if (k < K) {
    const int64_t n = K - k;
    f32x16 bv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) bv[c] = load_tail(b + c * ldb + k, n);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const f32x16 av = load_tail(a + r * lda + k, n);
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) acc[r][c] = fma16(av, bv[c], acc[r][c]);
    }
  }
  if (last) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) out[r * NR + c] = reduce16(acc[r][c]);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) acc_mem[r * acc_ld + c] = acc[r][c];
  }
}

// dot_tile for a runtime row count mr in [1, MR].
template <typename BT, int NR, int MR = kTileRows>
inline void dot_tile_rows(int mr, const float* a, int64_t lda, const BT* b, int64_t ldb, int64_t K, f32x16* acc,
                          int64_t acc_ld, bool first, bool last, float* out) {
  if constexpr (MR == 1) {
    dot_tile<BT, 1, NR>(a, lda, b, ldb, K, acc, acc_ld, first, last, out);
  } else if (mr == MR) {
    dot_tile<BT, MR, NR>(a, lda, b, ldb, K, acc, acc_ld, first, last, out);
  } else {
    dot_tile_rows<BT, NR, MR - 1>(mr, a, lda, b, ldb, K, acc, acc_ld, first, last, out);
  }
}

// A per-thread scratch buffer of at least `bytes` bytes, 64-byte aligned (reused across calls; never
// shrinks). Each Slot is a separate buffer, for callers that need several at once.
template <int Slot>
inline void* thread_scratch(size_t bytes) {
  thread_local std::vector<f32x16> buf;
  const size_t n = (bytes + sizeof(f32x16) - 1) / sizeof(f32x16);
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Weight rows per panel with several row tiles: the panel's K block stays in L2 while every row tile
// passes, and the accumulator buffer is bounded to m x kPanelCols vectors.
inline constexpr int64_t kPanelCols = 21 * kTileCols;

// Computes dot(a[r * lda + 0:K], b[c * ldb + 0:K]) for r < m, c < n and hands every finished tile to
// sink(r0, c0, mr, nc, vals) with vals[i * nc + j] the result for row r0 + i and column c0 + j.
// With more than one row tile, per panel of weight rows and per K block, row tiles are the outer loop
// (their input rows stay in L1) and weight tiles the inner one (the panel's block stays in L2);
// accumulators live in a per-thread m x kPanelCols buffer between K blocks. With at most one row tile
// (decode) each weight row is streamed once, whole.
template <typename BT, typename Sink>
void dot_block(const float* a, int64_t lda, int64_t m, const BT* b, int64_t ldb, int64_t n, int64_t K, Sink&& sink) {
  const bool blocked = m > kTileRows;
  const int64_t k_blocks = blocked ? std::max<int64_t>(1, (K + kKBlock - 1) / kKBlock) : 1;
  const int64_t panel = blocked ? kPanelCols : std::max<int64_t>(n, 1);
  f32x16* acc =
      k_blocks > 1 ? static_cast<f32x16*>(thread_scratch<1>(static_cast<size_t>(m * kPanelCols) * sizeof(f32x16)))
                   : nullptr;
  float vals[kTileRows * kTileCols];
  for (int64_t p0 = 0; p0 < n; p0 += panel) {
    const int64_t pn = std::min(panel, n - p0);
    const BT* bp = b + p0 * ldb;
    for (int64_t kb = 0; kb < k_blocks; ++kb) {
      const int64_t k0 = kb * kKBlock, kn = kb == k_blocks - 1 ? K - k0 : kKBlock;
      const bool first = kb == 0, last = kb == k_blocks - 1;
      for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
        const int mr = static_cast<int>(std::min<int64_t>(kTileRows, m - r0));
        const float* ap = a + r0 * lda + k0;
        f32x16* acc_rows = acc ? acc + r0 * pn : nullptr;
        int64_t c0 = 0;
        for (; c0 + kTileCols <= pn; c0 += kTileCols) {
          dot_tile_rows<BT, kTileCols>(mr, ap, lda, bp + c0 * ldb + k0, ldb, kn, acc ? acc_rows + c0 : nullptr, pn,
                                       first, last, vals);
          if (last) sink(r0, p0 + c0, mr, kTileCols, vals);
        }
        for (; c0 < pn; ++c0) {
          dot_tile_rows<BT, 1>(mr, ap, lda, bp + c0 * ldb + k0, ldb, kn, acc ? acc_rows + c0 : nullptr, pn, first,
                               last, vals);
          if (last) sink(r0, p0 + c0, mr, 1, vals);
        }
      }
    }
  }
}

// Rows per work item (a multiple of the tile height): bounds the fp32 copy of an item's input rows.
inline constexpr int64_t kRowsPerItem = 64;

// Columns per work item: all n when there are enough row blocks to keep every thread busy (an item's
// input rows are then widened once), otherwise about 4 items per thread, in whole panels.
inline int64_t cols_per_item(int64_t n, int64_t row_blocks, int threads) {
  const int64_t want = 4 * static_cast<int64_t>(threads);
  if (row_blocks >= want || n <= kPanelCols) return std::max<int64_t>(n, 1);
  const int64_t groups = std::min((want + row_blocks - 1) / row_blocks, (n + kPanelCols - 1) / kPanelCols);
  const int64_t c = (n + groups - 1) / groups;
  return (c + kPanelCols - 1) / kPanelCols * kPanelCols;
}

// Calls fn(i) for every item in [0, n_items), each on exactly one thread, handed out one at a time
// (items may differ in cost). Results cannot depend on the thread count as long as every item writes
// its own outputs. Runs on the caller's thread when `work` (a rough multiply-add count) is small.
template <typename Fn>
void parallel_items(int64_t n_items, int64_t work, Fn&& fn) {
  if (n_items <= 0) return;
  if (num_threads() <= 1 || n_items == 1 || work < (int64_t{1} << 17)) {
    for (int64_t i = 0; i < n_items; ++i) fn(i);
    return;
  }
  genbridge::detail::parallel_for_dynamic(n_items, fn);
}

}  // namespace genbridge::ops::detail
