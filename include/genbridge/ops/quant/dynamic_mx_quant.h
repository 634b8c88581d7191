#pragma once
// Stable operator quant/dynamic_mx_quant (docs/design.md#stable-operator-contracts): OCP microscaling (MX) quantization
// along the last axis, one e8m0 scale per block, scales stored in the "pair" layout.

#include <cstdint>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// How a block's shared exponent s (scale 2^s, stored as the e8m0 byte s + 127) follows from its amax
// (largest |x| in the block). emax(dst) = 8, 15, 2 and max(dst) = 448, 57344, 6 for fp8_e4m3fn,
// fp8_e5m2 and fp4_e2m1. Every result is clamped to the e8m0 range [-127, 127].
enum class MxScaleAlg : int {
  // s = floor(log2(amax)) - emax(dst) (OCP MX v1.0). amax / 2^s lies in [2^emax, 2^(emax+1)), so a block
  // maximum above max(dst) saturates. An all-zero block gets s = -127.
  kOcpFloor = 0,
  // s = the smallest integer with amax / 2^s <= max(dst): nothing saturates. FP8 destinations only.
  kCeil = 1,
  // Deployed kernels' rule: s = (biased fp32 exponent of fl32(max(amax, 1e-4) * fl32(1 / max(dst)))) - 127,
  // plus one when round_scale is set. Without round_scale the block maximum may saturate; with it the
  // scale is one binade larger than needed when amax / max(dst) is an exact power of two. This is not
  // the vendor library's FP4-only scale_alg 2.
  kBiasedExponent = 2,
};

inline constexpr float kMxBiasedExponentAmaxFloor = 1e-4f;

struct MxQuantConfig {
  int64_t block_size = 32;                       // elements per scale: a multiple of 32 in [32, 1024]
  DType dst = DType::kFp8E4M3FN;                 // kFp8E4M3FN, kFp8E5M2 or kFp4E2M1x2
  MxScaleAlg scale_alg = MxScaleAlg::kOcpFloor;  // see MxScaleAlg
  bool round_scale = false;                      // kBiasedExponent only: one binade up
};

// Blocks per row of k elements, and scale pairs per row (the pair layout's second-to-last dimension).
inline int64_t mx_num_blocks(int64_t k, int64_t block_size) { return (k + block_size - 1) / block_size; }
inline int64_t mx_scale_pairs(int64_t k, int64_t block_size) { return (mx_num_blocks(k, block_size) + 1) / 2; }

// For each row of x (last dimension, K elements) and each block j of block_size elements (the last
// block may be shorter: it behaves as if zero-padded): scale[..., j / 2, j % 2] = s_j + 127 and
// q[..., i] = encode_dst(x[..., i] / 2^s_j), rounded to nearest even and saturated to +-max(dst)
// (see formats.h). The odd trailing scale slot of a row, if any, is written as 0. A block holding NaN
// or +-inf gets scale 0xFF (NaN) and every element of it the dst NaN code (fp4_e2m1: 0).
// x: fp32/fp16/bf16, rank >= 1, any strides. q: dtype config.dst, x's shape (fp4_e2m1x2: last dimension
// K / 2, K even, value 2i in the low nibble of byte i), any strides. scale: e8m0 with shape
// x.shape[:-1] + [mx_scale_pairs(K, block_size), 2], any strides. Writes q and scale only (nothing on
// error); does not retain views; results do not depend on the thread count.
// Needs an MX (FP8/FP4 + E8M0) data path: a build for a generation without one returns Unimplemented.
Status dynamic_mx_quant(const TensorView& x, const MxQuantConfig& config, const TensorView& q, const TensorView& scale);

}  // namespace genbridge::ops
