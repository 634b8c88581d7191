#pragma once
// Chat templates: the model's own Jinja template (tokenizer_config.json's chat_template, or the chat_template.jinja
// file beside it), rendered the way Hugging Face transformers' apply_chat_template renders it (Jinja2 with
// trim_blocks and lstrip_blocks, loopcontrols, tojson without HTML escaping, raise_exception, strftime_now).
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
//
// Rendering is bounded (docs/text.md "Limits"): a template nests at most kMaxTemplateNesting levels (parse
// error), and each render stops with an error naming the limit once it passes one of RenderLimits.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
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

// Blocks within blocks, or parts within one expression (brackets, operators, filters), deeper than this are a
// parse error; it also bounds the parser's own recursion.
inline constexpr int kMaxTemplateNesting = 128;

// What one render may use. A render past a limit ends with ResourceExhausted "chat template line N: ..."
// naming it; past `deadline` with DeadlineExceeded; when `cancelled` returns true with Unavailable. The
// defaults are what `genbridge serve` uses (docs/serving.md).
struct RenderLimits {
  // Statements, expressions and loop iterations evaluated, plus one per item a loop or filter walks.
  int64_t max_steps = 1'000'000;
  // Bytes of the rendered text, and of any one string the template builds (a ~ b, join, tojson, a macro's
  // output, a block set).
  int64_t max_output_bytes = int64_t{32} << 20;
  // Bytes the render builds in all: every string it makes, every string copied into a list or dict, and
  // kEntryBytes per list or dict entry it makes (freed ones are not given back).
  int64_t max_built_bytes = int64_t{256} << 20;
  static constexpr int64_t kEntryBytes = 128;
  // Lists and dicts within each other, in the context or built by the template (tojson, printing, ==).
  int max_value_depth = 256;
  // Nested evaluations at once: blocks, expressions and macro calls together (bounds the stack).
  int max_render_depth = 512;
  // Checked every kPollSteps steps, as is `cancelled` (which may be empty; called on the render's thread). A step
  // may scan a string as long as max_output_bytes (`'y' in s`: milliseconds), so few steps go between checks.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::function<bool()> cancelled;
  static constexpr int64_t kPollSteps = 16;
};

class ChatTemplate {
 public:
  // Parses a template; InvalidArgument "chat template line N: ..." for anything outside the subset.
  static Result<ChatTemplate> parse(std::string_view source);
  // Renders with `context`'s keys as the template's variables (objects keep their key order for tojson).
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const jinja::Template> template_;
};

// Where a model directory keeps its tokenizer config and chat templates (transformers' file names).
inline constexpr const char* kTokenizerConfigFile = "tokenizer_config.json";
inline constexpr const char* kChatTemplateFile = "chat_template.jinja";       // the default template
inline constexpr const char* kChatTemplateDir = "additional_chat_templates";  // <name>.jinja: named templates

// What a server needs from tokenizer_config.json: the chat template(s) and the special-token strings.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token, pad_token, unk_token;  // AddedToken objects -> content
  // Whether encoding with special tokens adds bos_token before / eos_token after the text (Llama-style
  // tokenizers in transformers; the server's add_special_tokens).
  bool add_bos_token = false, add_eos_token = false;
  std::optional<ChatTemplate> chat_template;                              // "chat_template" (or its "default")
  std::map<std::string, ChatTemplate> named_templates;                    // a list form's other entries

  // Loads `path`: a tokenizer_config.json file, or a model directory holding tokenizer_config.json and/or
  // chat_template.jinja (and additional_chat_templates/<name>.jinja). As transformers loads a directory, template
  // files, when there are any, replace every template of tokenizer_config.json: chat_template.jinja is the
  // default, each <name>.jinja a named one. Errors name the file (and the template's line).
  static Result<TokenizerConfig> load(const std::filesystem::path& path);
  static Result<TokenizerConfig> from_json_text(std::string_view json_text,
                                                std::string_view source = "tokenizer_config.json");

  // Renders a chat as transformers' apply_chat_template(tokenize=False) does. `request` holds "messages"
  // and optionally "tools", "add_generation_prompt" and any template keyword (e.g. "enable_thinking").
  // The variables are the special tokens (bos_token, eos_token, pad_token, unk_token), then the request's
  // keys, with tools = None and add_generation_prompt = false where the request has none. The "tool_use"
  // template is used when tools are given and the config names one.
  Result<std::string> render_chat(const nlohmann::ordered_json& request, const RenderLimits& limits = {}) const;
};

}  // namespace genbridge::text
