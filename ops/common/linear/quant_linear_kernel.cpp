// linear/quant_linear's shared parts: argument checks and the W8A8 scheme (see quant_linear_kernel.h).
#include "ops/common/linear/quant_linear_kernel.h"

#include <string>
#include <vector>

#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"  // kDynamicQuantPerTokenDefaultEps
#include "ops/common/linear/dot_kernel.h"
#include "ops/common/linear/int8_dot_kernel.h"
#include "ops/common/quant/quant_kernel.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops::detail {
namespace {

constexpr const char* kOp = "quant_linear";

Status check_weight_views(const char* op, const QuantWeight& w, int64_t N, int64_t K) {
  switch (w.scheme) {
    case WeightQuantScheme::kNone:
      return invalid_argument(std::string(op) + ": scheme none has no quantized representation (use linear)");
    case WeightQuantScheme::kW8A8:
      GB_RETURN_IF_ERROR(check_dtype(op, "weight data", w.data, DType::kI8));
      GB_RETURN_IF_ERROR(check_shape(op, "weight data", w.data, {N, K}, "([N, K] int8)"));
      GB_RETURN_IF_ERROR(check_unit_last_stride(op, "weight data", w.data));
      GB_RETURN_IF_ERROR(check_dtype(op, "weight scale", w.scale, DType::kF32));
      GB_RETURN_IF_ERROR(check_shape(op, "weight scale", w.scale, {N}, "([N] fp32, one per output channel)"));
      if (K > kW8A8MaxK) {
        return invalid_argument(std::string(op) + ": K = " + std::to_string(K) + " exceeds " +
                                std::to_string(kW8A8MaxK) + " for w8a8 (the int32 accumulation must be exact)");
      }
      return ok_status();
    case WeightQuantScheme::kMxfp8:
    case WeightQuantScheme::kMxfp4: {
      const bool fp4 = w.scheme == WeightQuantScheme::kMxfp4;
      GB_RETURN_IF_ERROR(check_dtype(op, "weight data", w.data, fp4 ? DType::kFp4E2M1x2 : DType::kFp8E4M3FN));
      if (fp4 && K % 2 != 0) {
        return invalid_argument(std::string(op) + ": K = " + std::to_string(K) +
                                " is odd but mxfp4 packs two values per byte");
      }
      GB_RETURN_IF_ERROR(check_shape(op, "weight data", w.data, {N, fp4 ? K / 2 : K},
                                     fp4 ? "([N, K / 2] fp4_e2m1x2)" : "([N, K] fp8_e4m3fn)"));
      GB_RETURN_IF_ERROR(check_unit_last_stride(op, "weight data", w.data));
      GB_RETURN_IF_ERROR(check_dtype(op, "weight scale", w.scale, DType::kE8M0));
      GB_RETURN_IF_ERROR(check_shape(op, "weight scale", w.scale, {N, mx_scale_pairs(K, kMxWeightBlock), 2},
                                     "(the MX pair layout [N, ceil(ceil(K / 32) / 2), 2])"));
      if (w.scale.stride(2) != 1 || w.scale.stride(1) != 2) {
        return invalid_argument(
            std::string(op) +
            ": weight scale's pairs are not contiguous (strides along its last two dimensions must be 2 "
            "and 1: the pair layout is read in place)");
      }
      return ok_status();
    }
  }
  return invalid_argument(std::string(op) + ": unknown weight scheme");
}

}  // namespace

Status check_quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t& M, int64_t& N,
                          int64_t& K) {
  GB_RETURN_IF_ERROR(check_float_tensor(kOp, "x", x));
  if (x.rank() < 1) return invalid_argument("quant_linear: x has rank 0 but must have rank >= 1 ([..., K])");
  K = x.dim(-1);
  if (w.in_features != K) {
    return invalid_argument("quant_linear: the weight has " + std::to_string(w.in_features) +
                            " input features but x's last dimension is " + std::to_string(K));
  }
  if (w.data.rank() != 2) {
    return invalid_argument("quant_linear: weight data has shape " + w.data.shape_string() + " but must have rank 2");
  }
  N = w.data.dim(0);
  GB_RETURN_IF_ERROR(check_weight_views(kOp, w, N, K));
  GB_RETURN_IF_ERROR(check_float_tensor(kOp, "y", y));
  std::vector<int64_t> want = shape_of(x);
  want.back() = N;
  GB_RETURN_IF_ERROR(check_shape(kOp, "y", y, want, "(x's leading shape + [N])"));
  GB_RETURN_IF_ERROR(check_no_overlap(kOp, "y", y, "x", x));
  GB_RETURN_IF_ERROR(check_no_overlap(kOp, "y", y, "weight data", w.data));
  GB_RETURN_IF_ERROR(check_no_overlap(kOp, "y", y, "weight scale", w.scale));
  M = 1;
  for (int d = 0; d + 1 < x.rank(); ++d) M *= x.dim(d);
  return ok_status();
}

Status check_quantize_weight(const TensorView& w, const QuantWeight& out, int64_t& N, int64_t& K) {
  GB_RETURN_IF_ERROR(check_float_tensor("quantize_weight", "w", w));
  GB_RETURN_IF_ERROR(check_rank("quantize_weight", "w", w, 2, "([N, K])"));
  GB_RETURN_IF_ERROR(check_unit_last_stride("quantize_weight", "w", w));
  N = w.dim(0);
  K = w.dim(1);
  if (out.in_features != K) {
    return invalid_argument("quantize_weight: out.in_features is " + std::to_string(out.in_features) +
                            " but w has K = " + std::to_string(K));
  }
  return check_weight_views("quantize_weight", out, N, K);
}

void store_zero_rows(const TensorView& y, int64_t M, int64_t N) {
  std::vector<float> row(static_cast<size_t>(N), 0.f);
  for (int64_t r = 0; r < M; ++r) store_row_f32(y, 1, r, N, row.data());
}

void store_y_block(const TensorView& y, int64_t r0, int64_t m, int64_t c0, int64_t n, const float* vals, int64_t ldv) {
  const int64_t yc = y.stride(-1);
  with_float_dtype(y.dtype(), [&](auto yt) {
    using YT = decltype(yt);
    YT* yp = y.data_as<YT>();
    for (int64_t i = 0; i < m; ++i) {
      YT* row = yp + row_offset(y, 1, r0 + i);
      for (int64_t j = 0; j < n; ++j) row[(c0 + j) * yc] = from_f32<YT>(vals[i * ldv + j]);
    }
  });
}

void w8a8_quantize_rows(const TensorView& x, int8_t* qx, float* sx) {
  // The op's contract names dynamic_quant_per_token.
  std::vector<int64_t> shape = shape_of(x);
  std::vector<int64_t> lead(shape.begin(), shape.end() - 1);
  const Status s = run_dynamic_quant_per_token(x, kDynamicQuantPerTokenDefaultEps,
                                               TensorView(qx, DType::kI8, shape.data(), static_cast<int>(shape.size())),
                                               TensorView(sx, DType::kF32, lead.data(), static_cast<int>(lead.size())));
  GB_CHECK(s.ok(), "quant_linear: dynamic_quant_per_token failed on checked arguments");
}

void run_w8a8_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t M, int64_t N, int64_t K) {
  std::vector<int8_t> qx(static_cast<size_t>(M * K));
  std::vector<float> sx(static_cast<size_t>(M));
  w8a8_quantize_rows(x, qx.data(), sx.data());
  std::vector<float> sw(static_cast<size_t>(N));
  load_row_f32(w.scale, 1, 0, N, sw.data());
  const int8_t* wp = w.data.data_as<const int8_t>();
  const int64_t ldw = w.data.stride(0);
  const Int8DotRowsFn dot = int8_dot_rows_fn();
  const int64_t mb = std::min(M, kW8A8ItemRows);
  const int64_t row_blocks = (M + mb - 1) / mb;
  // Batch 1..4 (weight-bandwidth bound): one contiguous share of the weight rows per thread, so that each
  // streams (and prefetches) one long run of memory; more rows: items that fit in L2.
  const int64_t threads = num_threads();
  const int64_t nc =
      M <= 4 ? std::max<int64_t>(kPanelCols, ((N + threads - 1) / threads + kPanelCols - 1) / kPanelCols * kPanelCols)
             : std::min(cols_per_item(N, row_blocks, static_cast<int>(threads)), kW8A8ItemCols);
  const int64_t col_chunks = (N + nc - 1) / nc;
  parallel_items(row_blocks * col_chunks, M * N * K / 4, [&](int64_t item) {
    const int64_t r0 = item / col_chunks * mb, c0 = item % col_chunks * nc;
    const int64_t m = std::min(M, r0 + mb) - r0, n = std::min(N, c0 + nc) - c0;
    int32_t* acc = static_cast<int32_t*>(thread_scratch<1>(static_cast<size_t>(m * n) * sizeof(int32_t)));
    float* out = static_cast<float*>(thread_scratch<2>(static_cast<size_t>(m * n) * sizeof(float)));
    dot(qx.data() + r0 * K, K, m, wp + c0 * ldw, ldw, n, K, acc, n);
    for (int64_t i = 0; i < m; ++i) {
      const float s = sx[static_cast<size_t>(r0 + i)];
      for (int64_t j = 0; j < n; ++j) out[i * n + j] = w8a8_scale(acc[i * n + j], s, sw[static_cast<size_t>(c0 + j)]);
    }
    store_y_block(y, r0, m, c0, n, out, n);
  });
}

Status run_w8a8_quantize_weight(const TensorView& w, const QuantWeight& out) {
  return run_dynamic_quant_per_token(w, kDynamicQuantPerTokenDefaultEps, out.data, out.scale);
}

Status quant_scheme_unimplemented(const char* op, WeightQuantScheme s, const char* generation, const char* offers) {
  return unimplemented(std::string(op) + ": " + std::string(weight_quant_scheme_name(s)) +
                       " weights are not supported on " + generation +
                       ": the generation has no data path for them (it runs " + offers + ")");
}

namespace {

bool is_mx(WeightQuantScheme s) { return s == WeightQuantScheme::kMxfp8 || s == WeightQuantScheme::kMxfp4; }

}  // namespace

Status run_quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, const MxSchemes& mx) {
  if (is_mx(w.scheme) && mx.linear == nullptr) {
    return quant_scheme_unimplemented("quant_linear", w.scheme, mx.generation, mx.offers);
  }
  int64_t M = 0, N = 0, K = 0;
  GB_RETURN_IF_ERROR(check_quant_linear(x, w, y, M, N, K));
  if (M == 0 || N == 0) return ok_status();
  if (K == 0) {
    store_zero_rows(y, M, N);
    return ok_status();
  }
  if (w.scheme == WeightQuantScheme::kW8A8) {
    run_w8a8_linear(x, w, y, M, N, K);
  } else {
    mx.linear(x, w, y, M, N, K);
  }
  return ok_status();
}

Status run_quantize_weight(const TensorView& w, const QuantWeight& out, const MxSchemes& mx) {
  if (is_mx(out.scheme) && mx.quantize_weight == nullptr) {
    return quant_scheme_unimplemented("quantize_weight", out.scheme, mx.generation, mx.offers);
  }
  int64_t N = 0, K = 0;
  GB_RETURN_IF_ERROR(check_quantize_weight(w, out, N, K));
  if (out.scheme == WeightQuantScheme::kW8A8) return run_w8a8_quantize_weight(w, out);
  return mx.quantize_weight(w, out);
}

}  // namespace genbridge::ops::detail
