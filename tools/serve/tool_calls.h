#pragma once
// Tool calls in the model's own format (docs/serving.md, "Tool calls and structured outputs"): which format
// the chat template writes (found once at start-up by rendering probe conversations with it), the grammar of
// the calls a request forces (tool_choice "required" or a named function), and the parser that turns the
// generated text into OpenAI `tool_calls`, whole or as streamed deltas.
//
// Formats (each as the model's template renders a call, and as the reference servers' parsers read it):
//   hermes       Qwen2.5 / Qwen3: <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, calls separated by \n
//   deepseek_v3
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```<｜tool▁call▁end｜>
//                (\n between calls) <｜tool▁calls▁end｜>
//   deepseek_v31
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> dsml
//   DeepSeek-V4 (and V3.2 with function_calls for tool_calls): <｜DSML｜tool_calls>\n
//                <｜DSML｜invoke name="f">\n<｜DSML｜parameter name="p" string="true|false">v</｜DSML｜parameter>\n
//                ...</｜DSML｜invoke>\n</｜DSML｜tool_calls> (string="true": the raw string; "false": JSON)

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "text/chat_template.h"
#include "text/grammar/grammar.h"

namespace genbridge::serve {

enum class ToolCallFormat { kNone, kHermes, kDeepSeekV3, kDeepSeekV31, kDsml, kDsmlFunctionCalls };
const char* tool_call_format_name(ToolCallFormat f);

// What a model's chat template does with tool calls.
struct TemplateToolSupport {
  ToolCallFormat format = ToolCallFormat::kNone;
  // An assistant turn with "content": null and tool calls renders its calls (DeepSeek-V3's template tests
  // `content is none`); when false the server passes "" instead of null (Qwen3's template needs a string).
  bool null_content = false;
};
// Renders probe conversations (a user turn, an assistant turn calling a probe tool) with `config`'s template.
TemplateToolSupport probe_template(const text::TokenizerConfig& config);

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };
struct Tool {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON Schema; an object with no properties when the tool has none
};
struct ToolRequest {
  std::vector<Tool> tools;
  ToolChoice choice = ToolChoice::kAuto;
  std::string named;     // kNamed: the function
  bool parallel = true;  // parallel_tool_calls: false allows one call
};

// The calls `request` forces (kRequired: one or more of its tools, one when !parallel; kNamed: one call of
// that tool), in `format`, with each tool's arguments following its parameters schema. InvalidArgument naming
// `tools[i].function.parameters...` for a schema outside the supported subset.
Result<text::grammar::Grammar> tool_call_grammar(ToolCallFormat format, const ToolRequest& request);

struct ToolCall {
  std::string id, name, arguments;  // arguments: JSON text of an object
};
// One streamed piece: content text and/or tool-call deltas (OpenAI's delta.tool_calls entries).
struct ToolCallDelta {
  int index = 0;
  bool first = false;  // carries id, type and name (arguments may follow in later deltas)
  std::string id, name, arguments;
};
struct ParseDelta {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Reads generated text, fed in pieces as it is released, and splits it into content and tool calls. Text
// before the first call is content; a piece that may be the start of a call's marker is held back until the
// next piece shows what it is. A call's name goes out once complete, its arguments as they arrive (their
// JSON text as the model wrote it; for dsml, one parameter at a time). Streamed and whole parses give the
// same calls, content and arguments. Text that breaks the format ends the parse: the rest, from the start
// of the broken call, is content (streamed: what was not sent yet).
class ToolCallParser {
 public:
  // `id_seed` makes the calls' ids ("call_" + 24 hex digits); `max_calls` (1 for parallel_tool_calls false):
  // calls past it are dropped.
  ToolCallParser(ToolCallFormat format, uint64_t id_seed, int max_calls = 1 << 30);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ParseDelta feed(const std::string& text);
  ParseDelta finish();
  int num_calls() const { return static_cast<int>(calls_.size()); }
  const std::vector<ToolCall>& calls() const { return calls_; }
  bool failed() const { return failed_; }

  // The whole output: content (empty when none) and calls; a broken format gives all of `text` as content and
  // no calls (as vLLM's parsers do).
  struct Whole {
    std::string content;
    std::vector<ToolCall> calls;
  };
  static Whole parse(ToolCallFormat format, const std::string& text, uint64_t id_seed, int max_calls = 1 << 30);

 private:
  enum class State;
  void run(ParseDelta* out, bool at_end);
  bool step(ParseDelta* out, bool at_end);  // false: needs more text
  void fail(ParseDelta* out);
  void begin_call(ParseDelta* out, const std::string& name);
  void add_arguments(ParseDelta* out, const std::string& text);
  bool end_call(ParseDelta* out);
  std::string next_id();

  ToolCallFormat format_;
  uint64_t seed_;
  int max_calls_;
  State state_;
  std::string buf_;    // text not consumed yet
  std::string block_;  // the current call's text so far (content again if it breaks)
  bool failed_ = false;
  std::vector<ToolCall> calls_;
  int dropped_ = 0;  // calls past max_calls_
  bool call_open_ = false, call_sent_ = false;
  std::string pending_args_;  // arguments read before the name (hermes with "arguments" first)
  // hermes: the call's JSON object, read one character at a time.
  struct Scan;
  std::unique_ptr<Scan> scan_;
  // dsml
  std::string param_name_;
  bool param_string_ = false;
  int params_ = 0;
};

}  // namespace genbridge::serve
