#include "ops/common/quant/quant_kernel.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/quant/quant_checks.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail {
using namespace quant_checks;  // NOLINT: the quant ops' argument checks
}  // namespace genbridge::ops::detail

// ---- per CPU target: one row's int8 codes and scale (every target gives the same bits) ----
#define HWY_TARGET_INCLUDE "ops/common/quant/quant_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "core/simd/formats8-inl.h"
#include "ops/common/quant/absmax-inl.h"
#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// EncodeInt8_16 + StoreBytes16 in fewer instructions (the row loop is bound by its instruction count, not
// by memory or the divider): the clamp as Min / Max (a NaN lane's clamped value is discarded by the final
// mask, so the codes are EncodeInt8_16's on every target), and on two-part targets (AVX2) the two halves'
// codes packed together with saturating packs (exact: every code is in [-127, 127]) and one 16-byte store.
HWY_INLINE void EncodeStoreInt8_16(int8_t* q, V16 t) {
  const DU du;
  const DI di;
  const VF hi = hn::Set(DF(), 127.f), lo = hn::Set(DF(), -127.f), magic = hn::Set(DF(), 12582912.f);
  VI codes[kParts];
  GB_UNROLL for (int i = 0; i < kParts; ++i) {
    const VF c = hn::Min(hn::Max(t.p[i], lo), hi);
    // 1.5 * 2^23: the adder rounds |c| <= 127 to an integer, ties to even; the difference is the code.
    const VI v = hn::Sub(hn::BitCast(di, hn::Add(c, magic)), hn::Set(di, 0x4b400000));
    codes[i] = hn::IfThenElseZero(hn::RebindMask(di, hn::Eq(t.p[i], t.p[i])), v);
  }
#if HWY_TARGET == HWY_AVX2
  static_assert(kParts == 2 && kPart == 8, "AVX2 runs a V16 as two 8-lane halves");
  const hn::Full256<int16_t> d16;
  const hn::Full128<int8_t> d8;
  // packs: 16-bit [a0..3 b0..3 | a4..7 b4..7], then bytes in that order; the shuffle restores a0..7 b0..7.
  const auto w = hn::ReorderDemote2To(d16, codes[0], codes[1]);
  const auto b = hn::DemoteTo(d8, w);
  alignas(16) static constexpr int8_t kOrder[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
  hn::StoreU(hn::TableLookupBytes(b, hn::Load(d8, kOrder)), d8, q);
#else
  U16 u;
  GB_UNROLL for (int i = 0; i < kParts; ++i) u.p[i] = hn::BitCast(du, codes[i]);
  StoreBytes16(q, u);
#endif
}

// scale = max(amax, eps) / 127 (NaN when x holds a NaN); q[i] = int8(fl32(x[i] / scale)).
// `next` (the next row, or x itself) is prefetched during the encoding pass, so its memory reads overlap
// this row's arithmetic instead of following it.
template <typename T>
HWY_INLINE void Int8QuantRowT(const T* x, const T* next, int64_t k, float eps, int8_t* q, float* scale) {
  const uint32_t ab = AbsMaxBits(x, k);
  const float s = ab > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN()
                                   : std::max(std::bit_cast<float>(ab), eps) / 127.f;
  *scale = s;
  const V16 d = Set16(s);
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    __builtin_prefetch(next + i);
    EncodeStoreInt8_16(q + i, Load16(x + i) / d);
  }
  if (i < k) StoreBytesTail16(q + i, EncodeInt8_16(LoadTail16(x + i, k - i) / d), k - i);
}

void Int8QuantRow(DType d, const void* x, const void* next, int64_t k, float eps, int8_t* q, float* scale) {
  switch (d) {
    case DType::kF32:
      Int8QuantRowT(static_cast<const float*>(x), static_cast<const float*>(next), k, eps, q, scale);
      return;
    case DType::kF16:
      Int8QuantRowT(static_cast<const fp16_t*>(x), static_cast<const fp16_t*>(next), k, eps, q, scale);
      return;
    default:
      Int8QuantRowT(static_cast<const bf16_t*>(x), static_cast<const bf16_t*>(next), k, eps, q, scale);
      return;
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(Int8QuantRow);

Status run_dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale) {
  const char* op = "dynamic_quant_per_token";
  GB_RETURN_IF_ERROR(check_float_input(op, "x", x));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "x", x));
  if (!std::isfinite(eps) || !(eps > 0.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(eps));
    return invalid_argument(std::string(op) + ": eps is " + text + " but must be finite and > 0");
  }
  GB_RETURN_IF_ERROR(check_dtype(op, "q", q, DType::kI8));
  GB_RETURN_IF_ERROR(check_shape(op, "q", q, leading_plus(x, 0, {}), "x's shape"));
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kF32));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(x, 1, {}), "x's shape without its last dimension"));
  GB_RETURN_IF_ERROR(check_host_data(op, "scale", scale));

  const int64_t k = x.dim(-1);
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  if (rows == 0) {
    // K = 0 with rows: every row is all-zero (empty), so scale = eps / 127 and there is no q to write.
    const int64_t n = scale.numel();
    for (int64_t r = 0; r < n; ++r) scale.data_as<float>()[row_offset(scale, 0, r)] = eps / 127.f;
    return ok_status();
  }
  const bool x_fast = x.stride(-1) == 1, q_fast = q.stride(-1) == 1;
  auto* quant_row = &GB_DISPATCH(Int8QuantRow);  // the CPU target is chosen once per call
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(x_fast ? 0 : static_cast<size_t>(k));
    std::vector<int8_t> qbuf(q_fast ? 0 : static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      int8_t* qr = q_fast ? q.data_as<int8_t>() + row_offset(q, 1, r) : qbuf.data();
      float* sr = scale.data_as<float>() + row_offset(scale, 0, r);
      if (x_fast) {
        const auto* base = static_cast<const uint8_t*>(x.data());
        const int64_t elem = static_cast<int64_t>(dtype_size(x.dtype()));
        const uint8_t* xr = base + row_offset(x, 1, r) * elem;
        const uint8_t* next = r + 1 < r1 ? base + row_offset(x, 1, r + 1) * elem : xr;
        quant_row(x.dtype(), xr, next, k, eps, qr, sr);
      } else {
        load_row_f32(x, 1, r, k, xbuf.data());
        quant_row(DType::kF32, xbuf.data(), xbuf.data(), k, eps, qr, sr);
      }
      if (!q_fast) {
        int8_t* base = q.data_as<int8_t>() + row_offset(q, 1, r);
        for (int64_t i = 0; i < k; ++i) base[i * q.stride(-1)] = qbuf[static_cast<size_t>(i)];
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
