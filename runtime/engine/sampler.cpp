#include "runtime/engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace genbridge::engine {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace

double uniform_from(uint64_t seed, uint64_t step) {
  const uint64_t r = splitmix64(splitmix64(seed) ^ (step * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

bool FloatRange::contains(double v) const {
  if (zero && v == 0) return true;
  // 2^128 and beyond round to infinity in float; the guard keeps the narrowing below defined.
  if (!std::isfinite(v) || std::fabs(v) >= 0x1p128) return false;
  const float f = static_cast<float>(v);
  if (f == 0.f && v != 0) return false;  // a tiny value would silently become 0 (no effect)
  return f >= lo && f <= hi;
}

std::string FloatRange::rule() const {
  return fmt::format("{}a number in [{}, {}]", zero && lo > 0.f ? "0 or " : "", lo, hi);
}

Status validate(const SamplingParams& p) {
  if (!kTemperatureRange.contains(p.temperature)) {
    return invalid_argument(
        fmt::format("sampling: temperature is {} but must be {}", p.temperature, kTemperatureRange.rule()));
  }
  if (p.top_k < 0) {
    return invalid_argument(fmt::format("sampling: top_k is {} but must be in [0, {}]", p.top_k, kMaxTopK));
  }
  if (!kTopPRange.contains(p.top_p)) {
    return invalid_argument(fmt::format("sampling: top_p is {} but must be {}", p.top_p, kTopPRange.rule()));
  }
  const auto check = [](const char* name, float v, const FloatRange& range) -> Status {
    if (range.contains(v)) return ok_status();
    return invalid_argument(fmt::format("sampling: {} is {} but must be {}", name, v, range.rule()));
  };
  GB_RETURN_IF_ERROR(check("min_p", p.min_p, kMinPRange));
  GB_RETURN_IF_ERROR(check("presence_penalty", p.presence_penalty, kPenaltyRange));
  GB_RETURN_IF_ERROR(check("frequency_penalty", p.frequency_penalty, kPenaltyRange));
  GB_RETURN_IF_ERROR(check("repetition_penalty", p.repetition_penalty, kRepetitionPenaltyRange));
  for (const auto& [id, bias] : p.logit_bias) {
    if (!kLogitBiasRange.contains(bias)) {
      return invalid_argument(
          fmt::format("sampling: logit_bias of token {} is {} but must be {}", id, bias, kLogitBiasRange.rule()));
    }
  }
  if (p.min_tokens < 0)
    return invalid_argument(fmt::format("sampling: min_tokens is {} but must be >= 0", p.min_tokens));
  return ok_status();
}

Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t step,
                             std::span<int32_t> scratch) {
  if (logits.empty()) return invalid_argument("sampling: logits are empty; the vocabulary must be non-empty");
  if (scratch.size() < logits.size()) {
    return invalid_argument(
        fmt::format("sampling: scratch has {} entries but the vocabulary has {}", scratch.size(), logits.size()));
  }
  bool any = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      return invalid_argument(
          fmt::format("sampling: logits[{}] is {}; every logit must be finite or -inf (masked)", i, logits[i]));
    }
    any = any || logits[i] != -std::numeric_limits<float>::infinity();
  }
  if (!any) return invalid_argument("sampling: every token is masked (every logit is -inf)");
  if (p.temperature == 0.f) return argmax(logits);

  // Candidates sorted by logit (descending, ties to the lower id), cut to top-k.
  const size_t vocab = logits.size();
  std::span<int32_t> ids = scratch.first(vocab);
  for (size_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  // Masked tokens (-inf) have probability 0; min_p (vLLM's order: after temperature, before top-k and top-p)
  // keeps the tokens whose probability is at least min_p times the likeliest one's, a prefix of the order. The
  // tokens it drops are left out before sorting (the same test as below, so the kept prefix is the same): with
  // a 151,936-token vocabulary the sort of every token is most of a draw.
  const double min_log_ratio = p.min_p > 0.f ? std::log(static_cast<double>(p.min_p)) : -HUGE_VAL;
  size_t candidates = vocab;
  if (p.min_p > 0.f) {
    const double max_scaled = static_cast<double>(*std::max_element(logits.begin(), logits.end())) * inv_t;
    candidates = static_cast<size_t>(std::partition(ids.begin(), ids.end(),
                                                    [&](int32_t i) {
                                                      const double x =
                                                          static_cast<double>(logits[i]) * inv_t - max_scaled;
                                                      return x >= min_log_ratio && !std::isinf(x);
                                                    }) -
                                     ids.begin());
  }
  size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), candidates) : candidates;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k),
                    ids.begin() + static_cast<std::ptrdiff_t>(candidates), by_logit);

  // Softmax over the k candidates in fp64, then the nucleus.
  const double top = static_cast<double>(logits[ids[0]]) * inv_t;
  for (size_t i = 1; i < k; ++i) {
    const double x = static_cast<double>(logits[ids[i]]) * inv_t - top;
    if (!(x >= min_log_ratio) || std::isinf(x)) {
      k = i;
      break;
    }
  }
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += std::exp(static_cast<double>(logits[ids[i]]) * inv_t - top);
  size_t keep = k;
  double kept_mass = total;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += std::exp(static_cast<double>(logits[ids[i]]) * inv_t - top);
      if (cum / total >= static_cast<double>(p.top_p)) {
        keep = i + 1;
        kept_mass = cum;
        break;
      }
    }
  }
  const double u = uniform_from(p.seed, step) * kept_mass;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += std::exp(static_cast<double>(logits[ids[i]]) * inv_t - top);
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

void token_logprobs(std::span<const float> logits, int32_t sampled, int k, TokenLogprobs* out) {
  const size_t vocab = logits.size();
  float max = logits[0];
  for (size_t i = 1; i < vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  const double m = static_cast<double>(max);
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  const double lse = m + std::log(sum);
  out->sampled = {sampled, static_cast<double>(logits[sampled]) - lse};
  // The top k by logit: ids ascend, so a strictly greater logit is the only way past an equal one (ties
  // keep the lower id first). `cut` is the k-th logit so far: most entries fail the one compare against it.
  const size_t kk = std::min<size_t>(static_cast<size_t>(std::max(k, 0)), vocab);
  std::vector<TokenLogprob>& top = out->top;
  top.clear();
  top.reserve(kk + 1);
  float cut = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < vocab && kk > 0; ++i) {
    const float x = logits[i];
    if (top.size() == kk && !(x > cut)) continue;
    size_t at = top.size();
    while (at > 0 && x > logits[top[at - 1].token]) --at;
    top.insert(top.begin() + static_cast<std::ptrdiff_t>(at), TokenLogprob{static_cast<int32_t>(i), 0});
    if (top.size() > kk) top.pop_back();
    if (top.size() == kk) cut = logits[top.back().token];
  }
  for (TokenLogprob& t : top) t.logprob = static_cast<double>(logits[t.token]) - lse;
}

}  // namespace genbridge::engine
