#include "ops/target_providers/Ascend950/quant/mx_kernel.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/quant/quant_checks.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail {
using namespace quant_checks;  // NOLINT: the quant ops' argument checks
}  // namespace genbridge::ops::detail

#ifndef GENBRIDGE_MX_KERNEL_ONCE_
#define GENBRIDGE_MX_KERNEL_ONCE_
namespace genbridge::ops::detail {
namespace {

Status check_block_size(const char* op, int64_t block) {
  if (block >= 32 && block <= 1024 && block % 32 == 0) return ok_status();
  return invalid_argument(std::string(op) + ": block_size is " + std::to_string(block) +
                          " but must be a multiple of 32 in [32, 1024]");
}

bool is_mx_dtype(DType d) { return d == DType::kFp8E4M3FN || d == DType::kFp8E5M2 || d == DType::kFp4E2M1x2; }

std::string pair_rule(int64_t k, int64_t block) {
  return "leading shape + [ceil(ceil(K / block_size) / 2), 2] for K = " + std::to_string(k) +
         ", block_size = " + std::to_string(block);
}

Status validate_mx_quant(const TensorView& x, const MxQuantConfig& c, const TensorView& q, const TensorView& scale) {
  const char* op = "dynamic_mx_quant";
  const std::string ops = op;
  GB_RETURN_IF_ERROR(check_float_input(op, "x", x));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "x", x));
  GB_RETURN_IF_ERROR(check_block_size(op, c.block_size));
  if (!is_mx_dtype(c.dst)) {
    return invalid_argument(ops + ": dst is " + std::string(dtype_name(c.dst)) +
                            " but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2");
  }
  const int alg = static_cast<int>(c.scale_alg);
  if (alg < 0 || alg > 2) {
    return invalid_argument(ops + ": scale_alg is " + std::to_string(alg) +
                            " but must be 0 (OCP floor), 1 (ceil) or 2 (biased exponent)");
  }
  if (c.scale_alg == MxScaleAlg::kCeil && c.dst == DType::kFp4E2M1x2) {
    return invalid_argument(ops + ": scale_alg is 1 (ceil) but dst is fp4_e2m1x2; the ceil convention is defined "
                            "for FP8 destinations only");
  }
  if (c.round_scale && c.scale_alg != MxScaleAlg::kBiasedExponent) {
    return invalid_argument(ops + ": round_scale is set but scale_alg is " + std::to_string(alg) +
                            "; round_scale applies to scale_alg 2 (biased exponent) only");
  }
  const int64_t k = x.dim(-1);
  const bool fp4 = c.dst == DType::kFp4E2M1x2;
  if (fp4 && k % 2) {
    return invalid_argument(ops + ": x's last dimension is " + std::to_string(k) +
                            " but must be even for fp4_e2m1x2 (two values per byte)");
  }
  GB_RETURN_IF_ERROR(check_dtype(op, "q", q, c.dst, "config.dst"));
  GB_RETURN_IF_ERROR(check_shape(op, "q", q, leading_plus(x, 1, {fp4 ? k / 2 : k}),
                                 fp4 ? "x's shape with the last dimension halved: two fp4 values per byte"
                                     : "x's shape"));
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(x, 1, {mx_scale_pairs(k, c.block_size), 2}),
                                 "x's " + pair_rule(k, c.block_size)));
  return check_host_data(op, "scale", scale);
}

// Scale bytes of row r: 2 * pairs bytes at (j / 2) * stride(-2) + (j % 2) * stride(-1).
bool pair_layout_contiguous(const TensorView& s) { return s.stride(-1) == 1 && (s.dim(-2) <= 1 || s.stride(-2) == 2); }

void scatter_pairs(const TensorView& s, int64_t r, const uint8_t* bytes, int64_t pairs) {
  uint8_t* base = s.data_as<uint8_t>() + row_offset(s, 2, r);
  for (int64_t j = 0; j < 2 * pairs; ++j) base[(j / 2) * s.stride(-2) + (j % 2) * s.stride(-1)] = bytes[j];
}

// ---------------------------------------------------------------------------------------------------
// mx_dequant

Status validate_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block, const TensorView& y) {
  const char* op = "mx_dequant";
  if (!is_mx_dtype(q.dtype())) {
    return invalid_argument(std::string(op) + ": q has dtype " + std::string(dtype_name(q.dtype())) +
                            " but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "q", q));
  GB_RETURN_IF_ERROR(check_block_size(op, block));
  GB_RETURN_IF_ERROR(check_float_input(op, "y", y));
  const bool fp4 = q.dtype() == DType::kFp4E2M1x2;
  const int64_t k = fp4 ? 2 * q.dim(-1) : q.dim(-1);
  GB_RETURN_IF_ERROR(check_shape(op, "y", y, leading_plus(q, 1, {k}),
                                 fp4 ? "q's shape with the last dimension doubled: two fp4 values per byte"
                                     : "q's shape"));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(q, 1, {mx_scale_pairs(k, block), 2}),
                                 "q's " + pair_rule(k, block)));
  return check_host_data(op, "scale", scale);
}

// ---------------------------------------------------------------------------------------------------
// normalize_mx_scale_layout

Status validate_normalize(const TensorView& scale, const TensorView& out) {
  const char* op = "normalize_mx_scale_layout";
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  if (scale.rank() != 2) {
    return invalid_argument(std::string(op) + ": scale has rank " + std::to_string(scale.rank()) +
                            " but must have rank 2 ([M, N], one byte per 32-element block)");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "scale", scale));
  GB_RETURN_IF_ERROR(check_dtype(op, "out", out, DType::kE8M0));
  const int64_t n = scale.dim(1);
  GB_RETURN_IF_ERROR(check_shape(op, "out", out, {scale.dim(0), (n + 1) / 2, 2},
                                 "[M, ceil(N / 2), 2] for scale [M, N] = " + scale.shape_string()));
  return check_host_data(op, "out", out);
}

// 2^(127 - code) for an e8m0 code in [0, 254]: the multiplier that divides by the block scale.
inline float inverse_scale(uint8_t code) {
  if (code == 254) return std::bit_cast<float>(0x00400000u);  // 2^-127, an fp32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(254 - code) << 23);
}

}  // namespace
}  // namespace genbridge::ops::detail
#endif  // GENBRIDGE_MX_KERNEL_ONCE_

// ---- per CPU target: one row's scales and codes (every target gives the same bits) ----
#define HWY_TARGET_INCLUDE "ops/target_providers/Ascend950/quant/mx_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "core/simd/formats8-inl.h"
#include "ops/common/quant/absmax-inl.h"
#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// mx_scale_code on 16 lanes of amax bit patterns (same rules; see the scalar version in mx_kernel.h).
template <DType D, MxScaleAlg A>
HWY_INLINE U16 MxScaleCodes16(U16 ab, bool round_scale) {
  constexpr int kEmax = D == DType::kFp8E4M3FN ? 8 : (D == DType::kFp8E5M2 ? 15 : 2);
  const DU du;
  const DI di;
  U16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VU a = ab.p[i];
    VI code;  // s + 127 before clamping
    if constexpr (A == MxScaleAlg::kOcpFloor) {
      code = hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(a)), hn::Set(di, kEmax));
    } else if constexpr (A == MxScaleAlg::kCeil) {
      const auto up = hn::RebindMask(di, hn::Gt(hn::BitCast(di, hn::And(a, hn::Set(du, 0x7fffffu))),
                                                hn::Set(di, 0x600000)));
      code = hn::Add(hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(a)), hn::Set(di, kEmax)),
                     hn::IfThenElseZero(up, hn::Set(di, 1)));
    } else {
      constexpr float kInv =
          D == DType::kFp8E4M3FN ? 1.0f / 448.0f : (D == DType::kFp8E5M2 ? 1.0f / 57344.0f : 1.0f / 6.0f);
      const VF f = hn::BitCast(DF(), a), lo = hn::Set(DF(), kMxBiasedExponentAmaxFloor);
      const VF p = hn::Mul(hn::IfThenElse(hn::Gt(f, lo), f, lo), hn::Set(DF(), kInv));
      code = hn::Add(hn::BitCast(di, hn::ShiftRight<23>(hn::BitCast(du, p))), hn::Set(di, round_scale ? 1 : 0));
    }
    code = hn::Min(hn::Max(code, hn::Zero(di)), hn::Set(di, 254));
    const auto special = hn::RebindMask(du, hn::Gt(hn::BitCast(di, a), hn::Set(di, 0x7f7fffff)));
    r.p[i] = hn::IfThenElse(special, hn::Set(du, 0xffu), hn::BitCast(du, code));
  }
  return r;
}

template <DType D>
HWY_INLINE U16 MxEncodeFinite16(V16 v) {
  if constexpr (D == DType::kFp8E4M3FN) return EncodeFp8E4M3FNFinite16(v);
  if constexpr (D == DType::kFp8E5M2) return EncodeFp8E5M2Finite16(v);
  if constexpr (D == DType::kFp4E2M1x2) return EncodeFp4E2M1Finite16(v);
}

// Encodes n finite values (x / 2^s = x * mul) into q: 16 at a time, then the tail. q receives n codes
// (fp4: n / 2 bytes, n even).
// `pf` (the same offset in the next row) is prefetched as the block is encoded.
template <typename T, DType D>
HWY_INLINE void MxEncode(const T* x, const T* pf, int64_t n, float mul, uint8_t* q) {
  const V16 m = Set16(mul);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __builtin_prefetch(pf + i);
    const U16 codes = MxEncodeFinite16<D>(Load16(x + i) * m);
    if constexpr (D == DType::kFp4E2M1x2) {
      StoreNibblePairs16(q + i / 2, codes);
    } else {
      StoreBytes16(q + i, codes);
    }
  }
  if (i < n) {
    const U16 codes = MxEncodeFinite16<D>(LoadTail16(x + i, n - i) * m);
    if constexpr (D == DType::kFp4E2M1x2) {
      StoreNibblePairsTail16(q + i / 2, codes, n - i);
    } else {
      StoreBytesTail16(q + i, codes, n - i);
    }
  }
}

// One row: q receives K codes (fp4: K / 2 bytes), s receives 2 * pairs scale bytes. Two passes: every
// block's scale first (16 blocks' scale rule at a time), then every block's codes; the second pass
// prefetches `next` (the next row, or x itself), so its memory reads overlap this row's arithmetic.
template <typename T, DType D, MxScaleAlg A>
void MxQuantRowT(const T* x, const T* next, int64_t k, int64_t block, bool round_scale, uint8_t* q, uint8_t* s) {
  constexpr bool kFp4 = D == DType::kFp4E2M1x2;
  constexpr uint8_t kNaN = D == DType::kFp8E4M3FN ? 0x7f : (D == DType::kFp8E5M2 ? 0x7e : 0x00);
  const int64_t nb = mx_num_blocks(k, block), full = k / block;
  int64_t b0 = 0;
  for (; b0 + kLanes <= full; b0 += kLanes) {
    alignas(64) uint32_t amax[kLanes];
    for (int j = 0; j < kLanes; ++j) amax[j] = AbsMaxBits(x + (b0 + j) * block, block);
    StoreBytes16(s + b0, MxScaleCodes16<D, A>(LoadU16(amax), round_scale));
  }
  for (int64_t b = b0; b < full; ++b) s[b] = mx_scale_code<D, A>(AbsMaxBits(x + b * block, block), round_scale);
  if (full < nb) s[full] = mx_scale_code<D, A>(AbsMaxBits(x + full * block, k - full * block), round_scale);
  if (nb % 2) s[nb] = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t code = s[b];
    const int64_t lo = b * block, n = std::min(block, k - lo);
    uint8_t* qb = q + (kFp4 ? lo / 2 : lo);
    if (code == 0xff) {
      std::memset(qb, kNaN, static_cast<size_t>(kFp4 ? n / 2 : n));
    } else {
      MxEncode<T, D>(x + lo, next + lo, n, inverse_scale(code), qb);
    }
  }
}

template <typename T, DType D>
HWY_INLINE void MxQuantRowAlg(MxScaleAlg a, const T* x, const T* next, int64_t k, int64_t block, bool round_scale, uint8_t* q,
                              uint8_t* s) {
  switch (a) {
    case MxScaleAlg::kOcpFloor: MxQuantRowT<T, D, MxScaleAlg::kOcpFloor>(x, next, k, block, round_scale, q, s); return;
    case MxScaleAlg::kCeil: MxQuantRowT<T, D, MxScaleAlg::kCeil>(x, next, k, block, round_scale, q, s); return;
    default: MxQuantRowT<T, D, MxScaleAlg::kBiasedExponent>(x, next, k, block, round_scale, q, s); return;
  }
}

template <typename T>
HWY_INLINE void MxQuantRowDst(DType dst, MxScaleAlg a, const T* x, const T* next, int64_t k, int64_t block, bool round_scale,
                              uint8_t* q, uint8_t* s) {
  switch (dst) {
    case DType::kFp8E4M3FN: MxQuantRowAlg<T, DType::kFp8E4M3FN>(a, x, next, k, block, round_scale, q, s); return;
    case DType::kFp8E5M2: MxQuantRowAlg<T, DType::kFp8E5M2>(a, x, next, k, block, round_scale, q, s); return;
    default: MxQuantRowAlg<T, DType::kFp4E2M1x2>(a, x, next, k, block, round_scale, q, s); return;
  }
}

// One contiguous row of x (dtype `in`), validated arguments.
void MxQuantRows(DType in, DType dst, MxScaleAlg a, const void* x, const void* next, int64_t k, int64_t block,
                 bool round_scale, uint8_t* q, uint8_t* s) {
  switch (in) {
    case DType::kF32:
      MxQuantRowDst(dst, a, static_cast<const float*>(x), static_cast<const float*>(next), k, block, round_scale, q, s);
      return;
    case DType::kF16:
      MxQuantRowDst(dst, a, static_cast<const fp16_t*>(x), static_cast<const fp16_t*>(next), k, block, round_scale, q,
                    s);
      return;
    default:
      MxQuantRowDst(dst, a, static_cast<const bf16_t*>(x), static_cast<const bf16_t*>(next), k, block, round_scale, q,
                    s);
      return;
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(MxQuantRows);

Status run_dynamic_mx_quant(const TensorView& x, const MxQuantConfig& c, const TensorView& q, const TensorView& scale) {
  GB_RETURN_IF_ERROR(validate_mx_quant(x, c, q, scale));
  const int64_t k = x.dim(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(k, 1);
  if (rows == 0 || k == 0) return ok_status();  // nothing to write: no blocks, no elements
  const bool fp4 = c.dst == DType::kFp4E2M1x2;
  const int64_t q_bytes = fp4 ? k / 2 : k, pairs = mx_scale_pairs(k, c.block_size);
  const bool x_fast = x.stride(-1) == 1, q_fast = q.stride(-1) == 1 || q_bytes <= 1,
             s_fast = pair_layout_contiguous(scale);
  auto* quant_rows = &GB_DISPATCH(MxQuantRows);  // the CPU target is chosen once per call
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(x_fast ? 0 : static_cast<size_t>(k));
    std::vector<uint8_t> qbuf(q_fast ? 0 : static_cast<size_t>(q_bytes));
    std::vector<uint8_t> sbuf(s_fast ? 0 : static_cast<size_t>(2 * pairs));
    const size_t elem = dtype_size(x.dtype());
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* qr = q_fast ? q.data_as<uint8_t>() + row_offset(q, 1, r) : qbuf.data();
      uint8_t* sr = s_fast ? scale.data_as<uint8_t>() + row_offset(scale, 2, r) : sbuf.data();
      if (x_fast) {
        const auto* base = static_cast<const uint8_t*>(x.data());
        const uint8_t* xr = base + row_offset(x, 1, r) * static_cast<int64_t>(elem);
        const uint8_t* next = r + 1 < r1 ? base + row_offset(x, 1, r + 1) * static_cast<int64_t>(elem) : xr;
        quant_rows(x.dtype(), c.dst, c.scale_alg, xr, next, k, c.block_size, c.round_scale, qr, sr);
      } else {
        load_row_f32(x, 1, r, k, xbuf.data());
        quant_rows(DType::kF32, c.dst, c.scale_alg, xbuf.data(), xbuf.data(), k, c.block_size, c.round_scale, qr, sr);
      }
      if (!q_fast) {
        uint8_t* base = q.data_as<uint8_t>() + row_offset(q, 1, r);
        for (int64_t i = 0; i < q_bytes; ++i) base[i * q.stride(-1)] = qbuf[static_cast<size_t>(i)];
      }
      if (!s_fast) scatter_pairs(scale, r, sbuf.data(), pairs);
    }
  });
  return ok_status();
}

Status run_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block, const TensorView& y) {
  GB_RETURN_IF_ERROR(validate_mx_dequant(q, scale, block, y));
  const int64_t k = y.dim(-1), q_bytes = q.dim(-1);
  const int64_t rows = y.numel() / std::max<int64_t>(k, 1);
  if (rows == 0 || k == 0) return ok_status();
  const int64_t nb = mx_num_blocks(k, block);
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> ybuf(static_cast<size_t>(k));
    std::vector<uint8_t> qbuf(static_cast<size_t>(q_bytes));
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* qr = q.data_as<const uint8_t>() + row_offset(q, 1, r);
      if (q.stride(-1) != 1) {
        for (int64_t i = 0; i < q_bytes; ++i) qbuf[static_cast<size_t>(i)] = qr[i * q.stride(-1)];
        qr = qbuf.data();
      }
      const uint8_t* sr = scale.data_as<const uint8_t>() + row_offset(scale, 2, r);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * block, n = std::min(block, k - lo);
        const float mul = e8m0_to_float(e8m0_t{sr[(b / 2) * scale.stride(-2) + (b % 2) * scale.stride(-1)]});
        float* out = ybuf.data() + lo;
        switch (q.dtype()) {
          case DType::kFp8E4M3FN:
            fp8_e4m3fn_to_float_n(reinterpret_cast<const fp8_e4m3fn_t*>(qr + lo), mul, out, static_cast<size_t>(n));
            break;
          case DType::kFp8E5M2:
            fp8_e5m2_to_float_n(reinterpret_cast<const fp8_e5m2_t*>(qr + lo), mul, out, static_cast<size_t>(n));
            break;
          default: fp4_e2m1x2_to_float_n(qr + lo / 2, mul, out, static_cast<size_t>(n)); break;
        }
      }
      store_row_f32(y, 1, r, k, ybuf.data());
    }
  });
  return ok_status();
}

Status run_normalize_mx_scale_layout(const TensorView& scale, const TensorView& out) {
  GB_RETURN_IF_ERROR(validate_normalize(scale, out));
  const int64_t m = scale.dim(0), n = scale.dim(1), pairs = (n + 1) / 2;
  const uint8_t* src = scale.data_as<const uint8_t>();
  uint8_t* dst = out.data_as<uint8_t>();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < 2 * pairs; ++j) {
      const uint8_t v = j < n ? src[r * scale.stride(0) + j * scale.stride(1)] : uint8_t{0};
      dst[r * out.stride(0) + (j / 2) * out.stride(1) + (j % 2) * out.stride(2)] = v;
    }
  }
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
