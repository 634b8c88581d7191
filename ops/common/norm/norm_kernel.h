#pragma once
// Internal: the shared RMS-norm row kernel behind the norm/* stable operators. Generic: it knows
// nothing of targets; providers choose how the weight is formed.

#include <cstdint>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// How the effective per-column weight is formed from the weight tensor.
enum class WeightForm {
  kAsIs,             // gamma
  kOnePlusInFp32,    // 1 + w computed in fp32 (no rounding to w's dtype)
};

struct NormCall {
  const char* op = "";           // op name for messages
  const char* weight_name = "";  // "gamma" or "w"
  TensorView x;
  TensorView weight;
  const TensorView* residual = nullptr;      // add_* variants
  TensorView y;
  const TensorView* residual_sum = nullptr;  // add_* variants
  const TensorView* rstd = nullptr;          // plain variants
  float eps = 0.f;
  WeightForm form = WeightForm::kAsIs;
};

// Validates every argument of `call` without computing anything.
Status validate_norm(const NormCall& call);

// Validates every argument (InvalidArgument naming op, value and rule) and, only when all are
// valid, computes the outputs. Deterministic and independent of the thread count.
Status run_norm(const NormCall& call);

// Contiguous copy of `w` with 1 added to every element, rounded to w's dtype (RNE). The returned
// view points into `storage`. `w` must be a float tensor on the host.
TensorView offset_weight_rounded(const TensorView& w, std::vector<uint32_t>& storage);

}  // namespace genbridge::ops::detail
