#include "tools/serve/reasoning.h"

#include <algorithm>

namespace genbridge::serve {

namespace {
constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// The length of the longest suffix of `s` that is a proper prefix of `tag` (a tag that may still arrive).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}
}  // namespace

const char* reasoning_parser_name(ReasoningParser p) {
  switch (p) {
    case ReasoningParser::kQwen3:
      return "qwen3";
    case ReasoningParser::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningParser::kNone:
      break;
  }
  return "none";
}

ReasoningSplitter::ReasoningSplitter(ReasoningParser parser)
    : parser_(parser), state_(parser == ReasoningParser::kNone ? State::kContent : State::kStart) {}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view text) {
  held_ += text;
  return drain(false);
}

ReasoningSplitter::Parts ReasoningSplitter::finish() { return drain(true); }

ReasoningSplitter::Parts ReasoningSplitter::drain(bool final) {
  Parts out;
  if (state_ == State::kStart) {
    // Undecided while the reply could still be opening "<think>".
    if (!final && held_.size() < kOpen.size() && kOpen.substr(0, held_.size()) == held_) return out;
    const bool opens = held_.compare(0, kOpen.size(), kOpen) == 0;
    if (opens) held_.erase(0, kOpen.size());
    state_ = opens || parser_ == ReasoningParser::kDeepSeekR1 ? State::kReasoning : State::kContent;
    saw_reasoning_ = state_ == State::kReasoning;
  }
  if (state_ == State::kReasoning) {
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      const size_t keep = final ? 0 : partial_tag(held_, kClose);
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.reasoning = held_.substr(0, close);
    held_.erase(0, close + kClose.size());
    state_ = State::kContent;
  }
  out.content += held_;
  held_.clear();
  return out;
}

}  // namespace genbridge::serve
