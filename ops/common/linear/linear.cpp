// linear/linear, one implementation for every target: the host dot kernel in ops/common/linear/dot_kernel.h
// (GEMV below 8 rows, packed GEMM from 8; the same bits either way).
#include "genbridge/ops/linear/linear.h"

#include <string>
#include <vector>

#include "ops/common/linear/dot_kernel.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "linear";

Status validate(const TensorView& x, const TensorView& w, const TensorView& y, const TensorView* bias,
                const PackedWeights* packed) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "x", x));
  if (x.rank() < 1) return invalid_argument("linear: x has rank 0 but must have rank >= 1 ([..., K])");
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "w", w));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "w", w, 2, "([N, K])"));
  const int64_t K = x.dim(-1), N = w.dim(0);
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "w", w, {N, K}, "([N, K] with K = x's last dimension)"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "w", w));
  if (bias) {
    GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "bias", *bias));
    GB_RETURN_IF_ERROR(detail::check_shape(kOp, "bias", *bias, {N}, "([N] with N = w's first dimension)"));
  }
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "y", y));
  std::vector<int64_t> want = detail::shape_of(x);
  want.back() = N;
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, want, "(x's leading shape + [N])"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "x", x));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "w", w));
  if (bias) GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "bias", *bias));
  if (packed) {
    if (w.dtype() != DType::kBF16) {
      return invalid_argument("linear: packed is given but w is " + std::string(dtype_name(w.dtype())) +
                              "; only bf16 weights are packed");
    }
    if (packed->rows() != N || packed->cols() != K) {
      return invalid_argument("linear: packed holds [" + std::to_string(packed->rows()) + ", " +
                              std::to_string(packed->cols()) + "] but w is [" + std::to_string(N) + ", " +
                              std::to_string(K) + "]");
    }
  }
  return ok_status();
}

template <typename WT, typename YT>
void run(const TensorView& x, const TensorView& w, const PackedWeights* packed, const TensorView& y,
         const std::vector<float>& bias, int64_t M, int64_t N, int64_t K) {
  // fp32 rows at a uniform stride are read in place; anything else is widened to fp32 per row block.
  const bool direct = x.dtype() == DType::kF32 && (x.is_contiguous() || (x.rank() == 2 && x.stride(1) == 1));
  const float* xp = direct ? x.data_as<const float>() : nullptr;
  const int64_t ldx = direct && x.rank() == 2 ? x.stride(0) : K;
  const WT* wp = w.data_as<const WT>();
  const int64_t ldw = w.stride(0);
  std::vector<int64_t> y_row(static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) y_row[r] = detail::row_offset(y, 1, r);
  const int64_t y_col = y.stride(-1);
  YT* yp = y.data_as<YT>();
  const float* b = bias.empty() ? nullptr : bias.data();
  const detail::DotRowsFn dot = detail::dot_rows_fn(w.dtype());
  const detail::DotPackedFn dot_packed = detail::dot_packed_fn();
  const size_t panel_words = detail::packed_bf16_words(detail::kPackedCols, K);

  const int64_t mb = detail::rows_per_item(M);
  const int64_t row_blocks = (M + mb - 1) / mb;
  const int64_t nc = detail::cols_per_item(N, row_blocks, num_threads());
  const int64_t col_chunks = (N + nc - 1) / nc;
  detail::parallel_items(row_blocks * col_chunks, M * N * K, [&](int64_t item) {
    const int64_t r0 = item / col_chunks * mb, c0 = item % col_chunks * nc;
    const int64_t r1 = std::min(M, r0 + mb), c1 = std::min(N, c0 + nc);
    const float* a = xp + r0 * ldx;
    int64_t lda = ldx;
    if (!direct) {
      float* buf = static_cast<float*>(detail::thread_scratch<0>(static_cast<size_t>((r1 - r0) * K) * sizeof(float)));
      for (int64_t r = r0; r < r1; ++r) detail::load_row_f32(x, 1, r, K, buf + (r - r0) * K);
      a = buf;
      lda = K;
    }
    const int64_t m = r1 - r0, n = c1 - c0;
    float* vals = static_cast<float*>(detail::thread_scratch<1>(static_cast<size_t>(m * n) * sizeof(float)));
    if (packed) {
      dot_packed(a, lda, m, packed->words() + c0 / detail::kPackedCols * panel_words, n, K, vals, n);
    } else {
      dot(a, lda, m, wp + c0 * ldw, ldw, n, K, vals, n);
    }
    for (int64_t i = 0; i < m; ++i) {
      YT* row = yp + y_row[r0 + i];
      const float* v = vals + i * n;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t c = c0 + j;
        float o = v[j];
        if (b) o = o + b[c];
        row[c * y_col] = detail::from_f32<YT>(o);
      }
    }
  });
}

}  // namespace

Status linear(const TensorView& x, const TensorView& w, const TensorView& y, const TensorView* bias,
              const PackedWeights* packed) {
  GB_RETURN_IF_ERROR(validate(x, w, y, bias, packed));
  const int64_t K = x.dim(-1), N = w.dim(0);
  int64_t M = 1;
  for (int d = 0; d + 1 < x.rank(); ++d) M *= x.dim(d);
  if (M == 0 || N == 0) return ok_status();

  std::vector<float> b;
  if (bias) {
    b.resize(static_cast<size_t>(N));
    detail::load_row_f32(*bias, 1, 0, N, b.data());
  }
  if (K == 0) {  // empty reduction: y = 0 (+ bias)
    std::vector<float> row(static_cast<size_t>(N), 0.f);
    if (bias) row = b;
    for (int64_t r = 0; r < M; ++r) detail::store_row_f32(y, 1, r, N, row.data());
    return ok_status();
  }

  detail::with_float_dtype(w.dtype(), [&](auto wt) {
    detail::with_float_dtype(y.dtype(), [&](auto yt) { run<decltype(wt), decltype(yt)>(x, w, packed, y, b, M, N, K); });
  });
  return ok_status();
}

}  // namespace genbridge::ops
