#include "runtime/engine/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace genbridge::engine {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Below this (scaled logit minus the largest, a natural log) a token's probability is under 5e-18 of the
// likeliest one's (see sample_token).
constexpr double kNegligible = -40.0;

// A key whose ascending order is the logits' descending order (-0 equal to +0).
uint32_t descending_key(float f) {
  uint32_t bits = 0;
  if (f != 0.f) std::memcpy(&bits, &f, sizeof bits);
  const uint32_t ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

// Puts the first k of `ids` in order of descending logit, ties to the lower id (ids arrive ascending). Few of
// many: a partial sort (n log k). Otherwise a stable radix sort of every id on its key (three passes of 11
// bits, linear in n), which keeps the ascending ids of equal keys in order: the same prefix as the comparison.
void sort_prefix_by_logit(std::span<const float> logits, std::span<int32_t> ids, size_t k) {
  const size_t n = ids.size();
  if (k * 16 < n || n < 512) {
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), by_logit);
    return;
  }
  thread_local std::vector<uint32_t> key_a, key_b;
  thread_local std::vector<int32_t> id_b;
  key_a.resize(n);
  key_b.resize(n);
  id_b.resize(n);
  for (size_t i = 0; i < n; ++i) key_a[i] = descending_key(logits[ids[i]]);
  uint32_t* src_k = key_a.data();
  uint32_t* dst_k = key_b.data();
  int32_t* src_i = ids.data();
  int32_t* dst_i = id_b.data();
  constexpr int kBits = 11;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  for (int shift = 0; shift < 32; shift += kBits) {
    size_t count[kMask + 2] = {};
    for (size_t i = 0; i < n; ++i) ++count[((src_k[i] >> shift) & kMask) + 1];
    if (count[((src_k[0] >> shift) & kMask) + 1] == n) continue;  // one digit for all: the order stands
    for (size_t d = 1; d <= kMask + 1; ++d) count[d] += count[d - 1];
    for (size_t i = 0; i < n; ++i) {
      const size_t at = count[(src_k[i] >> shift) & kMask]++;
      dst_k[at] = src_k[i];
      dst_i[at] = src_i[i];
    }
    std::swap(src_k, dst_k);
    std::swap(src_i, dst_i);
  }
  if (src_i != ids.data()) std::copy(src_i, src_i + n, ids.data());
}

// The largest logit (no NaN: checked before), over 16 independent lanes so that the compiler vectorizes it.
float max_logit_of(std::span<const float> logits) {
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  std::fill(lane, lane + kLanes, -std::numeric_limits<float>::infinity());
  const size_t n = logits.size(), body = n / kLanes * kLanes;
  const float* x = logits.data();
  for (size_t i = 0; i < body; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float m = -std::numeric_limits<float>::infinity();
  for (size_t l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (size_t i = body; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

int32_t argmax(std::span<const float> logits) {
  const float m = max_logit_of(logits);
  return static_cast<int32_t>(std::find(logits.begin(), logits.end(), m) - logits.begin());
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
  // One pass without early exit (it vectorizes): NaN and +Inf fail `x <= max`, -Inf is a masked token.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Per lane: a NaN or +Inf seen, a logit above -Inf seen (0 / 1 in 16 independent lanes, so it vectorizes).
  bool bad = false, any = false;
  {
    constexpr size_t kLanes = 16;
    int32_t bad_lane[kLanes] = {}, any_lane[kLanes] = {};
    const size_t n = logits.size(), body = n / kLanes * kLanes;
    const float* x = logits.data();
    for (size_t i = 0; i < body; i += kLanes)
      for (size_t l = 0; l < kLanes; ++l) {
        const float v = x[i + l];
        bad_lane[l] |= !(v <= std::numeric_limits<float>::max()) & (v != -kInf);
        any_lane[l] |= v != -kInf;
      }
    for (size_t l = 0; l < kLanes; ++l) {
      bad |= bad_lane[l] != 0;
      any |= any_lane[l] != 0;
    }
    for (size_t i = body; i < n; ++i) {
      bad |= !(x[i] <= std::numeric_limits<float>::max()) && x[i] != -kInf;
      any |= x[i] != -kInf;
    }
  }
  if (bad) {
    for (size_t i = 0; i < logits.size(); ++i) {
      if (std::isnan(logits[i]) || logits[i] == kInf) {
        return invalid_argument(
            fmt::format("sampling: logits[{}] is {}; every logit must be finite or -inf (masked)", i, logits[i]));
      }
    }
  }
  if (!any) return invalid_argument("sampling: every token is masked (every logit is -inf)");
  if (p.temperature == 0.f) return argmax(logits);

  // Candidates sorted by logit (descending, ties to the lower id), cut to top-k.
  const size_t vocab = logits.size();
  std::span<int32_t> ids = scratch.first(vocab);
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  // Masked tokens (-inf) have probability 0; min_p (vLLM's order: after temperature, before top-k and top-p)
  // keeps the tokens whose probability is at least min_p times the likeliest one's, a prefix of the order. A
  // token more than kNegligible below the likeliest one (scaled) is left out too: its exp (< 5e-18) added to a
  // sum that is already >= 1 (the likeliest token's term) leaves the fp64 sums below unchanged, and a draw
  // u < the total never reaches it, so the draw is the same as over every token. The kept ids stay in
  // ascending order (ties to the lower id), and with a 151,936-token vocabulary this skips most of the sort.
  const double min_log_ratio = p.min_p > 0.f ? std::log(static_cast<double>(p.min_p)) : -HUGE_VAL;
  const float max_logit = max_logit_of(logits);
  const double max_scaled = static_cast<double>(max_logit) * inv_t;
  // The negligible test in float on the raw logits, against a bound at or below the exact one (rounded down
  // into float): it may keep a few more tokens, which changes nothing (above). min_p's test stays the exact one
  // in fp64.
  const double bound = (max_scaled + kNegligible) * static_cast<double>(p.temperature);
  float negligible_below = -std::numeric_limits<float>::max();
  if (bound > -static_cast<double>(std::numeric_limits<float>::max())) {
    negligible_below = static_cast<float>(bound);
    if (static_cast<double>(negligible_below) > bound) negligible_below = std::nextafter(negligible_below, -kInf);
  }
  size_t candidates = 0;
  if (p.min_p > 0.f) {
    for (size_t i = 0; i < vocab; ++i) {
      const double x = static_cast<double>(logits[i]) * inv_t - max_scaled;
      if (x >= min_log_ratio && !std::isinf(x) && logits[i] >= negligible_below)
        ids[candidates++] = static_cast<int32_t>(i);
    }
  } else {
    for (size_t i = 0; i < vocab; ++i) {
      ids[candidates] = static_cast<int32_t>(i);
      candidates += logits[i] >= negligible_below && logits[i] != -kInf;
    }
  }
  size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), candidates) : candidates;
  sort_prefix_by_logit(logits, ids.first(candidates), k);

  // Softmax over the k candidates in fp64, then the nucleus. Each candidate's exp is taken once (the sums
  // below add the same values in the same order).
  const double top = static_cast<double>(logits[ids[0]]) * inv_t;
  thread_local std::vector<double> weight;
  weight.resize(k);
  for (size_t i = 0; i < k; ++i) {
    const double x = static_cast<double>(logits[ids[i]]) * inv_t - top;
    if (!(x >= min_log_ratio) || std::isinf(x)) {
      k = i;
      break;
    }
    weight[i] = std::exp(x);
  }
  double total = 0;
  for (size_t i = 0; i < k; ++i) total += weight[i];
  size_t keep = k;
  double kept_mass = total;
  if (p.top_p < 1.f) {
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += weight[i];
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
    cum += weight[i];
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
