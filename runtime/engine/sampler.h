#pragma once
// Token sampling: greedy, or seeded temperature / min-p / top-k / top-p. A draw depends only on the logits,
// the request's seed and the step index, so batching never changes a request's tokens. The per-request
// logits processing that precedes the draw (penalties, logit_bias, allowed_token_ids, min_tokens) is
// runtime/engine/logits_processor.h's; its fields live here so that one struct states a request's sampling.

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::engine {

struct SamplingParams {
  float temperature = 0.f;  // 0 = greedy (argmax, ties to the lowest id); else within kTemperatureRange
  int top_k = 0;            // 0 = no top-k filter; else in [1, kMaxTopK]
  float top_p = 1.f;        // nucleus mass within kTopPRange
  uint64_t seed = 0;        // any value
  // vLLM's semantics (docs/serving.md, "Sampling controls"); the defaults leave the logits as they are.
  float min_p = 0.f;               // within kMinPRange: drop tokens less likely than min_p x the likeliest (after
                                   // temperature; no effect on greedy)
  float presence_penalty = 0.f;    // within kPenaltyRange: subtracted once from every token already generated
  float frequency_penalty = 0.f;   // within kPenaltyRange: subtracted per occurrence in the generated tokens
  float repetition_penalty = 1.f;  // within kRepetitionPenaltyRange: divides a positive, multiplies a negative
                                   // logit of every token of the prompt or the generated tokens
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias within kLogitBiasRange), added to its logit
  std::vector<int32_t> allowed_token_ids;             // non-empty: every other token is masked out
  int min_tokens = 0;  // >= 0: the stop tokens are masked out until this many tokens were generated
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
// min_p: a probability ratio in [0, 1] (0: no filter).
inline constexpr FloatRange kMinPRange{0.f, 1.f, /*zero=*/true};
// presence_penalty, frequency_penalty: OpenAI's range [-2, 2].
inline constexpr FloatRange kPenaltyRange{-2.f, 2.f, /*zero=*/true};
// repetition_penalty: a positive normal float (1: none), so that dividing by it stays finite.
inline constexpr FloatRange kRepetitionPenaltyRange{std::numeric_limits<float>::min(),
                                                    std::numeric_limits<float>::max(), /*zero=*/false};
// logit_bias values: OpenAI's range [-100, 100].
inline constexpr FloatRange kLogitBiasRange{-100.f, 100.f, /*zero=*/true};

// InvalidArgument naming the field and the rule, or OK (token ids are checked against the vocabulary by the
// engine, which knows it).
Status validate(const SamplingParams& p);

// Picks the next token from fp32 logits of one sequence; InvalidArgument naming the first NaN or +Inf logit, or
// when every logit is -Inf. A -Inf logit is a masked token (logits processing): it is never drawn. `step` is the
// index of the token being generated (0 for the first). Allocation-free apart from a scratch buffer owned by the
// caller (size >= vocab) and, when most of the vocabulary is in play, per-thread sort buffers that grow once.
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
