#pragma once
// Internal: the int8 x int8 -> int32 dot kernel behind linear/quant_linear's W8A8 scheme
// (ops/common/linear/int8_dot_kernel.cpp, compiled once per CPU target and dispatched at run time).
// Integer sums are exact, so every target and every tiling gives the same bits (K <= kW8A8MaxK).
//
// Two instruction paths, the same integers:
//   - every target: both operands sign-extended to int16, pairwise multiply-add into int32 lanes
//     (vpmaddwd on x86); the activation rows are widened once per call;
//   - avx512 on a CPU with AVX512-VNNI: vpdpbusd (u8 x s8 -> s32, 64 products per instruction) on the
//     activation made unsigned (a + 128), minus 128 x the weight row's sum (computed in the same pass for
//     up to 4 input rows, in a pass of its own per weight tile above that). Int32 lanes wrap modulo 2^32
//     in the hardware; the exact result fits in int32, so the difference is exact.
// Tiles of up to 4 input rows x 4 weight rows (1 x 4 at batch 1: four weight rows streamed at once), the
// next tile's weight rows prefetched, one horizontal sum per output at the end of K; rows in blocks of 64
// (the activation block stays in L2 while every weight tile is used by all its rows).

#include <cstdint>

namespace genbridge::ops::detail {

// out[r * ldo + c] = sum_k a[r * lda + k] * b[c * ldb + k] (int32, exact) for r < m, c < n.
using Int8DotRowsFn = void (*)(const int8_t* a, int64_t lda, int64_t m, const int8_t* b, int64_t ldb, int64_t n,
                               int64_t K, int32_t* out, int64_t ldo);

// The kernel for the CPU target in use (GENBRIDGE_CPU_TARGET applied first). Call once per op call.
Int8DotRowsFn int8_dot_rows_fn();

// Whether the avx512 kernel may take its VNNI path on a CPU that has it (default true). For tests and
// benchmarks (both paths give the same bits); not to be called while kernels run.
void set_int8_vnni_allowed(bool allowed);
// Whether the VNNI path runs now: allowed, the target in use is avx512 and the CPU has AVX512-VNNI.
bool int8_vnni_in_use();

}  // namespace genbridge::ops::detail
