// attention/kv_compress (kv_compress.h), compiled once per CPU target with Highway: each output channel is
// one lane, so every target computes the same IEEE operations per element.
#ifndef GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_
#define GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_

#include "genbridge/ops/attention/kv_compress.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/threading.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail::kv_compress {

struct Call {
  const TensorView* kv;
  const TensorView* gate;
  const float* ape;
  int64_t ratio, D, dp;  // dp: D rounded up to 16
  bool overlap, has_previous;
  const TensorView* out;
};

}  // namespace genbridge::ops::detail::kv_compress
#endif  // GENBRIDGE_OPS_ATTENTION_KV_COMPRESS_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/kv_compress.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/attention/vec_math-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();
namespace {
using kv_compress::Call;

// Columns [c0, c0 + D) of row r of a rank-2 float tensor as fp32, zero-padded to dp.
void LoadHalf(const TensorView& t, int64_t r, int64_t c0, int64_t D, int64_t dp, float* dst) {
  const int64_t cols = t.dim(1);
  thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(cols)) row.resize(static_cast<size_t>(cols));
  load_row_f32(t, 1, r, cols, row.data());
  std::memcpy(dst, row.data() + c0, static_cast<size_t>(D) * sizeof(float));
  for (int64_t i = D; i < dp; ++i) dst[i] = 0.f;
}

// Output window k. Scratch: 2 ratio slots of (v, z) rows of dp floats, and one output row.
void CompressWindow(const Call& c, int64_t k, float* scratch) {
  const int64_t m = c.ratio, D = c.D, dp = c.dp;
  float* v = scratch;                  // [2m][dp]
  float* z = v + 2 * m * dp;           // [2m][dp]
  float* res = z + 2 * m * dp;         // [dp]
  float* bias = res + dp;              // [dp]
  int64_t n = 0;
  auto add_slot = [&](int64_t row, int64_t c0, const float* ape_row) {
    LoadHalf(*c.kv, row, c0, D, dp, v + n * dp);
    LoadHalf(*c.gate, row, c0, D, dp, z + n * dp);
    std::memcpy(bias, ape_row, static_cast<size_t>(D) * sizeof(float));
    for (int64_t i = D; i < dp; ++i) bias[i] = 0.f;
    for (int64_t i = 0; i < dp; i += kLanes) Store16(z + n * dp + i, Load16(z + n * dp + i) + Load16(bias + i));
    ++n;
  };
  const int64_t width = (c.overlap ? 2 : 1) * D;
  if (!c.overlap) {
    for (int64_t i = 0; i < m; ++i) add_slot(k * m + i, 0, c.ape + i * width);
  } else {
    const int64_t b = (k + 1) * m;
    if (k > 0 || c.has_previous) {
      for (int64_t i = 0; i < m; ++i) add_slot(b - m + i, 0, c.ape + i * width);
    }
    for (int64_t i = 0; i < m; ++i) add_slot(b + i, D, c.ape + i * width + D);
  }
  for (int64_t d = 0; d < dp; d += kLanes) {
    V16 mx = Load16(z + d);
    for (int64_t j = 1; j < n; ++j) mx = MaxGt16(mx, Load16(z + j * dp + d));
    V16 sum = Set16(0.f), acc = Set16(0.f);
    for (int64_t j = 0; j < n; ++j) {
      const V16 p = ExpNonpositive16(Load16(z + j * dp + d) - mx);
      sum = sum + p;
      acc = Fma16(p, Load16(v + j * dp + d), acc);
    }
    Store16(res + d, acc / sum);
  }
  store_row_f32(*c.out, 1, k, D, res);
}

}  // namespace
GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(CompressWindow);

Status run_kv_compress(const TensorView& kv, const TensorView& gate, const TensorView& ape, int64_t ratio, bool overlap,
                       bool has_previous, const TensorView& out) {
  const char* op = "kv_compress";
  if (ratio < 1) return invalid_argument(s(op) + ": ratio is " + n(ratio) + " but must be >= 1");
  GB_RETURN_IF_ERROR(check_float_input(op, "kv", kv));
  GB_RETURN_IF_ERROR(check_same_shape_dtype(op, "gate", gate, "kv", kv));
  const int64_t coff = overlap ? 2 : 1;
  if (kv.rank() != 2 || kv.dim(1) < coff || kv.dim(1) % coff != 0) {
    return invalid_argument(s(op) + ": kv has shape " + kv.shape_string() + " but must be [rows, " +
                            (overlap ? "2 * D" : "D") + "] with D >= 1");
  }
  const int64_t D = kv.dim(1) / coff, rows = kv.dim(0);
  const int64_t lead = overlap ? ratio : 0;
  if (rows < lead || rows % ratio != 0) {
    return invalid_argument(s(op) + ": kv has " + n(rows) + " rows but must hold whole windows of " + n(ratio) +
                            " tokens" + (overlap ? ", the first one the previous window's" : ""));
  }
  const int64_t windows = (rows - lead) / ratio;
  if (ape.dtype() != DType::kF32 || ape.rank() != 2 || ape.dim(0) != ratio || ape.dim(1) != coff * D ||
      !ape.is_contiguous()) {
    return invalid_argument(s(op) + ": ape has dtype " + s(dtype_name(ape.dtype())) + " and shape " +
                            ape.shape_string() + " but must be contiguous fp32 [" + n(ratio) + ", " + n(coff * D) + "]");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "ape", ape));
  if (out.dtype() != DType::kF32 && out.dtype() != DType::kBF16) {
    return invalid_argument(s(op) + ": out has dtype " + s(dtype_name(out.dtype())) + " but must be fp32 or bf16");
  }
  if (out.rank() != 2 || out.dim(0) != windows || out.dim(1) != D) {
    return invalid_argument(s(op) + ": out has shape " + out.shape_string() + " but must be [" + n(windows) + ", " +
                            n(D) + "] (complete windows, D)");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "out", out));
  if (windows == 0) return ok_status();
  const int64_t dp = (D + 15) / 16 * 16;
  const kv_compress::Call call{&kv, &gate, ape.data_as<const float>(), ratio, D, dp, overlap, has_previous,
                                       &out};
  const size_t floats = static_cast<size_t>(4 * ratio * dp + 2 * dp);
  auto scratch = [&]() -> float* {
    thread_local std::vector<float> buf;
    if (buf.size() < floats) buf.resize(floats);
    return buf.data();
  };
  const auto fn = GB_DISPATCH(CompressWindow);
  if (windows * ratio * D < (int64_t{1} << 16) || num_threads() <= 1) {
    float* buf = scratch();
    for (int64_t k = 0; k < windows; ++k) fn(call, k, buf);
    return ok_status();
  }
  genbridge::detail::parallel_for_dynamic(windows, [&](int64_t k) { fn(call, k, scratch()); });
  return ok_status();
}

}  // namespace detail

Status kv_compress(const TensorView& kv, const TensorView& gate, const TensorView& ape, int64_t ratio, bool overlap,
                   bool has_previous, const TensorView& out) {
  return detail::run_kv_compress(kv, gate, ape, ratio, overlap, has_previous, out);
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
