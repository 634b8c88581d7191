// attention/rope. The rotation of each row is compiled once per CPU target (Highway, dispatched once per
// call); the angles' cos/sin are the C library's, computed once per (token, pair) as before.
#ifndef GENBRIDGE_OPS_COMMON_ATTENTION_ROPE_SHARED_
#define GENBRIDGE_OPS_COMMON_ATTENTION_ROPE_SHARED_
#include "genbridge/ops/attention/rope.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/tensor/rows.h"
#endif  // GENBRIDGE_OPS_COMMON_ATTENTION_ROPE_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::HWY_NAMESPACE {
using namespace ::genbridge::simd::HWY_NAMESPACE;

// NeoX rotation of one row x[0, 2 * half): (x1, x2) = (x[i], x[i + half]) becomes
// (x1 * cos - x2 * sin, x2 * cos + x1 * sin), each product rounded, then the sum.
void RopeRotateRow(const float* HWY_RESTRICT cos_a, const float* HWY_RESTRICT sin_a, float* HWY_RESTRICT x,
                   int64_t half) {
  int64_t i = 0;
  for (; i + kLanes <= half; i += kLanes) {
    const V16 x1 = Load16(x + i), x2 = Load16(x + half + i), c = Load16(cos_a + i), s = Load16(sin_a + i);
    Store16(x + i, x1 * c - x2 * s);
    Store16(x + half + i, x2 * c + x1 * s);
  }
  for (; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_a[i] - x2 * sin_a[i];
    x[i + half] = x2 * cos_a[i] + x1 * sin_a[i];
  }
}

}  // namespace genbridge::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops {
HWY_EXPORT(RopeRotateRow);
namespace {

constexpr const char* kOp = "rope";

std::string s(std::string_view v) { return std::string(v); }

int64_t position_at(const TensorView& p, int64_t t) {
  return p.dtype() == DType::kI32 ? p.data_as<const int32_t>()[t * p.stride(0)]
                                  : p.data_as<const int64_t>()[t * p.stride(0)];
}

Status check_heads(const char* name, const char* heads, const TensorView& t) {
  GB_RETURN_IF_ERROR(detail::check_float_input(kOp, name, t));
  if (t.rank() != 3) {
    return invalid_argument(s(kOp) + ": " + name + " has shape " + t.shape_string() +
                            " but must have rank 3 [num_tokens, " + heads + ", head_dim]");
  }
  return ok_status();
}

}  // namespace

// fp32 inverse frequencies of the pairs, as computed once per call.
static void inverse_frequencies(float theta, int64_t d, std::vector<float>& inv_freq) {
  inv_freq.resize(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(static_cast<double>(theta), 2.0 * i / static_cast<double>(d)));
  }
}

Status rope(const TensorView& positions, const TensorView& query, const TensorView& key, float rope_theta) {
  if (positions.dtype() != DType::kI32 && positions.dtype() != DType::kI64) {
    return invalid_argument(s(kOp) + ": positions has dtype " + s(dtype_name(positions.dtype())) +
                            " but must be int32 or int64");
  }
  if (positions.rank() != 1) {
    return invalid_argument(s(kOp) + ": positions has shape " + positions.shape_string() + " but must be [num_tokens]");
  }
  GB_RETURN_IF_ERROR(detail::check_host_data(kOp, "positions", positions));
  GB_RETURN_IF_ERROR(check_heads("query", "num_heads", query));
  GB_RETURN_IF_ERROR(check_heads("key", "num_kv_heads", key));
  const int64_t num_tokens = positions.dim(0), d = query.dim(2);
  if (query.dim(0) != num_tokens || key.dim(0) != num_tokens) {
    return invalid_argument(s(kOp) + ": query has shape " + query.shape_string() + " and key has shape " +
                            key.shape_string() + " but both must have positions' " + std::to_string(num_tokens) +
                            " tokens");
  }
  if (key.dim(2) != d) {
    return invalid_argument(s(kOp) + ": key has head_dim " + std::to_string(key.dim(2)) + " but query has head_dim " +
                            std::to_string(d));
  }
  if (d % 2 != 0) {
    return invalid_argument(s(kOp) + ": head_dim " + std::to_string(d) +
                            " is odd but must be even (NeoX rotates the pairs (i, i + head_dim/2))");
  }
  if (!(std::isfinite(rope_theta) && rope_theta > 1.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(rope_theta));
    return invalid_argument(s(kOp) + ": rope_theta is " + text + " but must be finite and > 1");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (position_at(positions, t) < 0) {
      return invalid_argument(s(kOp) + ": positions[" + std::to_string(t) +
                              "] = " + std::to_string(position_at(positions, t)) + " but positions must be >= 0");
    }
  }
  if (num_tokens == 0 || d == 0) return ok_status();

  thread_local std::vector<float> inv_freq;  // buffers grow once per thread: steady-state calls do not allocate
  inverse_frequencies(rope_theta, d, inv_freq);
  const float* freq = inv_freq.data();  // the caller's buffer; worker threads must not name the thread_local
  const int64_t half = d / 2;
  const int64_t heads = query.dim(1) + key.dim(1);
  const auto rotate = GB_DISPATCH(RopeRotateRow);  // the CPU target's row kernel, chosen once per call
  ::genbridge::detail::parallel_for(num_tokens, heads * d * 4 + half * 40, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> cos_a, sin_a, x;
    cos_a.resize(static_cast<size_t>(half));
    sin_a.resize(static_cast<size_t>(half));
    x.resize(static_cast<size_t>(d));
    for (int64_t t = t0; t < t1; ++t) {
      const float p = static_cast<float>(position_at(positions, t));
      for (int64_t i = 0; i < half; ++i) {
        const float a = p * freq[i];
        cos_a[i] = std::cos(a);
        sin_a[i] = std::sin(a);
      }
      for (const TensorView* tv : {&query, &key}) {
        for (int64_t h = 0; h < tv->dim(1); ++h) {
          const int64_t row = t * tv->dim(1) + h;
          detail::load_row_f32(*tv, 1, row, d, x.data());
          rotate(cos_a.data(), sin_a.data(), x.data(), half);
          detail::store_row_f32(*tv, 1, row, d, x.data());
        }
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
