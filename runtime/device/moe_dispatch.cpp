#include "runtime/device/moe_dispatch.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "genbridge/ops/quant/mx_dequant.h"

namespace genbridge::runtime {
namespace {

int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }

int64_t scale_bytes(const DispatchRepresentation& r, int64_t hidden) {
  if (r.activations == ActivationQuant::kMxfp8) return ops::mx_scale_pairs(hidden, r.block) * 2;
  return static_cast<int64_t>(dtype_size(r.scale_dtype));
}

}  // namespace

int64_t dispatch_scale_offset(int64_t hidden) { return round_up4(hidden); }

int64_t dispatch_row_bytes(const DispatchRepresentation& r, int64_t hidden) {
  return round_up4(dispatch_scale_offset(hidden) + scale_bytes(r, hidden));
}

Result<DispatchViews> dispatch_views(const DispatchRepresentation& r, const TensorView& rows, int64_t hidden) {
  if (r.activations != ActivationQuant::kPerTokenInt8 && r.activations != ActivationQuant::kMxfp8) {
    return invalid_argument("moe dispatch: the representation has no quantized activations (activations = none)");
  }
  const int64_t row = dispatch_row_bytes(r, hidden);
  if (rows.dtype() != DType::kU8 || rows.rank() != 2 || rows.dim(1) != row ||
      (rows.dim(0) > 1 && rows.stride(0) != row) || (rows.dim(0) > 0 && rows.stride(1) != 1)) {
    return invalid_argument(
        fmt::format("moe dispatch: rows must be uint8 [T, {}] (rows of {} elements, back to back), got {} {}", row,
                    hidden, dtype_name(rows.dtype()), rows.shape_string()));
  }
  const int64_t T = rows.dim(0);
  if (T > 0 && reinterpret_cast<uintptr_t>(rows.data()) % 4 != 0) {
    return invalid_argument("moe dispatch: rows must start at a multiple of 4 bytes (the scales are read in place)");
  }
  auto* base = static_cast<std::byte*>(rows.data());
  std::byte* scales = base == nullptr ? nullptr : base + dispatch_scale_offset(hidden);
  DispatchViews v;
  v.codes = TensorView::strided(base, r.element, {T, hidden}, {row, 1});
  if (r.activations == ActivationQuant::kPerTokenInt8) {
    v.scales = TensorView::strided(scales, DType::kF32, {T}, {row / 4});
  } else {
    const int64_t pairs = ops::mx_scale_pairs(hidden, r.block);
    v.scales = TensorView::strided(scales, DType::kE8M0, {T, pairs, 2}, {row, 2, 1});
  }
  return v;
}

Status quantize_dispatch(const DispatchRepresentation& r, const TensorView& x, const TensorView& rows) {
  if (x.rank() != 2 || x.dim(0) != rows.dim(0)) {
    return invalid_argument(fmt::format("moe dispatch: x has shape {} but rows have {}; x must be [T, H]",
                                        x.shape_string(), rows.shape_string()));
  }
  const int64_t T = x.dim(0), H = x.dim(1);
  GB_ASSIGN_OR_RETURN(const DispatchViews v, dispatch_views(r, rows, H));
  if (r.activations == ActivationQuant::kPerTokenInt8) {
    GB_RETURN_IF_ERROR(ops::dynamic_quant_per_token(x, ops::kDynamicQuantPerTokenDefaultEps, v.codes, v.scales));
  } else {
    const ops::MxQuantConfig mx{.block_size = r.block, .dst = r.element, .scale_alg = ops::MxScaleAlg::kCeil};
    GB_RETURN_IF_ERROR(ops::dynamic_mx_quant(x, mx, v.codes, v.scales));
  }
  // The padding travels with the rows: zero, so that a row's bytes depend on its values only.
  const int64_t row = dispatch_row_bytes(r, H), off = dispatch_scale_offset(H), end = off + scale_bytes(r, H);
  auto* base = static_cast<std::byte*>(rows.data());
  for (int64_t t = 0; t < T && (off > H || end < row); ++t) {
    std::memset(base + t * row + H, 0, static_cast<size_t>(off - H));
    std::memset(base + t * row + end, 0, static_cast<size_t>(row - end));
  }
  return ok_status();
}

Status dequantize_dispatch(const DispatchRepresentation& r, const TensorView& rows, const TensorView& y) {
  if (y.dtype() != DType::kF32 || y.rank() != 2 || y.dim(0) != rows.dim(0)) {
    return invalid_argument(
        fmt::format("moe dispatch: y must be fp32 [{}, H] (one row per row of the dispatch), got {} {}", rows.dim(0),
                    dtype_name(y.dtype()), y.shape_string()));
  }
  const int64_t T = y.dim(0), H = y.dim(1);
  GB_ASSIGN_OR_RETURN(const DispatchViews v, dispatch_views(r, rows, H));
  if (r.activations == ActivationQuant::kMxfp8) return ops::mx_dequant(v.codes, v.scales, r.block, y);
  const int64_t row = v.codes.stride(0);
  for (int64_t t = 0; t < T; ++t) {
    const int8_t* q = v.codes.data_as<const int8_t>() + t * row;
    const float s = v.scales.data_as<const float>()[t * v.scales.stride(0)];
    float* out = y.data_as<float>() + t * y.stride(0);
    for (int64_t c = 0; c < H; ++c) out[c * y.stride(1)] = static_cast<float>(q[c]) * s;
  }
  return ok_status();
}

}  // namespace genbridge::runtime
