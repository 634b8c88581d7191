#pragma once
// The OpenAI-compatible request and response bodies of `genbridge serve`: parsing and validating
// /v1/completions and /v1/chat/completions requests (every field of OpenAI's API and of vLLM's extensions
// is honoured or refused, never ignored: tools/serve/request_fields.h lists them, docs/serving.md's field
// table says what each does; every refusal is an OpenAI-style error object with a message naming the field,
// the value and the rule), stop strings matched across token boundaries, and the response / server-sent-event
// JSON. No HTTP here (tools/serve/http_server.cpp).

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/engine/sampler.h"
#include "text/chat_template.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"
#include "tools/serve/reasoning.h"
#include "tools/serve/tool_calls.h"

namespace genbridge::text::grammar {
class CompiledGrammar;
}

namespace genbridge::serve {

class StructuredSupport;

// {"error": {"message", "type", "param", "code"}} with the HTTP status it goes with.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
};
nlohmann::json error_json(const ApiError& e);

// The sampling defaults of a served model: generation_config.json's (vLLM's `--generation-config auto`),
// then --override-generation-config's; a request's own value wins. Unset: the API's default.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> max_tokens;  // generation_config.json's max_new_tokens
};

// What the server knows about the model it serves.
struct ServedModel {
  std::vector<std::string> names;  // --served-model-name (repeatable); names[0] when a request gives no "model"
  const text::Tokenizer* tokenizer = nullptr;
  const text::TokenizerConfig* tokenizer_config = nullptr;  // chat templates (--chat-template applied); may be null
  // Every end-of-generation token (tokenizer_config.json's eos_token and generation_config.json's
  // eos_token_id, one or a list): generating any of them ends a choice (unless ignore_eos); never shown.
  std::vector<int32_t> eos_tokens;
  SamplingDefaults defaults;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;  // --reasoning-parser
  std::string system_fingerprint;  // "fp_" + a hash of the build, the weights and the settings that shape outputs
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t kv_pages = 0, kv_page_size = 0, kv_memory_mb = 0;
  int default_max_tokens = 256;
  // The most engine sequences one request may start (prompts x best_of): every one is queued at once.
  int64_t max_sequences = 64;
  bool priority_scheduling = false;  // --scheduling-policy priority: a request's "priority" orders its start
  // Tool calls and structured outputs: the vocabulary trie, the template's tool-call format, compiled grammars
  // (tools/serve/structured_output.h); null: none of them is served.
  std::shared_ptr<StructuredSupport> structured;

  const std::string& name() const { return names.front(); }
  bool serves(std::string_view name) const;
};

// One prompt of a request: its token ids, and its text (what `echo` shows).
struct Prompt {
  std::vector<int32_t> ids;
  std::string text;
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  std::string model;               // the name the response gives: the request's "model", or the first served name
  std::string request_id;          // vLLM's "request_id" (the response id's suffix); empty: the server makes one
  std::vector<Prompt> prompts;     // /v1/completions: one per prompt of a list; chat: one
  int n = 1;                       // choices returned per prompt
  int best_of = 1;                 // sequences generated per prompt (>= n): the n with the highest summed logprob
  bool echo = false;               // completions: the prompt's text (and logprobs) before each choice's
  std::string echo_text;           // chat: the last message's content, before the reply's (vLLM's echo)
  std::string role = "assistant";  // chat: the reply's role (the last message's with add_generation_prompt false)
  bool return_token_ids = false;   // extension: "return_token_ids": true adds each choice's token ids
  bool include_usage = false;      // "stream_options": {"include_usage": true}: a last chunk with usage
  bool continuous_usage = false;   // "stream_options": {"continuous_usage_stats": true}: usage in every chunk
  bool ignore_eos = false;         // extension (as vLLM's): generate past the eos tokens
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool return_tokens_as_token_ids = false;  // logprobs name tokens "token_id:<id>"
  bool include_reasoning = true;            // chat with --reasoning-parser: reasoning_content is sent
  // Log-probabilities: -1 none; k in 0..20 each token's and the k most likely ones' (/v1/completions:
  // "logprobs": k; /v1/chat/completions: "logprobs": true with "top_logprobs": k, default 0).
  int logprobs = -1;
  int max_tokens = 16;  // completions: 0 only with echo (the prompt alone)
  engine::SamplingParams sampling;
  bool seeded = false;                  // "seed" was given (else the server draws one)
  std::vector<std::string> stop;        // stop strings
  std::vector<int32_t> stop_token_ids;  // the request's own stop tokens (stop_reason names them)
  int32_t priority = 0;                 // vLLM's "priority" (engine::Request::priority)
  // The grammar every choice's output follows (response_format, guided_*, structured_outputs, tool_choice
  // "required" or named; each engine sequence gets a matcher of its own); null: none.
  std::shared_ptr<const text::grammar::CompiledGrammar> grammar;
  // Tool calls are parsed out of each choice's content in this format (kNone: tools not given, tool_choice
  // "none", or a template whose format the server does not know), at most max_tool_calls of them per choice
  // (1 with parallel_tool_calls false).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  int max_tool_calls = 0;
  // Chat: what the template that rendered the prompt (the model's, or the request's chat_template) does with tool
  // calls.
  TemplateToolSupport template_tools;

  int64_t prompt_tokens() const;
  // Whether prompt logprobs are computed (completions' echo with logprobs): the prompt is fed as forced tokens.
  bool prompt_logprobs() const { return echo && logprobs >= 0; }
};

// The deepest nesting of arrays and objects a request body may have (docs/serving.md, "Limits"): the
// parser, the copies and the dumps of a JSON value recurse once per level, so a body nested deeper is
// refused before it is parsed. An OpenAI request nests a handful of levels (a tool's JSON schema a few
// more).
constexpr int kMaxJsonDepth = 128;
// The byte offset of the first bracket of `text` that opens level max_depth + 1 (arrays and objects,
// counted outside strings), or nullopt when `text` nests no deeper than `max_depth`. Malformed JSON is the
// parser's to report.
std::optional<size_t> json_too_deep_at(std::string_view text, int max_depth);

// The body of a request as an object with the request's key order (a chat template's tojson prints it so),
// or the error (nesting, JSON, a number beyond a double, not an object).
std::variant<nlohmann::ordered_json, ApiError> parse_body(const std::string& text);

// Parses and validates a request body for the model (its nesting first, kMaxJsonDepth). `chat`:
// /v1/chat/completions, whose chat template renders within `render_limits` (a limit: 400 naming it; its
// deadline: 504; cancelled: 503). An unknown model is 404 (model_not_found).
std::variant<ParsedRequest, ApiError> parse_request(const std::string& body, bool chat, const ServedModel& model,
                                                    const text::RenderLimits& render_limits = {});

// POST /tokenize ({"prompt"} or {"messages", ...}, vLLM's) and POST /detokenize ({"tokens"}): the response body.
std::variant<nlohmann::json, ApiError> tokenize(const std::string& body, const ServedModel& model,
                                                const text::RenderLimits& render_limits = {});
std::variant<nlohmann::json, ApiError> detokenize(const std::string& body, const ServedModel& model);

// Decoded text of a generation with stop strings (vLLM's semantics): text is released only once it cannot
// be the start of a stop string; a completed stop string ends the text (it is released with the text when
// `include_stop`, and nothing after it ever is). A stop string must end in the text of a token after the
// first `min_tokens` ones.
class TextStream {
 public:
  TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stops, bool include_stop = false,
             int min_tokens = 0, bool skip_special_tokens = true);
  // The text `token` makes safe to send (possibly empty). Once stopped(), returns "" for every token.
  std::string push(int32_t token);
  // The rest at the end of the generation (held bytes included, unless a stop string completes in them).
  std::string finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the text (empty while none did).
  const std::string& stop_string() const { return stop_string_; }
  // Positions in the decoded text (bytes, and characters = code points): everything the pushed tokens
  // decoded to so far, and what of it has been released. Released text is a prefix of decoded text.
  size_t decoded_bytes() const { return decoded_bytes_; }
  size_t decoded_chars() const { return decoded_chars_; }
  size_t released_bytes() const { return released_bytes_; }

 private:
  std::string release();
  void take_decoded(const std::string& s);
  text::StreamDecoder decoder_;
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  int min_tokens_ = 0, pushed_ = 0;
  std::string held_;        // decoded, not yet released; starts at byte released_bytes_ of the text
  size_t search_from_ = 0;  // absolute byte: a stop string must end after it (min_tokens)
  bool stopped_ = false;
  std::string stop_string_;
  size_t decoded_bytes_ = 0, decoded_chars_ = 0, released_bytes_ = 0;
};

// The logprobs of a generation, released together with its text: a token's entry goes out once the text
// from its first byte on has been released (in the same chunk as that text), so a token whose text starts
// inside a stop string (or after it) is never sent, like the text itself.
struct LogprobEntry {
  engine::TokenLogprobs logprobs;
  size_t text_offset = 0;     // characters (code points) of the generated text before this token's text
  bool prompt_first = false;  // the prompt's first token (echo): no logprob (null), as OpenAI shows it
};
class LogprobQueue {
 public:
  // Call before TextStream::push(token) with the stream's decoded_bytes() and decoded_chars().
  void add(engine::TokenLogprobs lp, size_t start_byte, size_t start_char);
  // The entries whose text starts before `released_bytes` (every entry when `all`: the generation ended
  // without a stop string), in order.
  std::vector<LogprobEntry> take(size_t released_bytes, bool all);

 private:
  std::vector<std::pair<size_t, LogprobEntry>> pending_;  // (start byte, entry)
};

// The logprobs entries of an echoed prompt (completions' echo with logprobs): its first token's with no
// logprob, then `fed[i]` for token i + 1 (the forced tokens' logprobs), offsets in characters of the prompt's
// text; `*chars` receives the text's length in characters.
std::vector<LogprobEntry> prompt_logprob_entries(const text::Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                                                 const std::vector<engine::TokenLogprobs>& fed, size_t* chars);

// The "logprobs" object of a choice (or of one chunk's choice) for `entries`; null when the request asked
// for none. Completions: OpenAI's legacy {tokens, token_logprobs, top_logprobs, text_offset}; chat:
// {content: [{token, logprob, bytes, top_logprobs}]}. A token's text is its bytes (a byte-level token that
// is part of a character shows U+FFFD; "bytes" holds the exact bytes), or "token_id:<id>" with
// return_tokens_as_token_ids. `offset_shift`: characters added to every text_offset (an echoed prompt's).
nlohmann::json logprobs_json(const ParsedRequest& r, const text::Tokenizer& tokenizer,
                             const std::vector<LogprobEntry>& entries, size_t offset_shift = 0);

// Response bodies. `created`: Unix seconds.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

// One choice as a response (message) or a chunk (delta) carries it.
struct ChoiceOut {
  int index = 0;
  std::string text;                     // content (chat) or text (completions)
  std::string reasoning;                // chat with a reasoning parser: reasoning_content
  bool has_reasoning = false;           // reasoning_content is sent (a reasoning parser split the text)
  bool content_null = false;            // chat message: content null (reasoning or tool calls and no text)
  const char* finish_reason = nullptr;  // nullptr: not finished (chunks)
  nlohmann::json stop_reason;           // vLLM's: the stop string or token id; null otherwise
  std::vector<int32_t> token_ids;       // return_token_ids
  nlohmann::json logprobs;              // null: none
  bool first_chat_chunk = false;        // the delta names the role
  nlohmann::json tool_calls;            // chat: the message's tool_calls (tool_calls_json) or the delta's
                                        // (tool_call_deltas_json); null: none
};
// OpenAI's tool_calls entries: a message's whole calls, or a chunk's deltas (a call's first delta carries its
// id, type and name).
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls);
nlohmann::json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas);
nlohmann::json completion_json(const ParsedRequest& r, const std::string& id, int64_t created,
                               const std::string& fingerprint, const std::vector<ChoiceOut>& choices,
                               const Usage& usage);
// One SSE chunk with one choice (or none: the usage chunk); `usage` when the request asked for it here.
nlohmann::json chunk_json(const ParsedRequest& r, const std::string& id, int64_t created,
                          const std::string& fingerprint, const ChoiceOut* choice, const std::optional<Usage>& usage);
// "data: <json>\n\n"
std::string sse(const nlohmann::json& j);

}  // namespace genbridge::serve
