#pragma once
// Token sampling: greedy, or seeded temperature / top-k / top-p. A draw depends only on the logits, the
// request's seed and the step index, so batching never changes a request's tokens.

#include <cstdint>
#include <span>
#include <vector>

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

// Picks the next token from fp32 logits of one sequence; InvalidArgument naming the first non-finite logit. `step` is
// the index of the token being generated (0 for the first). Allocation-free apart from a scratch buffer owned by the
// caller (size >= vocab).
Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t step,
                             std::span<int32_t> scratch);

// Log-probabilities of a generated token under the model's own distribution: log-softmax of the raw logits
// (before temperature, top-k and top-p, as vLLM reports them by default), computed in fp64.
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
};
struct TokenLogprobs {
  TokenLogprob sampled;           // the token that was drawn
  std::vector<TokenLogprob> top;  // the k most likely tokens, most likely first, ties to the lower id
};
inline constexpr int kMaxLogprobs = 20;  // most alternatives a request may ask for (OpenAI's limit)

// Fills `out` for token `sampled` and the `k` (0..vocab) most likely tokens of finite `logits`. One pass
// for the maximum, one fp64 pass for log-sum-exp, one for the top k (an insertion list of k entries).
void token_logprobs(std::span<const float> logits, int32_t sampled, int k, TokenLogprobs* out);

// Uniform double in [0, 1) from (seed, step): counter-based, reproducible.
double uniform_from(uint64_t seed, uint64_t step);

}  // namespace genbridge::engine
