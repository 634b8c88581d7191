#pragma once
// Internal: the MX (OCP microscaling) host kernels behind quant/dynamic_mx_quant, quant/mx_dequant and
// quant/normalize_mx_scale_layout. Private to this generation's providers: only this target's library
// compiles them (the directory is the registry; cmake/GenbridgeProviders.cmake stages
// ops/target_providers/<Target>/ for the selected target only). Every run_* validates all arguments
// first (InvalidArgument naming op, value and rule) and writes nothing unless they are all valid. Work is
// split over rows, so results never depend on the thread count.

#include <cstdint>
#include <cstring>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"

namespace genbridge::ops::detail {

Status run_dynamic_mx_quant(const TensorView& x, const MxQuantConfig& config, const TensorView& q,
                            const TensorView& scale);
Status run_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block_size, const TensorView& y);
Status run_normalize_mx_scale_layout(const TensorView& scale, const TensorView& out);

// e8m0 byte of a block whose amax has the fp32 bit pattern `amax_bits` (sign bit clear; NaN or inf
// patterns give 0xFF). `D` is an MX element dtype. Inline and specialised: it runs once per block.
template <DType D, MxScaleAlg A>
inline uint8_t mx_scale_code(uint32_t amax_bits, bool round_scale) {
  if (amax_bits >= 0x7f800000u) return 0xff;
  constexpr int kEmax = D == DType::kFp8E4M3FN ? 8 : (D == DType::kFp8E5M2 ? 15 : 2);
  // floor(log2(amax)) for a normal amax. Zero and fp32 subnormals give -127, and every convention
  // below then lands under -127 and clamps there, as the exact floor(log2) would.
  const int e = static_cast<int>(amax_bits >> 23) - 127;
  int s;
  if constexpr (A == MxScaleAlg::kOcpFloor) {
    s = e - kEmax;
  } else if constexpr (A == MxScaleAlg::kCeil) {
    // amax / 2^(e - emax) = 1.m_amax * 2^emax fits under max = 1.75 * 2^emax (both FP8 formats)
    // exactly when the mantissa bits do not exceed those of 1.75.
    s = e - kEmax + ((amax_bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  } else {
    constexpr float kInv = D == DType::kFp8E4M3FN ? 1.0f / 448.0f : (D == DType::kFp8E5M2 ? 1.0f / 57344.0f : 1.0f / 6.0f);
    float a;
    std::memcpy(&a, &amax_bits, sizeof a);
    const float p = (a > kMxBiasedExponentAmaxFloor ? a : kMxBiasedExponentAmaxFloor) * kInv;
    uint32_t pb;
    std::memcpy(&pb, &p, sizeof pb);
    s = static_cast<int>(pb >> 23) - 127 + (round_scale ? 1 : 0);
  }
  s = s < -127 ? -127 : (s > 127 ? 127 : s);
  return static_cast<uint8_t>(s + 127);
}

}  // namespace genbridge::ops::detail
