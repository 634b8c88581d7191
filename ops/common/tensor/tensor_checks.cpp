#include "ops/common/tensor/tensor_checks.h"

#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<int64_t> shape_of(const TensorView& t) { return std::vector<int64_t>(t.shape(), t.shape() + t.rank()); }

Status check_float_tensor(const char* op, const char* name, const TensorView& t) {
  return check_float_input(op, name, t);
}

Status check_f32_or_bf16(const char* op, const char* name, const TensorView& t) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) {
    return invalid_argument(std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())) + " but must be fp32 or bf16");
  }
  return check_host_data(op, name, t);
}

Status check_dtype(const char* op, const char* name, const TensorView& t, DType d) {
  if (t.dtype() != d) {
    return invalid_argument(std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())) +
                            " but must be " + std::string(dtype_name(d)));
  }
  return check_host_data(op, name, t);
}

Status check_rank(const char* op, const char* name, const TensorView& t, int rank, const char* layout) {
  if (t.rank() != rank) {
    return invalid_argument(std::string(op) + ": " + name + " has rank " + std::to_string(t.rank()) +
                            " but must have rank " + std::to_string(rank) + " " + layout);
  }
  return ok_status();
}

Status check_shape(const char* op, const char* name, const TensorView& t, const std::vector<int64_t>& want,
                   const std::string& why) {
  if (shape_of(t) != want) {
    return invalid_argument(std::string(op) + ": " + name + " has shape " + t.shape_string() + " but must be " +
                            shape_text(want) + " " + why);
  }
  return ok_status();
}

Status check_unit_last_stride(const char* op, const char* name, const TensorView& t) {
  if (t.rank() >= 1 && t.dim(-1) > 1 && t.stride(-1) != 1) {
    return invalid_argument(std::string(op) + ": " + name + " has stride " + std::to_string(t.stride(-1)) +
                            " along its last dimension but must have unit stride there (contiguous rows)");
  }
  return ok_status();
}

namespace {
// [first, last] byte addresses touched by a view; false when it has no elements.
bool byte_span(const TensorView& t, uintptr_t& lo, uintptr_t& hi) {
  if (t.numel() == 0 || t.data() == nullptr) return false;
  int64_t last = 0;
  for (int d = 0; d < t.rank(); ++d) last += (t.dim(d) - 1) * t.stride(d);
  lo = reinterpret_cast<uintptr_t>(t.data());
  hi = lo + static_cast<uintptr_t>(last + 1) * dtype_size(t.dtype()) - 1;
  return true;
}
}  // namespace

Status check_no_overlap(const char* op, const char* out_name, const TensorView& out, const char* in_name,
                        const TensorView& in) {
  uintptr_t a0, a1, b0, b1;
  if (!byte_span(out, a0, a1) || !byte_span(in, b0, b1)) return ok_status();
  if (a0 <= b1 && b0 <= a1) {
    return invalid_argument(std::string(op) + ": " + out_name + " overlaps " + in_name +
                            " in memory; outputs must not alias inputs");
  }
  return ok_status();
}

}  // namespace genbridge::ops::detail
