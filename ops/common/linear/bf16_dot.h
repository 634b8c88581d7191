#pragma once
// Internal: the bf16 pair contract (ops/common/linear/dot_kernel.h) on the CPU's bf16 dot-product instruction
// (AVX512_BF16 vdpbf16ps, x86-64), which computes exactly the contract's two steps per lane: for each 32-bit lane,
// acc + x_odd * w_odd, rounded, then + x_even * w_even, rounded, with denormal inputs as zero and results tiny
// before rounding flushed. Called by dot_kernel.cpp's AVX-512 paths when simd::bf16_dot_enabled() and the input
// rows are bf16 values; the caller holds a simd::FlushDenormals scope, so that the lane sums here follow the same
// denormal rule as the instruction.
//
// Operands are 32-bit words, each a pair of bf16 (low half: element 2 i, high half: element 2 i + 1).

#include <cstdint>

#include "genbridge/core/formats.h"

namespace genbridge::ops::detail {

// out[r * ldo + c] = the contract's dot of input row r (xw + r * ldx: PairPadded(K) / 2 words, zero past K) and
// weight row c (w + c * ldw: K bf16 elements, read only up to K), for r < m <= 7, c < n. stream: the weights come
// from memory (prefetched a tile ahead), not from a cache an earlier call filled.
void bf16_dot_gemv(const uint32_t* xw, int64_t ldx, int64_t m, const bf16_t* w, int64_t ldw, int64_t n, int64_t K,
                   float* out, int64_t ldo, bool stream);

// The packed micro-kernel (dot_kernel.cpp's PackedMicro): lanes [l0, l0 + ll) of mr rows, ap the row tile's words
// [16][JP][mr] (lane l, pair step jp, row r), bp one panel of packed weights [16][JP][16]; writes the lanes'
// partial sums to part[(l * mr + r) * 16 + c]. mr <= 12, ll in {1, 2, 4, 8} with ll * mr <= 24.
void bf16_dot_packed_micro(int mr, int ll, const uint32_t* ap, const uint32_t* bp, int64_t JP, int l0, float* part);
// The same for lane l of two panels bp0 and bp1 (partials to part0 and part1), mr <= 12.
void bf16_dot_packed_micro2(int mr, const uint32_t* ap, const uint32_t* bp0, const uint32_t* bp1, int64_t JP, int l,
                            float* part0, float* part1);

}  // namespace genbridge::ops::detail
