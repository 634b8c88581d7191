#pragma once
// Internal: the argument checks the moe/* routing and expert ops share, in the order each op reports them.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// A float input `name` of rank 2 (`layout`, e.g. "([T, H])") and int32 topk_ids of rank 2 ("([T, k])");
// sets T and C (the input's dimensions) and k (topk_ids' last). InvalidArgument naming `op`, the tensor
// and the rule.
Status check_rows_and_topk_ids(const char* op, const char* name, const TensorView& x, const char* layout,
                               const TensorView& ids, int64_t& T, int64_t& C, int64_t& k);

// swiglu_limit of moe/expert_ffn and moe/quant_expert_ffn: > 0, +inf meaning no clamp.
Status check_swiglu_limit(const char* op, float limit);

// A router's outputs against its logits ([T, E]): topk_ids [T, k], topk_weights fp32 [T, k], neither
// overlapping the logits.
Status check_router_outputs(const char* op, const TensorView& logits, const TensorView& ids, const TensorView& weights,
                            int64_t T, int64_t k);

}  // namespace genbridge::ops::detail
