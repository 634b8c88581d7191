#pragma once
// Token sampling: greedy, or seeded temperature / top-k / top-p. A draw depends only on the logits, the
// request's seed and the step index, so batching never changes a request's tokens.

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::engine {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy (argmax, ties to the lowest id); else within kTemperatureRange
  int top_k = 0;            // 0 = no top-k filter; else in [1, kMaxTopK]
  float top_p = 1.f;        // nucleus mass within kTopPRange
  uint64_t seed = 0;        // any value
};

// The values a float parameter accepts, stated once for every reader of them: validate() checks
// SamplingParams against these ranges, and the command line (tools/main.cpp) and the HTTP API
// (tools/serve/openai.cpp) check each number they read (a double) with contains() before narrowing it to
// float, so a value that would become infinite, 0 or subnormal in float is refused by name instead of
// changing meaning on the way (docs/serving.md, "Limits: sampling parameters").
struct FloatRange {
  float lo = 0.f, hi = 0.f;  // the accepted interval [lo, hi]
  bool zero = false;         // 0 is accepted too (below lo)
  // Whether `v` is accepted: 0 (when `zero`), or a finite value whose float rounding lies in [lo, hi].
  bool contains(double v) const;
  bool contains(float v) const { return contains(static_cast<double>(v)); }
  // The rule as messages state it, e.g. "0 or a number in [1.1754944e-38, 3.4028235e+38]".
  std::string rule() const;
  // The same range with a lower upper limit (the HTTP API's temperature is at most 2).
  constexpr FloatRange with_hi(float h) const { return FloatRange{lo, h, zero}; }
};
// temperature: 0 (greedy) or a normal float, so that its reciprocal, the scale of the logits, is a finite
// float too (the reciprocal of a subnormal overflows).
inline constexpr FloatRange kTemperatureRange{std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                                              /*zero=*/true};
// top_p: a normal float in (0, 1] (a smaller positive mass becomes 0 or a subnormal in float).
inline constexpr FloatRange kTopPRange{std::numeric_limits<float>::min(), 1.f, /*zero=*/false};
// top_k: an integer in [0, kMaxTopK], 0 = no filter (k >= the vocabulary keeps every token).
inline constexpr int kMaxTopK = std::numeric_limits<int32_t>::max();

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
