#include "ops/common/linear_attention/seq_batch.h"

#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops::detail {

Status check_state(const char* op, const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                   const std::vector<int64_t>& want, const char* layout) {
  bool dtype_ok = false;
  std::string allowed;
  for (DType d : dtypes) {
    dtype_ok = dtype_ok || t.dtype() == d;
    allowed += (allowed.empty() ? "" : " or ") + s(dtype_name(d));
  }
  if (!dtype_ok) {
    return invalid_argument(s(op) + ": " + name + " has dtype " + s(dtype_name(t.dtype())) + " but must be " + allowed +
                            " (the state's dtype)");
  }
  bool shape_ok = t.rank() == static_cast<int>(want.size());
  for (int d = 0; shape_ok && d < t.rank(); ++d) shape_ok = want[d] < 0 ? t.dim(d) >= 1 : t.dim(d) == want[d];
  if (!shape_ok) {
    std::string w = "[";
    for (size_t d = 0; d < want.size(); ++d) w += (d ? ", " : "") + (want[d] < 0 ? s("num_slots >= 1") : n(want[d]));
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() + " but must be " + w + "] " + layout);
  }
  GB_RETURN_IF_ERROR(check_host_data(op, name, t));
  if (!t.is_contiguous()) {
    return invalid_argument(s(op) + ": " + name + " is not contiguous; state slots must be contiguous");
  }
  return ok_status();
}

Status check_seq_batch(const char* op, const TensorView& state_indices, const TensorView& query_start_loc,
                       int64_t num_tokens, int64_t num_slots) {
  GB_RETURN_IF_ERROR(check_int32(op, "state_indices", state_indices, 1, "[num_seqs]"));
  const int64_t num_seqs = state_indices.dim(0);
  GB_RETURN_IF_ERROR(check_query_start_loc(op, query_start_loc, num_seqs, num_tokens));
  std::vector<int64_t> seen(static_cast<size_t>(num_slots), -1);
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t slot = at_i32(state_indices, q);
    if (slot < 0 || slot >= num_slots) {
      return invalid_argument(s(op) + ": state_indices[" + n(q) + "] is " + n(slot) + " but must be in [0, " +
                              n(num_slots) + ") (the state's slots)");
    }
    if (seen[slot] >= 0) {
      return invalid_argument(s(op) + ": state_indices[" + n(q) + "] is " + n(slot) + ", as is state_indices[" +
                              n(seen[slot]) + "]; each sequence needs its own state slot");
    }
    seen[slot] = q;
  }
  return ok_status();
}

SeqBatch read_seq_batch(const TensorView& state_indices, const TensorView& query_start_loc) {
  SeqBatch b;
  const int64_t num_seqs = state_indices.dim(0);
  b.begin.resize(static_cast<size_t>(num_seqs + 1));
  b.slot.resize(static_cast<size_t>(num_seqs));
  for (int64_t q = 0; q <= num_seqs; ++q) b.begin[q] = at_i32(query_start_loc, q);
  for (int64_t q = 0; q < num_seqs; ++q) b.slot[q] = at_i32(state_indices, q);
  return b;
}

}  // namespace genbridge::ops::detail
