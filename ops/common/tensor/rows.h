#pragma once
// Internal: row access for ops that reduce over the trailing k dimensions of a strided tensor.
// A "row" is one index into the leading (rank - k) dimensions; its `cols` elements are the trailing ones.

#include <cstdint>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// Element offset of row `r` (row-major over the leading rank - k dims).
int64_t row_offset(const TensorView& t, int k, int64_t r);
// True when the trailing k dims of `t` are laid out contiguously.
bool trailing_contiguous(const TensorView& t, int k);
// Element offset of column c within a row (trailing k dims, row-major).
int64_t col_offset(const TensorView& t, int k, int64_t c);

// Converts one row to fp32. `t` must be fp32, fp16 or bf16.
void load_row_f32(const TensorView& t, int k, int64_t r, int64_t cols, float* out);
// Rounds one fp32 row (RNE) into `t`'s dtype.
void store_row_f32(const TensorView& t, int k, int64_t r, int64_t cols, const float* in);

// Calls fn(T{}) with T = float, fp16_t or bf16_t for the given float dtype.
template <typename Fn>
void with_float_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::kF32: fn(float{}); return;
    case DType::kF16: fn(fp16_t{}); return;
    case DType::kBF16: fn(bf16_t{}); return;
    default: GB_CHECK(false, "with_float_dtype: not a float dtype (validate before dispatching)");
  }
}

inline float to_f32(float v) { return v; }
inline float to_f32(fp16_t v) { return fp16_to_float(v); }
inline float to_f32(bf16_t v) { return bf16_to_float(v); }
template <typename T>
T from_f32(float v);
template <>
inline float from_f32<float>(float v) { return v; }
template <>
inline fp16_t from_f32<fp16_t>(float v) { return float_to_fp16(v); }
template <>
inline bf16_t from_f32<bf16_t>(float v) { return float_to_bf16(v); }

// Rounds v to dtype d and back (d is fp32, fp16 or bf16).
float round_to_dtype(float v, DType d);

// Shared argument checks; each returns InvalidArgument naming `op`, the value and the rule.
Status check_float_input(const char* op, const char* name, const TensorView& t);
Status check_same_shape_dtype(const char* op, const char* name, const TensorView& t, const char* ref_name,
                              const TensorView& ref);
Status check_host_data(const char* op, const char* name, const TensorView& t);

}  // namespace genbridge::ops::detail
