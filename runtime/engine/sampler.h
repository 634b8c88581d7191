#pragma once
// Token sampling: greedy, or seeded temperature / top-k / top-p. A draw depends only on the logits, the
// request's seed and the step index, so batching never changes a request's tokens.

#include <cstdint>
#include <span>

#include "genbridge/core/status.h"

namespace genbridge::engine {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy (argmax, ties to the lowest id)
  int top_k = 0;            // 0 = no top-k filter
  float top_p = 1.f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
};

// InvalidArgument naming the field and the rule, or OK.
Status validate(const SamplingParams& p);

// Picks the next token from fp32 logits of one sequence; InvalidArgument naming the first non-finite logit. `step` is the index of the token being generated
// (0 for the first). Allocation-free apart from a scratch buffer owned by the caller (size >= vocab).
Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t step,
                             std::span<int32_t> scratch);

// Uniform double in [0, 1) from (seed, step): counter-based, reproducible.
double uniform_from(uint64_t seed, uint64_t step);

}  // namespace genbridge::engine
