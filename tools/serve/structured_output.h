#pragma once
// Structured outputs and forced tool calls for `genbridge serve` (docs/serving.md, "Tool calls and structured
// outputs"): the request fields that constrain the output (response_format, vLLM's guided_json / guided_regex /
// guided_choice and structured_outputs, tool_choice "required" or a named function) become a grammar, compiled
// against the model's vocabulary (text/grammar/) before the request is queued, and each request's matcher
// becomes the engine's TokenConstraint. Compiled grammars are cached by their source, so a schema sent again
// costs nothing to compile.

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "genbridge/core/status.h"
#include "runtime/engine/token_constraint.h"
#include "text/chat_template.h"
#include "text/grammar/matcher.h"
#include "text/tokenizer.h"
#include "tools/serve/tool_calls.h"

namespace genbridge::serve {

// What the server knows once per model: the vocabulary as a trie, what the chat template does with tool calls,
// and the cache of compiled grammars. Thread-safe.
class StructuredSupport {
 public:
  // `vocab_size`: the model's vocabulary rows (the mask's length). Builds the trie (~0.1 s for 151,936 tokens)
  // and probes the template.
  StructuredSupport(const text::Tokenizer& tokenizer, const text::TokenizerConfig* config, int64_t vocab_size);

  const std::shared_ptr<const text::grammar::Vocabulary>& vocabulary() const { return vocab_; }
  const TemplateToolSupport& template_tools() const { return tools_; }

  // The compiled grammar of `key` (the grammar's source, e.g. "json_schema:" + the schema): from the cache, or
  // built by `build` and compiled within `options`.
  Result<std::shared_ptr<const text::grammar::CompiledGrammar>> compile(
      const std::string& key, const std::function<Result<text::grammar::Grammar>()>& build,
      const text::grammar::CompileOptions& options);

  static constexpr size_t kCacheEntries = 64;  // compiled grammars kept (least recently used dropped first)

 private:
  std::shared_ptr<const text::grammar::Vocabulary> vocab_;
  TemplateToolSupport tools_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const text::grammar::CompiledGrammar>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

// A request's matcher as the engine's constraint. `stop_tokens`: the request's (end the output once complete).
std::shared_ptr<engine::TokenConstraint> make_token_constraint(
    std::shared_ptr<const text::grammar::CompiledGrammar> grammar, std::vector<int32_t> stop_tokens);

}  // namespace genbridge::serve
