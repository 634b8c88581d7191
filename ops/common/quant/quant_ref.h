#pragma once
// fp64 oracles for the quant/* operators (tests and benchmarks only), written from the format and
// scale-convention definitions; they do not call the library's 8/4-bit codecs. Inputs are the exact
// values of the (already rounded) input elements, row-major [rows, k].

#include <cstdint>
#include <vector>

#include "genbridge/core/dtype.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"

namespace genbridge::ref {

// Largest finite value and exponent of the largest binade of an MX element format (dst of dynamic_mx_quant).
double mx_max(DType dst);
int mx_emax(DType dst);

// Value of a code of fp8_e4m3fn, fp8_e5m2 or fp4_e2m1 (low nibble), from the format definition.
double mx_element_value(DType dst, uint8_t code);
// Round-to-nearest-even code of v on dst's grid, saturated to +-max; NaN gives the dst NaN code
// (fp4: 0). The sign of zero is kept.
uint8_t mx_encode(DType dst, double v);

// The e8m0 scale byte of a block with the given amax (|x| max; NaN or inf when the block holds one).
uint8_t mx_scale_byte(double amax, DType dst, ops::MxScaleAlg alg, bool round_scale);

// dynamic_mx_quant on a [rows, k] matrix: q bytes [rows, k] (fp4: [rows, k / 2] packed, low nibble
// first) and scale bytes [rows, pairs, 2] with the padding slot 0.
void dynamic_mx_quant(const std::vector<double>& x, int64_t rows, int64_t k, const ops::MxQuantConfig& config,
                      std::vector<uint8_t>& q, std::vector<uint8_t>& scale);

// mx_dequant before the final rounding to y's dtype: fl32(value * 2^(s - 127)), NaN for s = 0xFF.
void mx_dequant(const std::vector<uint8_t>& q, const std::vector<uint8_t>& scale, int64_t rows, int64_t k,
                int64_t block_size, DType q_dtype, std::vector<double>& y);

// dynamic_quant_per_token: scale[r] = fl32(max(amax, eps) / 127) (NaN when the row holds NaN),
// q = clamp(rne(fl32(x / scale)), -127, 127), 0 for a NaN quotient.
void dynamic_quant_per_token(const std::vector<double>& x, int64_t rows, int64_t k, float eps,
                             std::vector<int8_t>& q, std::vector<float>& scale);

}  // namespace genbridge::ref
