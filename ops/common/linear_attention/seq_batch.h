#pragma once
// Internal: the argument checks and the batch walk shared by the linear_attention/* operators (causal_conv1d,
// gated_delta_rule): a batch of sequences, each a run of consecutive rows (query_start_loc) continuing the
// state held in its own slot (state_indices).

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// A state tensor: one of `dtypes`, shape `want` (`layout` names its dims, e.g. "[num_slots, nv, dk, dv]";
// want[0] < 0: any number of slots >= 1), contiguous, host data.
Status check_state(const char* op, const char* name, const TensorView& t, std::initializer_list<DType> dtypes,
                   const std::vector<int64_t>& want, const char* layout);

// state_indices int32 [S], each in [0, num_slots) and distinct; query_start_loc int32 [S + 1], 0 first,
// non-decreasing, num_tokens last.
Status check_seq_batch(const char* op, const TensorView& state_indices, const TensorView& query_start_loc,
                       int64_t num_tokens, int64_t num_slots);

// The batch, read once after validation: sequence s covers rows [begin[s], begin[s + 1]) and its state slot.
struct SeqBatch {
  std::vector<int64_t> begin;  // S + 1 entries
  std::vector<int64_t> slot;   // S entries
  int64_t num_seqs() const { return static_cast<int64_t>(slot.size()); }
  int64_t q_len(int64_t s) const { return begin[s + 1] - begin[s]; }
};
SeqBatch read_seq_batch(const TensorView& state_indices, const TensorView& query_start_loc);

}  // namespace genbridge::ops::detail
