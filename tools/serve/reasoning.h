#pragma once
// The reasoning parser of `serve --reasoning-parser` (vLLM's names): splits a chat reply of a model that
// thinks into its reasoning (the message's "reasoning_content") and its answer ("content"), as the text is
// released, so a stream sends each part as it comes.
//   qwen3        the reply opens with "<think>" (Qwen3 with enable_thinking): the text up to "</think>" is
//                reasoning; a reply without the opening tag is all content (enable_thinking false: the
//                template already closed an empty think block in the prompt).
//   deepseek_r1  the reply is reasoning from its start (DeepSeek-R1's template opens "<think>" in the prompt;
//                a "<think>" the model writes itself is dropped) up to "</think>".
// Reasoning that never closes stays reasoning to the end of the reply, streamed or not.

#include <string>
#include <string_view>
#include <utility>

namespace genbridge::serve {

enum class ReasoningParser { kNone, kQwen3, kDeepSeekR1 };
// "qwen3" / "deepseek_r1" / "none" (nullopt-like kNone for anything else is the caller's to refuse).
const char* reasoning_parser_name(ReasoningParser p);

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(ReasoningParser parser);
  struct Parts {
    std::string reasoning, content;
  };
  // The parts `text` (the next released text of the reply) completes; a possible tag is held back.
  Parts push(std::string_view text);
  // Whatever is held at the end of the reply.
  Parts finish();
  // Whether any reasoning was found (the message then carries reasoning_content).
  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class State { kStart, kReasoning, kContent };
  Parts drain(bool final);
  ReasoningParser parser_;
  State state_;
  std::string held_;
  bool saw_reasoning_ = false;
};

}  // namespace genbridge::serve
