#pragma once
// The OpenAI-compatible request and response bodies of `genbridge serve`: parsing and validating
// /v1/completions and /v1/chat/completions requests (every refusal is an OpenAI-style error object with a
// message naming the field, the value and the rule), stop strings matched across token boundaries, and the
// response / server-sent-event JSON. No HTTP here (tools/serve/http_server.cpp).

#include <cstdint>
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

// What the server knows about the model it serves.
struct ServedModel {
  std::string name;  // the "model" every request must name
  const text::Tokenizer* tokenizer = nullptr;
  const text::TokenizerConfig* tokenizer_config = nullptr;  // nullptr: no tokenizer_config.json (no chat)
  std::vector<int32_t> stop_tokens;                         // end of generation (the eos token), never shown
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t kv_pages = 0, kv_page_size = 0, kv_memory_mb = 0;
  int default_max_tokens = 256;
  // Tool calls and structured outputs: the vocabulary trie, the template's tool-call format, compiled grammars
  // (tools/serve/structured_output.h); null: none of them is served.
  std::shared_ptr<StructuredSupport> structured;
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool return_token_ids = false;  // extension: "return_token_ids": true adds each choice's token ids
  bool include_usage = false;  // "stream_options": {"include_usage": true}: a last chunk with "choices": [] and usage
  bool ignore_eos = false;     // extension (as vLLM's): "ignore_eos": true generates past the eos token
  // Log-probabilities: -1 none; k in 0..20 each token's and the k most likely ones' (/v1/completions:
  // "logprobs": k; /v1/chat/completions: "logprobs": true with "top_logprobs": k, default 0).
  int logprobs = -1;
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  engine::SamplingParams sampling;
  bool seeded = false;  // "seed" was given (else the server draws one)
  std::vector<std::string> stop;
  // The grammar the output follows (response_format, guided_*, tool_choice "required" or named); null: none.
  std::shared_ptr<const text::grammar::CompiledGrammar> grammar;
  // Tool calls are parsed out of the output in this format (kNone: tools not given or tool_choice "none"), at
  // most max_tool_calls of them (1 with parallel_tool_calls false).
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  int max_tool_calls = 0;
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

// Parses and validates a request body for the model (its nesting first, kMaxJsonDepth). `chat`:
// /v1/chat/completions, whose chat template renders within `render_limits` (a limit: 400 naming it; its
// deadline: 504; cancelled: 503).
std::variant<ParsedRequest, ApiError> parse_request(const std::string& body, bool chat, const ServedModel& model,
                                                    const text::RenderLimits& render_limits = {});

// Decoded text of a generation with stop strings: text is released only once it cannot be the start of a
// stop string; a completed stop string ends the text (it and anything after it are never released).
class TextStream {
 public:
  TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stops);
  // The text `token` makes safe to send (possibly empty). Once stopped(), returns "" for every token.
  std::string push(int32_t token);
  // The rest at the end of the generation (held bytes included, unless a stop string completes in them).
  std::string finish();
  bool stopped() const { return stopped_; }
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
  std::string held_;
  bool stopped_ = false;
  size_t decoded_bytes_ = 0, decoded_chars_ = 0, released_bytes_ = 0;
};

// The logprobs of a generation, released together with its text: a token's entry goes out once the text
// from its first byte on has been released (in the same chunk as that text), so a token whose text starts
// inside a stop string (or after it) is never sent, like the text itself.
struct LogprobEntry {
  engine::TokenLogprobs logprobs;
  size_t text_offset = 0;  // characters (code points) of the generated text before this token's text
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

// The "logprobs" object of a choice (or of one chunk's choice) for `entries`; null when the request asked
// for none. Completions: OpenAI's legacy {tokens, token_logprobs, top_logprobs, text_offset}; chat:
// {content: [{token, logprob, bytes, top_logprobs}]}. A token's text is its bytes (a byte-level token that
// is part of a character shows U+FFFD; "bytes" holds the exact bytes).
nlohmann::json logprobs_json(const ParsedRequest& r, const text::Tokenizer& tokenizer,
                             const std::vector<LogprobEntry>& entries);

// Response bodies. `created`: Unix seconds; `id`: "cmpl-N" / "chatcmpl-N".
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);
nlohmann::json completion_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, const char* finish_reason, const Usage& usage,
                               const std::vector<int32_t>& token_ids,
                               const nlohmann::json& logprobs = nlohmann::json());
// One SSE chunk: `text` (content delta), `finish_reason` (nullptr: not the last), `usage` on the last one.
nlohmann::json chunk_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& model,
                          const std::string& text, const char* finish_reason, const std::optional<Usage>& usage,
                          bool first_chat_chunk, const std::vector<int32_t>& token_ids,
                          const nlohmann::json& logprobs = nlohmann::json());
// "data: <json>\n\n"
std::string sse(const nlohmann::json& j);

}  // namespace genbridge::serve
