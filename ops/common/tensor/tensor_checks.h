#pragma once
// Internal: argument checks shared by the linear and MoE operators. Each returns InvalidArgument with
// a sentence naming the op, the argument, the offending value and the rule.

#include <cstdint>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// "[2, 3, 4]"
std::string shape_text(const std::vector<int64_t>& shape);
// The shape of `t` as a vector.
std::vector<int64_t> shape_of(const TensorView& t);

// `t` is fp32, fp16 or bf16, in host memory, with sane sizes, strides and data pointer.
Status check_float_tensor(const char* op, const char* name, const TensorView& t);
// `t` is fp32 or bf16 (host memory, sane sizes, strides and data pointer).
Status check_f32_or_bf16(const char* op, const char* name, const TensorView& t);
// `t` has exactly dtype `d` (and is a sane host tensor).
Status check_dtype(const char* op, const char* name, const TensorView& t, DType d);
// `t` has rank `rank`; `layout` describes the expected dims, e.g. "[T, k]".
Status check_rank(const char* op, const char* name, const TensorView& t, int rank, const char* layout);
// `t` has shape `want`; `why` explains it, e.g. "(x's leading shape + [N])".
Status check_shape(const char* op, const char* name, const TensorView& t, const std::vector<int64_t>& want,
                   const std::string& why);
// The last dimension of `t` has unit stride (or at most one element).
Status check_unit_last_stride(const char* op, const char* name, const TensorView& t);
// The byte ranges spanned by `out` and `in` are disjoint (or either is empty).
Status check_no_overlap(const char* op, const char* out_name, const TensorView& out, const char* in_name,
                        const TensorView& in);

}  // namespace genbridge::ops::detail
