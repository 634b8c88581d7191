#pragma once
// Test helpers for the Gated DeltaNet operators: a batch of sequences (query_start_loc, state_indices) and
// the per-sequence slices of dense fp64 copies that the fp64 references (linear_attention_ref.h) take.

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "genbridge/core/tensor.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

// int32 [S] state_indices and [S + 1] query_start_loc for sequences of `q_lens` in `slots`.
struct SeqBatchTensors {
  std::vector<int32_t> slots, starts;
  SeqBatchTensors(const std::vector<int>& q_lens, const std::vector<int>& slot_ids) {
    starts.push_back(0);
    for (int q : q_lens) starts.push_back(starts.back() + q);
    for (int s : slot_ids) slots.push_back(s);
  }
  int64_t num_tokens() const { return starts.back(); }
  int64_t num_seqs() const { return static_cast<int64_t>(slots.size()); }
  TensorView state_indices() { return TensorView(slots.data(), DType::kI32, {num_seqs()}); }
  TensorView query_start_loc() { return TensorView(starts.data(), DType::kI32, {num_seqs() + 1}); }
};

// Rows [r0, r1) of a dense [rows][width] vector.
inline std::vector<double> rows_of(const std::vector<double>& v, int64_t width, int64_t r0, int64_t r1) {
  return std::vector<double>(v.begin() + r0 * width, v.begin() + r1 * width);
}

// ||a - b||_2 / ||b||_2 over [i0, i1) (0 when both are zero).
inline double rel_l2(const std::vector<double>& a, const std::vector<double>& b, size_t i0, size_t i1) {
  double num = 0, den = 0;
  for (size_t i = i0; i < i1; ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace genbridge::testing
