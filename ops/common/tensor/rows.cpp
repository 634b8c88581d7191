#include "ops/common/tensor/rows.h"

#include <cmath>
#include <string>

#include "core/simd/dispatch.h"

#ifndef GENBRIDGE_ROWS_ONCE_
#define GENBRIDGE_ROWS_ONCE_
namespace genbridge::ops::detail {

int64_t row_offset(const TensorView& t, int k, int64_t r) {
  int64_t off = 0;
  for (int d = t.rank() - k - 1; d >= 0; --d) {
    const int64_t n = t.dim(d);
    off += (r % n) * t.stride(d);
    r /= n;
  }
  return off;
}

bool trailing_contiguous(const TensorView& t, int k) {
  int64_t s = 1;
  for (int d = t.rank() - 1; d >= t.rank() - k; --d) {
    if (t.dim(d) != 1 && t.stride(d) != s) return false;
    s *= t.dim(d);
  }
  return true;
}

int64_t col_offset(const TensorView& t, int k, int64_t c) {
  int64_t off = 0;
  for (int d = t.rank() - 1; d >= t.rank() - k; --d) {
    const int64_t n = t.dim(d);
    off += (c % n) * t.stride(d);
    c /= n;
  }
  return off;
}

}  // namespace genbridge::ops::detail
#endif  // GENBRIDGE_ROWS_ONCE_

// ---- per CPU target: contiguous row conversions (exact widening; RNE narrowing as the scalar codecs) ----
#define HWY_TARGET_INCLUDE "ops/common/tensor/rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();

void LoadRowF32(DType d, const void* src, int64_t n, float* out) { LoadRowF32Contiguous(d, src, n, out); }
void StoreRowF32(DType d, void* dst, int64_t n, const float* in) { StoreRowF32Contiguous(d, dst, n, in); }

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(LoadRowF32);
HWY_EXPORT(StoreRowF32);

void load_row_f32(const TensorView& t, int k, int64_t r, int64_t cols, float* out) {
  with_float_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* base = t.data_as<const T>() + row_offset(t, k, r);
    if (trailing_contiguous(t, k)) {
      GB_DISPATCH(LoadRowF32)(t.dtype(), base, cols, out);
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c] = to_f32(base[col_offset(t, k, c)]);
    }
  });
}

void store_row_f32(const TensorView& t, int k, int64_t r, int64_t cols, const float* in) {
  with_float_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* base = t.data_as<T>() + row_offset(t, k, r);
    if (trailing_contiguous(t, k)) {
      GB_DISPATCH(StoreRowF32)(t.dtype(), base, cols, in);
    } else {
      for (int64_t c = 0; c < cols; ++c) base[col_offset(t, k, c)] = from_f32<T>(in[c]);
    }
  });
}

float round_to_dtype(float v, DType d) {
  switch (d) {
    case DType::kF16: return fp16_to_float(float_to_fp16(v));
    case DType::kBF16: return bf16_to_float(float_to_bf16(v));
    default: return v;
  }
}

Status check_host_data(const char* op, const char* name, const TensorView& t) {
  if (t.device().kind != DeviceKind::kHost) {
    return invalid_argument(std::string(op) + ": " + name + " is not in host memory; this provider runs on the host");
  }
  if (t.data() == nullptr && t.numel() > 0) {
    return invalid_argument(std::string(op) + ": " + name + " has a null data pointer but " +
                            std::to_string(t.numel()) + " elements");
  }
  for (int d = 0; d < t.rank(); ++d) {
    if (t.dim(d) < 0 || t.stride(d) < 0) {
      return invalid_argument(std::string(op) + ": " + name + " has shape " + t.shape_string() +
                              " with a negative size or stride; sizes and strides must be >= 0");
    }
  }
  return ok_status();
}

Status check_float_input(const char* op, const char* name, const TensorView& t) {
  const DType d = t.dtype();
  if (d != DType::kF32 && d != DType::kF16 && d != DType::kBF16) {
    return invalid_argument(std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(d)) +
                            " but must be fp32, fp16 or bf16");
  }
  return check_host_data(op, name, t);
}

Status check_same_shape_dtype(const char* op, const char* name, const TensorView& t, const char* ref_name,
                              const TensorView& ref) {
  if (t.dtype() != ref.dtype()) {
    return invalid_argument(std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())) +
                            " but must have " + ref_name + "'s dtype " + std::string(dtype_name(ref.dtype())));
  }
  bool same = t.rank() == ref.rank();
  for (int d = 0; same && d < t.rank(); ++d) same = t.dim(d) == ref.dim(d);
  if (!same) {
    return invalid_argument(std::string(op) + ": " + name + " has shape " + t.shape_string() + " but must have " +
                            ref_name + "'s shape " + ref.shape_string());
  }
  return check_host_data(op, name, t);
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
