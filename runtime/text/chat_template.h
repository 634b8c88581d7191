#pragma once
// Chat templates: the model's own Jinja template from tokenizer_config.json, rendered the way Hugging Face
// transformers' apply_chat_template renders it (Jinja2 with trim_blocks and lstrip_blocks, loopcontrols,
// tojson without HTML escaping, raise_exception, strftime_now).
//
// The engine implements the subset of Jinja2 that real chat templates use (Qwen2/Qwen3, DeepSeek-V3 and
// their kin; tests/text/oracle renders them against @huggingface/jinja):
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/first/last/
//               length/previtem/nextitem/cycle), set (names, tuples, ns.attr, block set), macro (positional,
//               keyword and default arguments), break, continue, generation
//   expressions literals, lists, dicts, tuples, attribute/subscript/slice, calls, filters, `is` tests,
//               not/and/or, comparisons, in/not in, + - * / // % ** ~, conditional expressions
//   filters     tojson trim length count upper lower title capitalize first last join default items list
//               string int float abs round replace reverse sort unique min max sum map select reject
//               selectattr rejectattr indent safe escape dictsort wordcount
//   methods     str: startswith endswith split rsplit strip lstrip rstrip upper lower title capitalize
//               replace find count index join isdigit isalpha isspace splitlines; dict: items keys values
//               get; list: append pop index count
//   globals     namespace raise_exception range strftime_now dict
// A template using anything else fails to load with the construct and its line ("chat template line 7:
// unsupported filter 'batch'"), never renders a silently different prompt. Values follow Python: strings
// are indexed and measured in code points, None prints as "None", True as "True", 2.0 as "2.0".
//
// A ChatTemplate is immutable after parsing; render may run on any number of threads at once.

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::text {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // Parses a template; InvalidArgument "chat template line N: ..." for anything outside the subset.
  static Result<ChatTemplate> parse(std::string_view source);
  // Renders with `context`'s keys as the template's variables (objects keep their key order for tojson).
  Result<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const jinja::Template> template_;
};

// What a server needs from tokenizer_config.json: the chat template(s) and the special-token strings.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;  // AddedToken objects -> content
  std::optional<ChatTemplate> chat_template;                              // "chat_template" (or its "default")
  std::map<std::string, ChatTemplate> named_templates;                    // a list form's other entries

  // Loads `path`: a tokenizer_config.json file, or a directory that holds one.
  static Result<TokenizerConfig> load(const std::filesystem::path& path);
  static Result<TokenizerConfig> from_json_text(std::string_view json_text,
                                                std::string_view source = "tokenizer_config.json");

  // Renders a chat as transformers' apply_chat_template(tokenize=False) does. `request` holds "messages"
  // and optionally "tools", "add_generation_prompt" and any template keyword (e.g. "enable_thinking").
  // The variables are the special tokens (bos_token, eos_token, pad_token, unk_token), then the request's
  // keys, with tools = None and add_generation_prompt = false where the request has none. The "tool_use"
  // template is used when tools are given and the config names one.
  Result<std::string> render_chat(const nlohmann::ordered_json& request) const;
};

}  // namespace genbridge::text
