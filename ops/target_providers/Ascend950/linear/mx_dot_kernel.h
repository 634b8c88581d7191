#pragma once
// Internal: MX weight decode and the fused decode + dot GEMV behind linear/quant_linear's MX schemes
// (mx_dot_kernel.cpp, compiled once per CPU target, dispatched at run time). Private to this generation.
//
// Decode: w[k] = fl32(element(q[k]) * 2^(s_j - 127)), j = k / 32, with s read in place from the pair layout
// (row r's block j is scale[r * lds + j]). Bit-exact with the scalar decode tables on every target.
// GEMV: out[r, c] = the dot_kernel.h contract reduction of a[r, :] against decoded row c (16 lanes, FMA in
// increasing k, zero-padded last block, fixed pairwise lane sum): the same bits as decoding first and
// calling dot_rows_fn(kF32), without writing the decoded weights anywhere.

#include <cstdint>

#include "ops/common/linear/dot_kernel.h"

namespace genbridge::ops::detail {

// An MX weight's rows: row r's elements at q + r * ldq, its block j's scale at scale[r * lds + j].
struct MxWeightRows {
  const uint8_t* q;
  int64_t ldq;
  const uint8_t* scale;
  int64_t lds;
};

// fp4: element = fp4 e2m1 (two per byte, low nibble first; q rows hold K / 2 bytes), else fp8 e4m3fn.
using MxGemvFn = void (*)(const float* a, int64_t lda, int64_t m, const uint8_t* q, int64_t ldq, const uint8_t* scale,
                          int64_t lds, int64_t n, int64_t K, float* out, int64_t ldo);

// The decode as gemm_chunks_fn's weight chunks; ctx: a const MxWeightRows*.
WeightChunkFn mx_chunk_fn(bool fp4);
// m <= kMxGemvMaxRows.
MxGemvFn mx_gemv_fn(bool fp4);
inline constexpr int64_t kMxGemvMaxRows = 4;
// The most input rows for which run_mx_linear takes the fused GEMV (in chunks of kMxGemvMaxRows) rather than the
// GEMM, on the dispatched CPU target (at least kGemmMinRows - 1; the same bits either way).
int64_t mx_fused_max_rows(bool fp4);

}  // namespace genbridge::ops::detail
