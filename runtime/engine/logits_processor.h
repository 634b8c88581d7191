#pragma once
// The per-request logits processing that precedes a draw (sample_token), with vLLM's semantics and order
// (docs/serving.md, "Sampling controls"):
//   1. allowed_token_ids: every other token is masked (-inf);
//   2. min_tokens: the request's stop tokens are masked until that many tokens were generated;
//      logit_bias: each bias is added to its token's logit;
//   3. penalties: repetition_penalty over the tokens of the prompt and of the output (a positive logit is
//      divided by it, a negative one multiplied), then frequency_penalty x count and presence_penalty x (count
//      > 0) subtracted for the tokens of the output.
// The engine keeps one per request, applies it to a copy of the logits (log-probabilities are reported from
// the model's own logits, as vLLM reports them by default) and tells it each generated token.

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/engine/sampler.h"

namespace genbridge::engine {

class LogitsProcessor {
 public:
  LogitsProcessor() = default;
  // `prompt`: the tokens that count as the prompt for repetition_penalty; `stop_tokens`: what min_tokens
  // masks. Copies what it needs; retains nothing.
  LogitsProcessor(const SamplingParams& p, std::span<const int32_t> prompt, std::span<const int32_t> stop_tokens);
  // Whether apply() would change any logit now (false: the logits may be sampled as they are).
  bool active() const;
  // Applies the steps above to one sequence's logits (the vocabulary); ids beyond it are skipped.
  void apply(std::span<float> logits) const;
  // A token the request generated (it counts for the penalties and min_tokens).
  void observe(int32_t token);

 private:
  SamplingParams params_;
  std::vector<int32_t> prompt_;  // sorted, unique
  std::vector<int32_t> stops_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  int64_t generated_ = 0;
  bool penalties_ = false;
};

}  // namespace genbridge::engine
