// linear/quant_linear's MX schemes on this generation (contract: mx_linear_kernel.h).
#include "ops/target_providers/Ascend950/linear/mx_linear_kernel.h"

#include <algorithm>

#include "genbridge/core/formats.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "ops/common/linear/dot_kernel.h"
#include "ops/common/linear/quant_linear_kernel.h"
#include "ops/common/tensor/rows.h"
#include "ops/target_providers/Ascend950/linear/mx_dot_kernel.h"
#include "ops/target_providers/Ascend950/quant/mx_kernel.h"

namespace genbridge::ops::detail {

void run_mx_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t M, int64_t N, int64_t K) {
  const bool direct = x.dtype() == DType::kF32 && (x.is_contiguous() || (x.rank() == 2 && x.stride(1) == 1));
  const float* xp = direct ? x.data_as<const float>() : nullptr;
  const int64_t ldx = direct && x.rank() == 2 ? x.stride(0) : K;
  const bool fp4 = w.scheme == WeightQuantScheme::kMxfp4;
  const MxGemvFn gemv = mx_gemv_fn(fp4);  // dispatched once per call
  const GemmChunksFn gemm = gemm_chunks_fn();
  const WeightChunkFn chunk = mx_chunk_fn(fp4);
  const int64_t fused_max_rows = mx_fused_max_rows(fp4);
  const int64_t mb = rows_per_item(M);
  const int64_t row_blocks = (M + mb - 1) / mb;
  const int64_t nc = cols_per_item(N, row_blocks, num_threads());
  const int64_t col_chunks = (N + nc - 1) / nc;
  parallel_items(row_blocks * col_chunks, M * N * K, [&](int64_t item) {
    const int64_t r0 = item / col_chunks * mb, c0 = item % col_chunks * nc;
    const int64_t m = std::min(M, r0 + mb) - r0, n = std::min(N, c0 + nc) - c0;
    const float* a = xp + r0 * ldx;
    int64_t lda = ldx;
    if (!direct) {
      float* buf = static_cast<float*>(thread_scratch<0>(static_cast<size_t>(m * K) * sizeof(float)));
      for (int64_t r = 0; r < m; ++r) load_row_f32(x, 1, r0 + r, K, buf + r * K);
      a = buf;
      lda = K;
    }
    float* vals = static_cast<float*>(thread_scratch<1>(static_cast<size_t>(m * n) * sizeof(float)));
    if (m <= fused_max_rows) {  // decode fused into the GEMV, rows in chunks of at most kMxGemvMaxRows
      const uint8_t* q = w.data.data_as<const uint8_t>() + c0 * w.data.stride(0);
      const uint8_t* sc = w.scale.data_as<const uint8_t>() + c0 * w.scale.stride(0);
      for (int64_t i = 0; i < m; i += kMxGemvMaxRows) {
        gemv(a + i * lda, lda, std::min(kMxGemvMaxRows, m - i), q, w.data.stride(0), sc, w.scale.stride(0), n, K,
             vals + i * n, n);
      }
      store_y_block(y, r0, m, c0, n, vals, n);
      return;
    }
    // GEMM: the weight panels are decoded straight into the GEMM's packed layout.
    const MxWeightRows rows{w.data.data_as<const uint8_t>() + c0 * w.data.stride(0), w.data.stride(0),
                            w.scale.data_as<const uint8_t>() + c0 * w.scale.stride(0), w.scale.stride(0)};
    gemm(a, lda, m, chunk, &rows, n, K, vals, n);
    store_y_block(y, r0, m, c0, n, vals, n);
  });
}

Status run_mx_quantize_weight(const TensorView& w, const QuantWeight& out) {
  MxQuantConfig c;
  c.block_size = kMxWeightBlock;
  if (out.scheme == WeightQuantScheme::kMxfp8) {
    c.dst = DType::kFp8E4M3FN;
    c.scale_alg = MxScaleAlg::kCeil;
  } else {
    c.dst = DType::kFp4E2M1x2;
    c.scale_alg = MxScaleAlg::kOcpFloor;
  }
  return run_dynamic_mx_quant(w, c, out.data, out.scale);
}

}  // namespace genbridge::ops::detail
