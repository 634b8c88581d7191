#pragma once
// Internal: the batch-invariant dot-product kernel behind linear/linear and moe/expert_ffn
// (ops/common/linear/dot_kernel.cpp, compiled once per CPU target and dispatched at run time).
//
// The reduction order is the contract every caller shares; it makes each output element a pure
// function of its own input row and weight row, whatever the batch size, the tiling, the thread
// count, the CPU target or the op that computes it. fp32 and fp16 weights:
//   16 fp32 lanes per output element, each starting at +0; lane l accumulates a[k]*b[k] for
//   k = l, l+16, l+32, ... in increasing k with fused multiply-add (one rounding per step); a partial
//   last block is zero-padded (its steps run, with a = b = 0); the lanes are then summed in the fixed
//   pairwise order s8[i] = s[i] + s[i+8], s4[i] = s8[i] + s8[i+4], (s4[0] + s4[2]) + (s4[1] + s4[3]).
// bf16 weights (the pair contract, the one the CPU's bf16 dot-product instruction computes exactly):
//   16 fp32 lanes from +0; per block of 32 elements (the last zero-padded), lane l takes the pair k = 32 s + 2 l,
//   32 s + 2 l + 1: first a[k+1]*b[k+1] (odd), then a[k]*b[k] (even), each a fused multiply-add; the same pairwise
//   lane sum. Every step and the lane sum run with denormal inputs as zero and results that are tiny before
//   rounding flushed to a zero of their sign (core/simd/flush_denormals.h). Where the input rows hold bf16 values
//   and the CPU has AVX512_BF16, vdpbf16ps computes the steps (ops/common/linear/bf16_dot.h); elsewhere FMAs do,
//   in the same order and mode.
// Two paths compute it: GEMV (fewer than kGemmMinRows input rows: one 16-lane accumulator per output,
// weights streamed once) and GEMM (kGemmMinRows or more: weights packed per column panel, lane-major,
// and an outer-product micro-kernel whose accumulators hold one contract lane for a vector of columns).
// Both run exactly the same operations per output element, so their bits are the same.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "genbridge/core/dtype.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"

namespace genbridge::ops::detail {

// out[r * ldo + c] = dot(a[r * lda + 0:K], b[c * ldb + 0:K]) for r < m, c < n, in the contract's order.
// b's elements are of the dtype the function was picked for (dot_rows_fn); K >= 1.
using DotRowsFn = void (*)(const float* a, int64_t lda, int64_t m, const void* b, int64_t ldb, int64_t n, int64_t K,
                           float* out, int64_t ldo);

// The kernel for weights of dtype w (fp32, fp16 or bf16) on the CPU target in use: dispatches once
// (GENBRIDGE_CPU_TARGET applied first). Call once per op call, not per tile.
DotRowsFn dot_rows_fn(DType w);

// The GEMM path for weights the caller produces chunk by chunk (e.g. decoded from a quantized format): as
// dot_rows_fn's GEMM with fp32 weights, where chunk(ctx, c0, nc, k, K, t) writes weight rows [c0, c0 + nc)
// (nc <= 64), elements [k, k + 16) as fp32 into t[c * 16 + l] (zero for k + l >= K; rows nc and up untouched).
// Same bits as dot_rows_fn(kF32) on those weights. m >= 1, K >= 1; any m takes the GEMM path.
using WeightChunkFn = void (*)(const void* ctx, int64_t c0, int64_t nc, int64_t k, int64_t K, float* t);
using GemmChunksFn = void (*)(const float* a, int64_t lda, int64_t m, WeightChunkFn chunk, const void* ctx, int64_t n,
                              int64_t K, float* out, int64_t ldo);
GemmChunksFn gemm_chunks_fn();

// Packed bf16 weights: the same products in the same order from weights re-laid out once (at load) so that any
// number of input rows runs the outer-product kernel with no per-call packing and reads the weight bytes front
// to back, once per row tile. Layout (target-independent): panels of kPackedCols weight rows (zero rows past
// n); in panel p, lane l's words [jp][c] (jp < JP = ceil(K / 32)) hold row 16 p + c's pair of bf16 elements
// k = 32 jp + 2 l (low half) and k + 1 (high half), zero past K.
inline constexpr int64_t kPackedCols = 16;
size_t packed_bf16_words(int64_t n, int64_t K);
void pack_bf16_panels(const bf16_t* b, int64_t ldb, int64_t n, int64_t K, uint32_t* dst);
// out[r * ldo + c] = dot(a[r * lda + 0:K], row c of the packed weights) for r < m, c < n; `packed` points at the
// panel of the first row (a multiple of kPackedCols). Same bits as dot_rows_fn(kBF16) on the unpacked rows.
using DotPackedFn = void (*)(const float* a, int64_t lda, int64_t m, const uint32_t* packed, int64_t n, int64_t K,
                             float* out, int64_t ldo);
DotPackedFn dot_packed_fn();

// Input rows from which the GEMM path is taken (below it, the GEMV path). Measured (linear bench, AVX2
// and AVX-512): at 8 rows, packing the weights costs more than it saves (GEMV in row chunks is 2x
// faster); at 32 rows the two are even, above it GEMM wins.
inline constexpr int64_t kGemmMinRows = 16;

// A per-thread scratch buffer of at least `bytes` bytes, 64-byte aligned (reused across calls; never
// shrinks). Each slot (0 .. 7) is a separate buffer; slots 4 .. 7 belong to the kernel itself.
void* thread_scratch_bytes(int slot, size_t bytes);
template <int Slot>
inline void* thread_scratch(size_t bytes) {
  static_assert(Slot >= 0 && Slot < 4, "slots 4 .. 7 are the kernel's");
  return thread_scratch_bytes(Slot, bytes);
}

// v's data, grown to at least n elements if it is shorter (never shrunk, never cleared): for a buffer of the calling
// thread (`thread_local std::vector`) that a call fills before reading, so that steady-state calls neither allocate
// nor fault pages in. Worker threads reach it through the returned pointer, never through the thread_local.
template <typename T>
T* grow_buffer(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

// Calls tile.template operator()<NR>(c) for the column tiles c = 0, NR, 2 NR, ... of n columns, then
// tile.template operator()<1>(c) for the columns left over (the GEMV kernels' walk over weight rows).
template <int NR, typename Tile>
inline void for_column_tiles(int64_t n, Tile&& tile) {
  int64_t c = 0;
  for (; c + NR <= n; c += NR) tile.template operator()<NR>(c);
  for (; c < n; ++c) tile.template operator()<1>(c);
}

// Column granularity of work items (a multiple of every target's GEMM panel width).
inline constexpr int64_t kPanelCols = 64;

// Rows per work item for m input rows: bounds the fp32 copy of an item's input rows. The GEMM path
// packs an item's weight panels once for all its rows, so its items hold up to kGemmRowsPerItem rows
// (work is then split over columns).
inline constexpr int64_t kRowsPerItem = 64;
inline constexpr int64_t kGemmRowsPerItem = 512;
inline int64_t rows_per_item(int64_t m) {
  return m < 8 ? kRowsPerItem : std::min<int64_t>(std::max<int64_t>(m, 1), kGemmRowsPerItem);
}

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
