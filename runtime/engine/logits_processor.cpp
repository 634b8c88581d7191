#include "runtime/engine/logits_processor.h"

#include <algorithm>
#include <limits>

namespace genbridge::engine {

namespace {
constexpr float kMasked = -std::numeric_limits<float>::infinity();
}  // namespace

LogitsProcessor::LogitsProcessor(const SamplingParams& p, std::span<const int32_t> prompt,
                                 std::span<const int32_t> stop_tokens)
    : params_(p), stops_(stop_tokens.begin(), stop_tokens.end()) {
  penalties_ = p.repetition_penalty != 1.f || p.frequency_penalty != 0.f || p.presence_penalty != 0.f;
  if (p.repetition_penalty != 1.f) {
    prompt_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_.begin(), prompt_.end());
    prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
  }
}

bool LogitsProcessor::active() const {
  return penalties_ || !params_.logit_bias.empty() || !params_.allowed_token_ids.empty() ||
         (generated_ < params_.min_tokens && !stops_.empty());
}

void LogitsProcessor::apply(std::span<float> logits) const {
  const auto vocab = static_cast<int64_t>(logits.size());
  const auto in_vocab = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (!params_.allowed_token_ids.empty()) {
    // Keep the allowed logits aside, mask everything, put them back.
    std::vector<std::pair<int32_t, float>> kept;
    kept.reserve(params_.allowed_token_ids.size());
    for (int32_t id : params_.allowed_token_ids) {
      if (in_vocab(id)) kept.emplace_back(id, logits[static_cast<size_t>(id)]);
    }
    std::fill(logits.begin(), logits.end(), kMasked);
    for (const auto& [id, v] : kept) logits[static_cast<size_t>(id)] = v;
  }
  if (generated_ < params_.min_tokens) {
    for (int32_t id : stops_) {
      if (in_vocab(id)) logits[static_cast<size_t>(id)] = kMasked;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) logits[static_cast<size_t>(id)] += bias;
  }
  if (!penalties_) return;
  const float rp = params_.repetition_penalty;
  const auto repeat = [&](int32_t id) {
    float& x = logits[static_cast<size_t>(id)];
    x = x > 0.f ? x / rp : x * rp;
  };
  if (rp != 1.f) {
    for (int32_t id : prompt_) {
      if (in_vocab(id)) repeat(id);
    }
  }
  for (const auto& [id, count] : output_counts_) {
    if (!in_vocab(id)) continue;
    if (rp != 1.f && !std::binary_search(prompt_.begin(), prompt_.end(), id)) repeat(id);
    float& x = logits[static_cast<size_t>(id)];
    x -= params_.frequency_penalty * static_cast<float>(count);  // two steps, as vLLM applies them
    x -= params_.presence_penalty;
  }
}

void LogitsProcessor::observe(int32_t token) {
  ++generated_;
  if (penalties_) ++output_counts_[token];
}

}  // namespace genbridge::engine
