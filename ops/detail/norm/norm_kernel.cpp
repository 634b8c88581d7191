#include "ops/detail/norm/norm_kernel.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "core/parallel.h"
#include "core/vec.h"
#include "ops/detail/common/rows.h"

namespace genbridge::ops::detail {
namespace {

Status validate_impl(const NormCall& c) {
  const std::string op = c.op;
  GB_RETURN_IF_ERROR(check_float_input(c.op, "x", c.x));
  const int k = c.weight.rank();
  if (k < 1 || k > c.x.rank()) {
    return invalid_argument(op + ": " + c.weight_name + " has rank " + std::to_string(k) +
                            " but must have rank 1.." + std::to_string(c.x.rank()) + " (x's rank)");
  }
  GB_RETURN_IF_ERROR(check_host_data(c.op, c.weight_name, c.weight));
  if (c.weight.dtype() != c.x.dtype()) {
    return invalid_argument(op + ": " + c.weight_name + " has dtype " + std::string(dtype_name(c.weight.dtype())) +
                            " but must have x's dtype " + std::string(dtype_name(c.x.dtype())));
  }
  for (int i = 0; i < k; ++i) {
    if (c.weight.dim(i) != c.x.dim(c.x.rank() - k + i)) {
      std::string trailing = "[";
      for (int j = 0; j < k; ++j) trailing += (j ? ", " : "") + std::to_string(c.x.dim(c.x.rank() - k + j));
      return invalid_argument(op + ": " + c.weight_name + " has shape " + c.weight.shape_string() +
                              " but must match x's trailing shape " + trailing + "]");
    }
  }
  if (c.weight.numel() == 0) {
    return invalid_argument(op + ": " + c.weight_name +
                            " has 0 elements; the normalised dimensions must be non-empty");
  }
  if (!std::isfinite(c.eps) || c.eps < 0.f) {
    char eps_text[32];
    std::snprintf(eps_text, sizeof eps_text, "%g", static_cast<double>(c.eps));
    return invalid_argument(op + ": eps is " + eps_text + " but must be finite and >= 0");
  }
  if (c.residual) GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "residual", *c.residual, "x", c.x));
  GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "y", c.y, "x", c.x));
  if (c.residual_sum) GB_RETURN_IF_ERROR(check_same_shape_dtype(c.op, "residual_sum", *c.residual_sum, "x", c.x));
  if (c.rstd) {
    const TensorView& r = *c.rstd;
    if (r.dtype() != DType::kF32) {
      return invalid_argument(op + ": rstd has dtype " + std::string(dtype_name(r.dtype())) + " but must be fp32");
    }
    bool good = r.rank() == c.x.rank();
    std::string want = "[";
    for (int d = 0; d < c.x.rank(); ++d) {
      const int64_t n = d < c.x.rank() - k ? c.x.dim(d) : 1;
      want += (d ? ", " : "") + std::to_string(n);
      if (good && r.dim(d) != n) good = false;
    }
    want += "]";
    if (!good) {
      return invalid_argument(op + ": rstd has shape " + r.shape_string() + " but must be " + want +
                              " (x's leading shape with the normalised dimensions set to 1)");
    }
    GB_RETURN_IF_ERROR(check_host_data(c.op, "rstd", r));
  }
  return ok_status();
}

inline float sum_squares(const float* v, int64_t n) {
  vec::f32x16 a0{}, a1{};
  int64_t i = 0;
  for (; i + 2 * vec::kLanes <= n; i += 2 * vec::kLanes) {
    const vec::f32x16 p = vec::load(v + i), q = vec::load(v + i + vec::kLanes);
    a0 += p * p;
    a1 += q * q;
  }
  if (i + vec::kLanes <= n) {
    const vec::f32x16 p = vec::load(v + i);
    a0 += p * p;
    i += vec::kLanes;
  }
  float s = vec::reduce_add(a0 + a1);
  for (; i < n; ++i) s += v[i] * v[i];
  return s;
}

inline float rstd_of(float sumsq, int64_t cols, float eps) {
  return 1.0f / std::sqrt(sumsq / static_cast<float>(cols) + eps);
}

// Sum of squares of a contiguous row of T, widened in registers (no staging buffer).
template <typename T>
inline float sum_squares_row(const T* v, int64_t n) {
  vec::f32x16 a0{}, a1{}, a2{}, a3{};  // four chains hide the add latency; combined in a fixed order
  int64_t i = 0;
  for (; i + 4 * vec::kLanes <= n; i += 4 * vec::kLanes) {
    const vec::f32x16 p0 = vec::load(v + i), p1 = vec::load(v + i + vec::kLanes);
    const vec::f32x16 p2 = vec::load(v + i + 2 * vec::kLanes), p3 = vec::load(v + i + 3 * vec::kLanes);
    a0 += p0 * p0;
    a1 += p1 * p1;
    a2 += p2 * p2;
    a3 += p3 * p3;
  }
  for (; i + vec::kLanes <= n; i += vec::kLanes) {
    const vec::f32x16 p = vec::load(v + i);
    a0 += p * p;
  }
  float s = vec::reduce_add((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += to_f32(v[i]) * to_f32(v[i]);
  return s;
}

// Contiguous fast path for one element type: two passes over the (cache-resident) row.
template <typename T>
void norm_rows_contiguous(const NormCall& c, int k, int64_t cols, const float* w, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = c.x.data_as<const T>() + row_offset(c.x, k, r);
    if (c.residual) {
      // residual_sum = round(x + residual); the rounded sum is what gets normalised.
      const T* rr = c.residual->data_as<const T>() + row_offset(*c.residual, k, r);
      T* sr = c.residual_sum->data_as<T>() + row_offset(*c.residual_sum, k, r);
      int64_t i = 0;
      for (; i + vec::kLanes <= cols; i += vec::kLanes) vec::store(sr + i, vec::load(src + i) + vec::load(rr + i));
      for (; i < cols; ++i) sr[i] = from_f32<T>(to_f32(src[i]) + to_f32(rr[i]));
      src = sr;
    }
    const float rs = rstd_of(sum_squares_row(src, cols), cols, c.eps);
    if (c.rstd) c.rstd->data_as<float>()[row_offset(*c.rstd, k, r)] = rs;
    T* yr = c.y.data_as<T>() + row_offset(c.y, k, r);
    const vec::f32x16 vrs = vec::splat(rs);
    int64_t i = 0;
    for (; i + vec::kLanes <= cols; i += vec::kLanes) {
      vec::store(yr + i, (vec::load(src + i) * vrs) * vec::load(w + i));
    }
    for (; i < cols; ++i) yr[i] = from_f32<T>((to_f32(src[i]) * rs) * w[i]);
  }
}

// Any-stride path: same arithmetic, element access through offsets.
void norm_rows_strided(const NormCall& c, int k, int64_t cols, const float* w, int64_t r0, int64_t r1,
                       float* buf, float* tmp) {
  for (int64_t r = r0; r < r1; ++r) {
    load_row_f32(c.x, k, r, cols, buf);
    if (c.residual) {
      load_row_f32(*c.residual, k, r, cols, tmp);
      for (int64_t i = 0; i < cols; ++i) buf[i] = round_to_dtype(buf[i] + tmp[i], c.x.dtype());
      store_row_f32(*c.residual_sum, k, r, cols, buf);
    }
    const float rs = rstd_of(sum_squares(buf, cols), cols, c.eps);
    if (c.rstd) c.rstd->data_as<float>()[row_offset(*c.rstd, k, r)] = rs;
    for (int64_t i = 0; i < cols; ++i) tmp[i] = (buf[i] * rs) * w[i];
    store_row_f32(c.y, k, r, cols, tmp);
  }
}

}  // namespace

Status validate_norm(const NormCall& c) { return validate_impl(c); }

Status run_norm(const NormCall& c) {
  GB_RETURN_IF_ERROR(validate_impl(c));
  const int k = c.weight.rank();
  const int64_t cols = c.weight.numel();
  const int64_t rows = c.x.numel() / cols;
  if (rows == 0) return ok_status();

  std::vector<float> w(static_cast<size_t>(cols));
  load_row_f32(c.weight, k, 0, cols, w.data());
  if (c.form == WeightForm::kOnePlusInFp32) {
    for (float& v : w) v = 1.0f + v;
  }

  bool contiguous = trailing_contiguous(c.x, k) && trailing_contiguous(c.y, k);
  if (c.residual) contiguous = contiguous && trailing_contiguous(*c.residual, k) && trailing_contiguous(*c.residual_sum, k);

  genbridge::detail::parallel_for(rows, cols, [&](int64_t r0, int64_t r1) {
    if (contiguous) {
      with_float_dtype(c.x.dtype(), [&](auto tag) {
        norm_rows_contiguous<decltype(tag)>(c, k, cols, w.data(), r0, r1);
      });
    } else {
      std::vector<float> buf(static_cast<size_t>(cols)), tmp(static_cast<size_t>(cols));
      norm_rows_strided(c, k, cols, w.data(), r0, r1, buf.data(), tmp.data());
    }
  });
  return ok_status();
}

TensorView offset_weight_rounded(const TensorView& w, std::vector<uint32_t>& storage) {
  const int64_t n = w.numel();
  storage.assign(static_cast<size_t>((n * static_cast<int64_t>(dtype_size(w.dtype())) + 3) / 4), 0u);
  std::vector<float> v(static_cast<size_t>(n));
  load_row_f32(w, w.rank(), 0, n, v.data());
  for (float& x : v) x = 1.0f + x;
  TensorView out(storage.data(), w.dtype(), w.shape(), w.rank(), w.device());
  store_row_f32(out, out.rank(), 0, n, v.data());
  return out;
}

}  // namespace genbridge::ops::detail
