#include "ops/common/quant/quant_checks.h"

namespace genbridge::ops::detail::quant_checks {

std::string dims_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// x.shape[:-drop] + tail
std::vector<int64_t> leading_plus(const TensorView& x, int drop, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> d(x.shape(), x.shape() + (x.rank() - drop));
  d.insert(d.end(), tail);
  return d;
}

Status check_shape(const char* op, const char* name, const TensorView& t, const std::vector<int64_t>& want,
                   const std::string& rule) {
  bool same = t.rank() == static_cast<int>(want.size());
  for (int d = 0; same && d < t.rank(); ++d) same = t.dim(d) == want[static_cast<size_t>(d)];
  if (same) return ok_status();
  return invalid_argument(std::string(op) + ": " + name + " has shape " + t.shape_string() + " but must be " +
                          dims_string(want) + " (" + rule + ")");
}

Status check_dtype(const char* op, const char* name, const TensorView& t, DType want, const char* why) {
  if (t.dtype() == want) return ok_status();
  std::string m = std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())) + " but must be " +
                  std::string(dtype_name(want));
  if (why) m += std::string(" (") + why + ")";
  return invalid_argument(m);
}

Status check_rank_at_least_1(const char* op, const char* name, const TensorView& t) {
  if (t.rank() >= 1) return ok_status();
  return invalid_argument(std::string(op) + ": " + name +
                          " has rank 0 but must have rank >= 1 (the op works along the last dimension)");
}

}  // namespace genbridge::ops::detail::quant_checks
