#include "tools/serve/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "text/utf8.h"
#include "tools/serve/output_fields.h"
#include "tools/serve/request_fields.h"
#include "tools/serve/structured_output.h"

namespace genbridge::serve {

using nlohmann::json;
// Requests are read keeping their key order: a chat template's tojson prints messages and tools in the
// order the client wrote them, as transformers does (a key-sorted object would print them sorted).
using Json = nlohmann::ordered_json;

json error_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

bool ServedModel::serves(std::string_view name) const {
  return std::find(names.begin(), names.end(), name) != names.end();
}

int64_t ParsedRequest::prompt_tokens() const {
  int64_t n = 0;
  for (const Prompt& p : prompts) n += static_cast<int64_t>(p.ids.size());
  return n;
}

namespace {

constexpr float kMaxApiTemperature = 2.f;  // OpenAI's limit
constexpr int64_t kMaxChoices = 128;       // OpenAI's limit of n (and here of best_of)
constexpr size_t kMaxRequestIdBytes = 128;

// A JSON value as a message shows it: compact, at most 40 characters.
template <class J>
std::string shown(const J& v) {
  std::string s = v.dump(-1, ' ', false, J::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

ApiError bad(std::string param, std::string message) {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}
ApiError type_error(const std::string& name, const char* what, const Json& v) {
  return bad(name, fmt::format("'{}' must be {}, got {}.", name, what, shown(v)));
}

bool is_int(const Json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// The field's value, or nullptr when it is absent or null.
const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// Optional integer field in [lo, hi]; `rule` describes the range in the message.
std::optional<ApiError> get_int(const Json& body, const std::string& name, int64_t lo, int64_t hi, const char* rule,
                                std::optional<int64_t>* out) {
  const Json* v = field(body, name.c_str());
  if (!v) return std::nullopt;
  if (!is_int(*v)) return type_error(name, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return bad(name, fmt::format("'{}' must be {}, got {} (beyond a signed 64-bit integer).", name, rule, shown(*v)));
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return bad(name, fmt::format("'{}' must be {}, got {}.", name, rule, x));
  *out = x;
  return std::nullopt;
}

// Optional sampling parameter kept as float: a number `range` contains (checked on the float it becomes).
std::optional<ApiError> get_float(const Json& body, const std::string& name, const engine::FloatRange& range,
                                  std::optional<float>* out) {
  const Json* v = field(body, name.c_str());
  if (!v) return std::nullopt;
  if (!v->is_number()) return type_error(name, "a number", *v);
  const double x = v->get<double>();
  if (!range.contains(x)) return bad(name, fmt::format("'{}' must be {}, got {}.", name, range.rule(), shown(*v)));
  *out = static_cast<float>(x);
  return std::nullopt;
}

std::optional<ApiError> get_bool(const Json& body, const std::string& name, bool* out) {
  const Json* v = field(body, name.c_str());
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return type_error(name, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_string(const Json& body, const std::string& name, std::string* out) {
  const Json* v = field(body, name.c_str());
  if (!v) return std::nullopt;
  if (!v->is_string()) return type_error(name, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

// A list of token ids, each within the vocabulary; `name` as messages name it.
std::optional<ApiError> get_token_list(const Json& v, const std::string& name, int64_t vocab,
                                       std::vector<int32_t>* out) {
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const Json& t) { return is_int(t); })) {
    return type_error(name, "a list of token ids", v);
  }
  for (const Json& t : v) {
    const int64_t id = t.is_number_unsigned() && t.get<uint64_t>() > INT64_MAX ? INT64_MAX : t.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return bad(name, fmt::format("'{}' token {} is outside the vocabulary [0, {}).", name, shown(t), vocab));
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// "content" of a chat message as the reference servers pass it to the template: a string; a list of
// {"type": "text", "text": "..."} parts joined with "\n" (vLLM, llama.cpp); null or absent as "" (vLLM), except
// on an assistant turn with tool_calls when the template renders such a turn's calls from a null content
// (DeepSeek-V3's tests `content is none`; `null_content`, found by probing the template at start-up).
std::optional<ApiError> normalize_content(Json& msg, size_t i, bool null_content) {
  const std::string name = fmt::format("messages[{}].content", i);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    const bool calls = msg.value("role", Json()) == "assistant" && msg.contains("tool_calls") &&
                       msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
    msg["content"] = calls && null_content ? Json(nullptr) : Json("");
    return std::nullopt;
  }
  if (it->is_string()) return std::nullopt;
  if (!it->is_array()) return type_error(name, "a string, null or a list of text parts", *it);
  std::string joined;
  for (size_t p = 0; p < it->size(); ++p) {
    const Json& part = (*it)[p];
    if (!part.is_object() || part.value("type", Json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return bad(fmt::format("{}[{}]", name, p),
                 fmt::format("'{}[{}]' must be a text part {{\"type\": \"text\", \"text\": \"...\"}}, got {}; this "
                             "server takes text only.",
                             name, p, shown(part)));
    }
    if (p > 0) joined += "\n";
    joined += part["text"].get<std::string>();
  }
  *it = joined;
  return std::nullopt;
}

// A JSON number beyond a double's range (nlohmann's out_of_range 406, e.g. 1e400): the body is parsed again,
// only on this path, to find where the number sits, so that the error names the field.
ApiError number_overflow(const std::string& text, const json::out_of_range& e) {
  struct Frame {
    bool array = false;
    std::string key;
    size_t index = 0;
  };
  std::vector<Frame> stack;
  const json::parser_callback_t track = [&](int, json::parse_event_t event, json& v) {
    switch (event) {
      case json::parse_event_t::object_start:
        stack.push_back({});
        break;
      case json::parse_event_t::array_start:
        stack.push_back({.array = true});
        break;
      case json::parse_event_t::key:
        stack.back().key = v.get<std::string>();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:
        if (!stack.empty() && stack.back().array) ++stack.back().index;
        break;
    }
    return true;
  };
  try {
    const json reparsed = json::parse(text, track);
    stack.clear();  // not reached: the same text fails the same way
  } catch (const json::exception&) {
  }
  std::string path;
  for (const Frame& f : stack) path += f.array ? fmt::format("[{}]", f.index) : (path.empty() ? "" : ".") + f.key;
  // nlohmann's message ends "number overflow parsing '<token>'".
  std::string number = e.what();
  if (const size_t at = number.find("parsing '"); at != std::string::npos) {
    number = number.substr(at + 9);
    if (!number.empty() && number.back() == '\'') number.pop_back();
  }
  if (number.size() > 40) number = number.substr(0, 37) + "...";
  const std::string rule = "a number beyond the range of a double (magnitude at most 1.7976931348623157e+308)";
  if (e.id != 406) return bad(path, fmt::format("The request body cannot be read: {}.", e.what()));
  if (path.empty()) return bad("", fmt::format("The request body holds {}, {}.", number, rule));
  return bad(path, fmt::format("'{}' is {}, {}.", path, number, rule));
}

}  // namespace

std::optional<size_t> json_too_deep_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::nullopt;
}

std::variant<Json, ApiError> parse_body(const std::string& text) {
  if (auto at = json_too_deep_at(text, kMaxJsonDepth)) {
    return bad("", fmt::format("The request body nests arrays and objects more than {} levels deep (level {} opens at "
                               "byte {}); this server's limit is {} levels.",
                               kMaxJsonDepth, kMaxJsonDepth + 1, *at, kMaxJsonDepth));
  }
  Json body;
  try {
    body = Json::parse(text);
  } catch (const json::parse_error& e) {
    return bad("", fmt::format("The request body is not valid JSON (parse error at byte {}).", e.byte));
  } catch (const json::out_of_range& e) {
    return number_overflow(text, e);
  }
  if (!body.is_object()) return bad("", fmt::format("The request body must be a JSON object, got {}.", shown(body)));
  return body;
}

namespace {

const char* route_of(bool chat) { return chat ? "/v1/chat/completions" : "/v1/completions"; }

// The model the request names (optional: the first served name); an unknown one is 404.
std::optional<ApiError> parse_model(const Json& body, const ServedModel& model, std::string* name) {
  *name = model.name();
  const Json* m = field(body, "model");
  if (!m) return std::nullopt;
  if (!m->is_string()) return type_error("model", "a string", *m);
  const std::string asked = m->get<std::string>();
  if (!model.serves(asked)) {
    std::string served;
    for (const std::string& n : model.names) served += (served.empty() ? "'" : ", '") + n + "'";
    return ApiError{.http_status = 404,
                    .message = fmt::format("The model '{}' does not exist; this server serves {}.", asked, served),
                    .param = "model",
                    .code = "model_not_found"};
  }
  *name = asked;
  return std::nullopt;
}

// Every field of the body is one of request_fields() for this endpoint.
std::optional<ApiError> check_field_names(const Json& body, bool chat) {
  for (const auto& [key, value] : body.items()) {
    const RequestField* f = find_request_field(key);
    if (!f) return bad(key, fmt::format("Unrecognized request argument supplied: {}", key));
    if ((f->endpoints & (chat ? kChat : kCompletions)) == 0) {
      if (key == "top_logprobs") {
        return bad(key, "'top_logprobs' belongs to /v1/chat/completions; /v1/completions takes 'logprobs': k.");
      }
      return bad(key, fmt::format("'{}' belongs to {}, not {}.", key, route_of(!chat), route_of(chat)));
    }
  }
  return std::nullopt;
}

// Fields this server does not implement: refused by name (kRefused: any value; kDefaultOnly: anything but the
// default), and the identifiers and hints (accepted, checked for their type).
std::optional<ApiError> parse_unimplemented(const Json& body) {
  struct Refusal {
    const char* name;
    const char* why;
  };
  static constexpr Refusal kWhy[] = {
      {"suffix", "it inserts text after the completion (fill-in-the-middle), which this server does not do"},
      {"prompt_logprobs", "for the prompt's logprobs send 'echo': true with 'logprobs' to /v1/completions"},
      {"prompt_embeds", "prompts are text or token ids"},
      {"reasoning_effort", "how the model reasons is its chat template's (chat_template_kwargs, e.g. enable_thinking)"},
      {"verbosity", "the model decides the length of its reply"},
      {"audio", "it generates text only"},
      {"prediction", "it has no predicted outputs"},
      {"web_search_options", "it has no web search"},
      {"functions", "OpenAI deprecated it; declare 'tools'"},
      {"function_call", "OpenAI deprecated it; use 'tool_choice'"},
      {"logits_processors", "it loads no logits processors"},
      {"kv_transfer_params", "it has no disaggregated KV transfer"},
      {"vllm_xargs", "it has no custom extensions"},
      {"mm_processor_kwargs", "it takes text only"},
  };
  for (const Refusal& r : kWhy) {
    if (const Json* v = field(body, r.name)) {
      return bad(r.name, fmt::format("'{}' is not supported by this server: {}; got {}.", r.name, r.why, shown(*v)));
    }
  }
  if (const Json* v = field(body, "service_tier"); v && *v != "auto" && *v != "default") {
    return bad(
        "service_tier",
        fmt::format("'service_tier' must be \"auto\" or \"default\" (this server has one tier), got {}.", shown(*v)));
  }
  if (const Json* v = field(body, "store"); v && *v != false) {
    return bad("store", fmt::format("'store' must be false: this server stores no completions, got {}.", shown(*v)));
  }
  if (const Json* v = field(body, "metadata"); v && !(v->is_object() && v->empty())) {
    return bad("metadata",
               fmt::format("'metadata' tags stored completions, which this server does not keep: it must be empty, "
                           "got {}.",
                           shown(*v)));
  }
  if (const Json* v = field(body, "modalities"); v && *v != Json::array({"text"})) {
    return bad("modalities",
               fmt::format("'modalities' must be [\"text\"]: this server generates text only, got {}.", shown(*v)));
  }
  if (const Json* v = field(body, "use_beam_search"); v && *v != false) {
    return bad("use_beam_search",
               fmt::format("'use_beam_search' must be false: this server has no beam search, got {}.", shown(*v)));
  }
  if (const Json* v = field(body, "length_penalty"); v && *v != 1) {
    return bad("length_penalty", fmt::format("'length_penalty' applies to beam search, which this server does not do: "
                                             "it must be 1, got {}.",
                                             shown(*v)));
  }
  if (const Json* v = field(body, "bad_words"); v && !(v->is_array() && v->empty())) {
    return bad("bad_words",
               fmt::format("'bad_words' is not supported by this server: it must be empty, got {}.", shown(*v)));
  }
  for (const char* id : {"user", "safety_identifier", "prompt_cache_key", "cache_salt"}) {
    if (const Json* v = field(body, id); v && !v->is_string()) return type_error(id, "a string", *v);
  }
  if (const Json* v = field(body, "cache_salt"); v && v->get<std::string>().empty()) {
    return bad("cache_salt", "'cache_salt' must be a non-empty string.");
  }
  return std::nullopt;
}

// stop strings and tokens, streaming and the output options.
std::optional<ApiError> parse_stop_and_stream(const Json& body, const ServedModel& model, ParsedRequest& r) {
  if (const Json* v = field(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array() && std::all_of(v->begin(), v->end(), [](const Json& s) { return s.is_string(); })) {
      if (v->size() > 4) return bad("stop", fmt::format("'stop' holds {} strings; at most 4 are allowed.", v->size()));
      for (const Json& s : *v) r.stop.push_back(s.get<std::string>());
    } else {
      return type_error("stop", "a string or a list of strings", *v);
    }
    for (const auto& s : r.stop) {
      if (s.empty()) return bad("stop", "'stop' strings must not be empty.");
    }
  }
  if (const Json* v = field(body, "stop_token_ids")) {
    if (auto e = get_token_list(*v, "stop_token_ids", model.vocab_size, &r.stop_token_ids)) return e;
  }
  if (auto e = get_bool(body, "stream", &r.stream)) return e;
  if (const Json* v = field(body, "stream_options")) {
    if (!v->is_object()) return type_error("stream_options", "an object", *v);
    if (!r.stream) return bad("stream_options", "'stream_options' is only allowed with 'stream': true.");
    for (const auto& [key, value] : v->items()) {
      const std::string name = "stream_options." + key;
      if (key != "include_usage" && key != "continuous_usage_stats") {
        return bad(name, fmt::format("'{}' is not a stream option (include_usage, continuous_usage_stats).", name));
      }
      if (!value.is_null() && !value.is_boolean()) return type_error(name, "a boolean", value);
    }
    (void)get_bool(*v, "include_usage", &r.include_usage);
    (void)get_bool(*v, "continuous_usage_stats", &r.continuous_usage);
  }
  for (const auto& [name, out] : {std::pair<const char*, bool*>{"return_token_ids", &r.return_token_ids},
                                  {"ignore_eos", &r.ignore_eos},
                                  {"include_stop_str_in_output", &r.include_stop_str_in_output},
                                  {"skip_special_tokens", &r.skip_special_tokens},
                                  {"return_tokens_as_token_ids", &r.return_tokens_as_token_ids},
                                  {"include_reasoning", &r.include_reasoning}}) {
    if (auto e = get_bool(body, name, out)) return e;
  }
  // Fast tokenizers (tokenizer.json) join special tokens without spaces whatever this says, in transformers and
  // vLLM alike: checked, and as vLLM with such a tokenizer, without effect.
  bool spaces = true;
  if (auto e = get_bool(body, "spaces_between_special_tokens", &spaces)) return e;
  if (auto e = get_string(body, "request_id", &r.request_id)) return e;
  if (const Json* v = field(body, "request_id")) {
    const bool printable = std::all_of(r.request_id.begin(), r.request_id.end(),
                                       [](char c) { return c > ' ' && c < 0x7f && c != '"' && c != '\\'; });
    if (r.request_id.empty() || r.request_id.size() > kMaxRequestIdBytes || !printable) {
      return bad("request_id",
                 fmt::format("'request_id' must be 1 to {} printable ASCII characters without spaces, quotes or "
                             "backslashes, got {}.",
                             kMaxRequestIdBytes, shown(*v)));
    }
  }
  return std::nullopt;
}

// The number of choices (n, best_of), log-probabilities and echo.
// vLLM's "priority": an int32; anything but 0 needs --scheduling-policy priority.
std::optional<ApiError> parse_priority(const Json& body, const ServedModel& model, ParsedRequest& r) {
  std::optional<int64_t> priority;
  const std::string rule =
      fmt::format("an integer in [{}, {}]", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  if (auto e = get_int(body, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                       rule.c_str(), &priority)) {
    return e;
  }
  if (priority.value_or(0) != 0 && !model.priority_scheduling) {
    return bad("priority", fmt::format("'priority' is {} but this server starts requests in arrival order; start it "
                                       "with --scheduling-policy priority to order them by priority.",
                                       *priority));
  }
  r.priority = static_cast<int32_t>(priority.value_or(0));
  return std::nullopt;
}

std::optional<ApiError> parse_choice_options(const Json& body, bool chat, ParsedRequest& r) {
  std::optional<int64_t> n, best_of;
  const std::string choices_rule = fmt::format("an integer in [1, {}]", kMaxChoices);
  if (auto e = get_int(body, "n", 1, kMaxChoices, choices_rule.c_str(), &n)) return e;
  if (auto e = get_int(body, "best_of", 1, kMaxChoices, choices_rule.c_str(), &best_of)) return e;
  r.n = static_cast<int>(n.value_or(1));
  r.best_of = static_cast<int>(best_of.value_or(r.n));
  if (r.best_of < r.n) {
    return bad("best_of", fmt::format("'best_of' must be at least 'n' ({}), got {}.", r.n, r.best_of));
  }
  if (r.best_of > r.n && r.stream) {
    return bad("best_of", fmt::format("'best_of' {} > 'n' {} cannot be streamed: the best {} of {} are known only when "
                                      "every one has ended.",
                                      r.best_of, r.n, r.n, r.best_of));
  }
  // Log-probabilities (0..20 alternatives, OpenAI's limit).
  const std::string logprobs_rule = fmt::format("between 0 and {}", engine::kMaxLogprobs);
  if (!chat) {
    std::optional<int64_t> k;
    if (auto e = get_int(body, "logprobs", 0, engine::kMaxLogprobs, logprobs_rule.c_str(), &k)) return e;
    if (k) r.logprobs = static_cast<int>(*k);
  } else {
    bool want = false;
    if (auto e = get_bool(body, "logprobs", &want)) return e;
    std::optional<int64_t> k;
    if (auto e = get_int(body, "top_logprobs", 0, engine::kMaxLogprobs, logprobs_rule.c_str(), &k)) return e;
    if (k && !want) return bad("top_logprobs", "'top_logprobs' requires 'logprobs': true.");
    if (want) r.logprobs = static_cast<int>(k.value_or(0));
  }
  if (auto e = get_bool(body, "echo", &r.echo)) return e;
  return std::nullopt;
}

// The tokens `text` encodes to, with the tokenizer's special tokens when `add_special_tokens` (BOS / EOS as
// tokenizer_config.json's add_bos_token / add_eos_token ask, as transformers' Llama-style tokenizers add them).
std::variant<std::vector<int32_t>, ApiError> encode(const ServedModel& model, const std::string& text,
                                                    bool add_special_tokens, const std::string& param) {
  auto ids = model.tokenizer->encode(text);
  if (!ids.ok()) return bad(param, fmt::format("'{}' cannot be encoded: {}", param, ids.status().message()));
  std::vector<int32_t> out = std::move(ids).value();
  const text::TokenizerConfig* tc = model.tokenizer_config;
  if (add_special_tokens && tc) {
    if (tc->add_bos_token && tc->bos_token) {
      if (auto id = model.tokenizer->token_to_id(*tc->bos_token)) out.insert(out.begin(), *id);
    }
    if (tc->add_eos_token && tc->eos_token) {
      if (auto id = model.tokenizer->token_to_id(*tc->eos_token)) out.push_back(*id);
    }
  }
  return out;
}

// /v1/completions' prompt: a string, a list of strings, a list of token ids or a list of such lists.
std::optional<ApiError> parse_completion_prompts(const Json& body, const ServedModel& model, ParsedRequest& r) {
  const Json* p = field(body, "prompt");
  if (!p) return bad("prompt", "'prompt' is required.");
  bool add_special = true;
  if (auto e = get_bool(body, "add_special_tokens", &add_special)) return e;
  const auto from_text = [&](const std::string& text, const std::string& param) -> std::optional<ApiError> {
    auto ids = encode(model, text, add_special, param);
    if (auto* e = std::get_if<ApiError>(&ids)) return *e;
    r.prompts.push_back(Prompt{.ids = std::get<std::vector<int32_t>>(std::move(ids)), .text = text});
    return std::nullopt;
  };
  const auto from_ids = [&](const Json& v, const std::string& param) -> std::optional<ApiError> {
    Prompt q;
    if (auto e = get_token_list(v, param, model.vocab_size, &q.ids)) return e;
    q.text = model.tokenizer->decode(q.ids);
    r.prompts.push_back(std::move(q));
    return std::nullopt;
  };
  const char* kinds = "a string, a list of strings, a list of token ids or a list of token-id lists";
  if (p->is_string()) return from_text(p->get<std::string>(), "prompt");
  if (!p->is_array() || p->empty()) return type_error("prompt", kinds, *p);
  if (std::all_of(p->begin(), p->end(), [](const Json& v) { return is_int(v); })) {
    // The message names 'prompt' as before a list of prompts existed.
    return from_ids(*p, "prompt");
  }
  const bool strings = std::all_of(p->begin(), p->end(), [](const Json& v) { return v.is_string(); });
  const bool lists = std::all_of(p->begin(), p->end(), [](const Json& v) { return v.is_array(); });
  if (!strings && !lists) return type_error("prompt", kinds, *p);
  for (size_t i = 0; i < p->size(); ++i) {
    const std::string param = p->size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
    if (auto e = strings ? from_text((*p)[i].get<std::string>(), param) : from_ids((*p)[i], param)) return e;
  }
  return std::nullopt;
}

// transformers' continue_final_message: the rendered chat ends right after the final message's content (the
// template's end of turn cut off), so the model continues that message.
std::optional<ApiError> cut_after_final_message(const std::string& final_message, std::string* rendered) {
  const auto strip = [](std::string_view s, bool left, bool right) {
    const char* ws = " \t\n\r\f\v";
    if (left) {
      const size_t a = s.find_first_not_of(ws);
      s = a == std::string_view::npos ? std::string_view() : s.substr(a);
    }
    if (right) {
      const size_t b = s.find_last_not_of(ws);
      s = b == std::string_view::npos ? std::string_view() : s.substr(0, b + 1);
    }
    return s;
  };
  const std::string_view stripped = strip(final_message, true, true), lstripped = strip(final_message, true, false);
  const size_t at = stripped.empty() ? std::string::npos : rendered->rfind(stripped);
  if (at == std::string::npos) {
    return bad("continue_final_message",
               "'continue_final_message' is set but the final message does not appear in the chat after applying the "
               "chat template.");
  }
  const bool kept = rendered->compare(at, lstripped.size(), lstripped) == 0;
  rendered->resize(at + (kept ? lstripped.size() : stripped.size()));
  return std::nullopt;
}

// /v1/chat/completions' messages (and /tokenize's) rendered by the chat template: the request's
// "chat_template", else the model's; with its keywords, tools and documents.
std::variant<std::string, ApiError> render_chat(const Json& body, const ServedModel& model,
                                                const text::RenderLimits& render_limits, ParsedRequest* r) {
  text::TokenizerConfig config;
  if (model.tokenizer_config) config = *model.tokenizer_config;
  std::string source;
  if (auto e = get_string(body, "chat_template", &source)) return *e;
  if (field(body, "chat_template")) {
    auto t = text::ChatTemplate::parse(source);
    if (!t.ok()) return bad("chat_template", "The request's 'chat_template' cannot be used: " + t.status().message());
    config.chat_template = std::move(t).value();
    config.named_templates.clear();
  }
  // What the template does with tool calls: the model's, found at start-up; a request's own template is probed
  // here (a few renders of a probe conversation).
  TemplateToolSupport tools = model.structured ? model.structured->template_tools() : TemplateToolSupport{};
  if (field(body, "chat_template")) tools = probe_template(config);
  if (r) r->template_tools = tools;
  if (!config.chat_template) {
    return bad("messages",
               "This model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja, "
               "no --chat-template); use /v1/completions or give 'chat_template'.");
  }
  const Json* ms = field(body, "messages");
  if (!ms) return bad("messages", "'messages' is required.");
  if (!ms->is_array()) return type_error("messages", "a list of messages", *ms);
  if (ms->empty()) return bad("messages", "'messages' is empty.");
  const bool null_content = tools.null_content;
  Json messages = *ms;
  for (size_t i = 0; i < messages.size(); ++i) {
    Json& msg = messages[i];
    if (!msg.is_object()) return type_error(fmt::format("messages[{}]", i), "an object", msg);
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) {
      return bad(fmt::format("messages[{}].role", i), fmt::format("'messages[{}].role' must be a string.", i));
    }
    if (auto e = normalize_content(msg, i, null_content)) return *e;
  }
  bool add_generation_prompt = true, continue_final = false;
  if (auto e = get_bool(body, "add_generation_prompt", &add_generation_prompt)) return *e;
  if (auto e = get_bool(body, "continue_final_message", &continue_final)) return *e;
  if (continue_final && add_generation_prompt) {
    return bad("continue_final_message",
               "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true (add_generation_prompt "
               "is true unless the request sets it to false).");
  }
  const std::string last_role = messages.back()["role"].get<std::string>();
  std::string final_content;
  if (auto c = messages.back().find("content"); c != messages.back().end() && c->is_string()) {
    final_content = c->get<std::string>();
  }
  if (continue_final && final_content.empty()) {
    return bad("continue_final_message",
               "'continue_final_message' is set but the final message has no text content to continue.");
  }
  Json req = Json::object();
  req["messages"] = std::move(messages);
  req["add_generation_prompt"] = add_generation_prompt;
  if (const Json* t = field(body, "tools")) {
    if (!t->is_array()) return type_error("tools", "a list of tools", *t);
    req["tools"] = *t;
  }
  if (const Json* d = field(body, "documents")) {
    if (!d->is_array() || !std::all_of(d->begin(), d->end(), [](const Json& x) { return x.is_object(); })) {
      return type_error("documents", "a list of objects", *d);
    }
    req["documents"] = *d;
  }
  if (const Json* k = field(body, "chat_template_kwargs")) {
    if (!k->is_object()) return type_error("chat_template_kwargs", "an object", *k);
    for (const auto& [key, v] : k->items()) req[key] = v;
  }
  auto rendered = config.render_chat(req, render_limits);
  if (!rendered.ok()) {
    const Status& st = rendered.status();
    if (st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kUnavailable) {
      const bool late = st.code() == StatusCode::kDeadlineExceeded;
      return ApiError{
          .http_status = late ? 504 : 503,
          .message = (late ? "The request did not finish within --request-timeout: " : "The request was cancelled: ") +
                     st.message(),
          .type = "server_error",
          .code = late ? "timeout" : "cancelled"};
    }
    return bad("messages", "The chat template failed: " + st.message());
  }
  std::string text = std::move(rendered).value();
  if (continue_final) {
    if (auto e = cut_after_final_message(final_content, &text)) return *e;
  }
  if (r) {
    // vLLM: the reply's role is the assistant's, or with add_generation_prompt false the last message's; echo
    // puts the last message's content before the reply when it has that role.
    r->role = add_generation_prompt ? "assistant" : last_role;
    if (r->echo && last_role == r->role) r->echo_text = final_content;
  }
  return text;
}

std::optional<ApiError> parse_chat_prompt(const Json& body, const ServedModel& model,
                                          const text::RenderLimits& render_limits, ParsedRequest& r) {
  auto text = render_chat(body, model, render_limits, &r);
  if (auto* e = std::get_if<ApiError>(&text)) return *e;
  bool add_special = false;
  if (auto e = get_bool(body, "add_special_tokens", &add_special)) return e;
  auto ids = encode(model, std::get<std::string>(text), add_special, "messages");
  if (auto* e = std::get_if<ApiError>(&ids)) return *e;
  r.prompts.push_back(Prompt{.ids = std::get<std::vector<int32_t>>(std::move(ids))});
  return std::nullopt;
}

// max_tokens (or max_completion_tokens): every prompt within the context and the KV pool.
std::optional<ApiError> parse_length(const Json& body, bool chat, const ServedModel& model, ParsedRequest& r) {
  std::optional<int64_t> max_tokens;
  const char* max_name = "max_tokens";
  if (chat && field(body, "max_completion_tokens")) max_name = "max_completion_tokens";
  // 0 only with echo (completions): the prompt alone, as vLLM answers it.
  const bool echo_only = !chat && r.echo;
  if (auto e = get_int(body, max_name, echo_only ? 0 : 1, std::numeric_limits<int64_t>::max(),
                       echo_only ? "at least 0 (0: the echoed prompt alone)" : "at least 1", &max_tokens)) {
    return e;
  }
  if (max_tokens == 0 && r.best_of > 1) {
    return bad(max_name, fmt::format("'{}' 0 (the echoed prompt alone) takes one choice, but 'n' / 'best_of' is {}.",
                                     max_name, r.best_of));
  }
  const int64_t max_pos = model.max_position_embeddings;
  int64_t longest = 0;
  for (const Prompt& p : r.prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
  if (longest >= max_pos) {
    ApiError e = bad(chat ? "messages" : "prompt",
                     fmt::format("The prompt has {} tokens but this model's maximum context length is {} tokens (the "
                                 "prompt and at least one completion token must fit).",
                                 longest, max_pos));
    e.code = "context_length_exceeded";
    return e;
  }
  if (max_tokens) {
    if (*max_tokens > max_pos - longest) {
      ApiError e = bad(max_name, fmt::format("This model's maximum context length is {} tokens, but the request asks "
                                             "for {} ({} prompt + {} completion tokens); lower '{}' or shorten the "
                                             "prompt.",
                                             max_pos, longest + *max_tokens, longest, *max_tokens, max_name));
      e.code = "context_length_exceeded";
      return e;
    }
    r.max_tokens = static_cast<int>(*max_tokens);
  } else {
    // Default: generation_config.json's max_new_tokens or --default-max-tokens, within the context and the pool.
    int64_t cap = std::min<int64_t>(model.defaults.max_tokens.value_or(model.default_max_tokens), max_pos - longest);
    cap = std::min(cap, model.kv_pages * model.kv_page_size - longest + 1);
    r.max_tokens = static_cast<int>(std::max<int64_t>(cap, 1));
  }
  // The engine generates at least one token (an echo of the prompt alone discards it).
  const int64_t generated = std::max(r.max_tokens, 1);
  const int64_t kv_tokens = longest + generated - 1;
  const int64_t pages = (kv_tokens + model.kv_page_size - 1) / model.kv_page_size;
  if (pages > model.kv_pages) {
    return bad(
        max_tokens ? max_name : "prompt",
        fmt::format("The request needs {} KV pages ({} prompt + {} completion tokens at {} tokens per page) but "
                    "the server's KV pool holds {} pages (--kv-memory-mb {}); lower '{}' or shorten the prompt.",
                    pages, longest, generated, model.kv_page_size, model.kv_pages, model.kv_memory_mb, max_name));
  }
  return std::nullopt;
}

// temperature, top_p, top_k, seed, min_p, the penalties, logit_bias, allowed_token_ids and min_tokens; a field
// the request leaves out takes the model's default (generation_config.json), else the API's.
std::optional<ApiError> parse_sampling(const Json& body, const ServedModel& model, ParsedRequest& r) {
  // The sampler's ranges (engine::kTemperatureRange, ...); temperature at most 2 as OpenAI's.
  std::optional<float> temperature, top_p, min_p, presence, frequency, repetition;
  std::optional<int64_t> top_k, min_tokens;
  if (auto e = get_float(body, "temperature", engine::kTemperatureRange.with_hi(kMaxApiTemperature), &temperature)) {
    return e;
  }
  if (auto e = get_float(body, "top_p", engine::kTopPRange, &top_p)) return e;
  const std::string top_k_rule = fmt::format("-1 or 0 (no limit) or an integer in [1, {}]", engine::kMaxTopK);
  if (auto e = get_int(body, "top_k", -1, engine::kMaxTopK, top_k_rule.c_str(), &top_k)) return e;
  if (auto e = get_float(body, "min_p", engine::kMinPRange, &min_p)) return e;
  if (auto e = get_float(body, "presence_penalty", engine::kPenaltyRange, &presence)) return e;
  if (auto e = get_float(body, "frequency_penalty", engine::kPenaltyRange, &frequency)) return e;
  if (auto e = get_float(body, "repetition_penalty", engine::kRepetitionPenaltyRange, &repetition)) return e;
  if (const Json* v = field(body, "seed")) {
    // Any 64-bit integer, signed or not: a negative seed s is the seed s + 2^64.
    if (!is_int(*v)) {
      if (!v->is_number()) return type_error("seed", "an integer", *v);
      const double x = v->get<double>();
      if (x != std::floor(x)) return type_error("seed", "an integer", *v);
      return bad("seed",
                 fmt::format("'seed' must be an integer in [{}, {}], got {}.", std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<uint64_t>::max(), shown(*v)));
    }
    r.sampling.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
    r.seeded = true;
  }
  const SamplingDefaults& d = model.defaults;
  r.sampling.temperature = temperature.value_or(d.temperature.value_or(1.f));
  r.sampling.top_p = top_p.value_or(d.top_p.value_or(1.f));
  r.sampling.top_k = static_cast<int>(std::max<int64_t>(top_k.value_or(d.top_k.value_or(0)), 0));
  r.sampling.min_p = min_p.value_or(d.min_p.value_or(0.f));
  r.sampling.repetition_penalty = repetition.value_or(d.repetition_penalty.value_or(1.f));
  r.sampling.presence_penalty = presence.value_or(0.f);
  r.sampling.frequency_penalty = frequency.value_or(0.f);
  if (const Json* v = field(body, "logit_bias")) {
    if (!v->is_object()) return type_error("logit_bias", "an object mapping token ids to biases", *v);
    for (const auto& [key, bias] : v->items()) {
      const std::string name = "logit_bias." + key;
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stoll(key) >= model.vocab_size) {
        return bad("logit_bias",
                   fmt::format("'logit_bias' keys must be token ids in [0, {}), got \"{}\".", model.vocab_size, key));
      }
      if (!bias.is_number()) return type_error(name, "a number", bias);
      if (!engine::kLogitBiasRange.contains(bias.get<double>())) {
        return bad(name, fmt::format("'{}' must be {}, got {}.", name, engine::kLogitBiasRange.rule(), shown(bias)));
      }
      r.sampling.logit_bias.emplace_back(static_cast<int32_t>(std::stoll(key)), bias.get<float>());
    }
  }
  if (const Json* v = field(body, "allowed_token_ids")) {
    if (auto e = get_token_list(*v, "allowed_token_ids", model.vocab_size, &r.sampling.allowed_token_ids)) return e;
    if (r.sampling.allowed_token_ids.empty()) {
      return bad("allowed_token_ids", "'allowed_token_ids' must not be empty (it would mask every token).");
    }
  }
  const std::string min_tokens_rule = fmt::format("an integer in [0, {}] (at most 'max_tokens')", r.max_tokens);
  if (auto e = get_int(body, "min_tokens", 0, r.max_tokens, min_tokens_rule.c_str(), &min_tokens)) return e;
  r.sampling.min_tokens = static_cast<int>(min_tokens.value_or(0));
  if (Status st = engine::validate(r.sampling); !st.ok()) return bad("", st.message());  // the checks above hold it
  return std::nullopt;
}

// truncate_prompt_tokens: each prompt keeps its last k tokens (vLLM's left truncation).
std::optional<ApiError> truncate_prompts(const Json& body, const ServedModel& model, ParsedRequest& r) {
  std::optional<int64_t> k;
  if (auto e = get_int(body, "truncate_prompt_tokens", 1, std::numeric_limits<int32_t>::max(), "at least 1", &k)) {
    return e;
  }
  if (!k) return std::nullopt;
  for (Prompt& p : r.prompts) {
    if (static_cast<int64_t>(p.ids.size()) <= *k) continue;
    p.ids.erase(p.ids.begin(), p.ids.end() - *k);
    if (!p.text.empty()) p.text = model.tokenizer->decode(p.ids);
  }
  return std::nullopt;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parse_request(const std::string& text, bool chat, const ServedModel& model,
                                                    const text::RenderLimits& render_limits) {
  auto parsed = parse_body(text);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  ParsedRequest r;
  r.chat = chat;
  if (auto e = parse_model(body, model, &r.model)) return *e;
  if (auto e = check_field_names(body, chat)) return *e;
  if (auto e = parse_unimplemented(body)) return *e;
  if (auto e = parse_stop_and_stream(body, model, r)) return *e;
  if (auto e = parse_choice_options(body, chat, r)) return *e;
  if (auto e = parse_priority(body, model, r)) return *e;
  if (auto e = chat ? parse_chat_prompt(body, model, render_limits, r) : parse_completion_prompts(body, model, r)) {
    return *e;
  }
  if (auto e = truncate_prompts(body, model, r)) return *e;
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    if (r.prompts[i].ids.empty()) {
      const std::string name = r.prompts.size() == 1 ? "prompt" : fmt::format("prompt[{}]", i);
      return bad(chat ? "messages" : "prompt", fmt::format("'{}' is empty: it encodes to no token.", name));
    }
  }
  if (chat) r.echo = false;  // chat's echo is echo_text (render_chat)
  const int64_t sequences = static_cast<int64_t>(r.prompts.size()) * r.best_of;
  if (sequences > model.max_sequences) {
    return bad(
        r.best_of > r.n ? "best_of" : (r.prompts.size() > 1 ? "prompt" : "n"),
        fmt::format("The request asks for {} sequences ({} prompt{} x {} choices) but this server queues at "
                    "most {} at once (--max-queued-requests).",
                    sequences, r.prompts.size(), r.prompts.size() == 1 ? "" : "s", r.best_of, model.max_sequences));
  }
  if (auto e = parse_length(body, chat, model, r)) return *e;
  if (auto e = parse_sampling(body, model, r)) return *e;
  // Last: a grammar is compiled (and cached) only for a request that is otherwise valid.
  if (auto e = parse_output_fields(body, chat, model, render_limits, r)) return *e;
  return r;
}

namespace {

// The fields of /tokenize and /detokenize (vLLM's).
std::optional<ApiError> check_names(const Json& body, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return bad(key, fmt::format("Unrecognized request argument supplied: {}", key));
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<json, ApiError> tokenize(const std::string& text, const ServedModel& model,
                                      const text::RenderLimits& render_limits) {
  auto parsed = parse_body(text);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  std::string name;
  if (auto e = parse_model(body, model, &name)) return *e;
  const bool chat = body.contains("messages");
  if (chat) {
    if (auto e = check_names(
            body, {"model", "messages", "add_special_tokens", "add_generation_prompt", "continue_final_message",
                   "chat_template", "chat_template_kwargs", "tools", "documents", "return_token_strs"})) {
      return *e;
    }
  } else if (auto e = check_names(body, {"model", "prompt", "add_special_tokens", "return_token_strs"})) {
    return *e;
  }
  bool token_strs = false, add_special = !chat;
  if (auto e = get_bool(body, "return_token_strs", &token_strs)) return *e;
  if (auto e = get_bool(body, "add_special_tokens", &add_special)) return *e;
  std::string prompt;
  if (chat) {
    auto rendered = render_chat(body, model, render_limits, nullptr);
    if (auto* e = std::get_if<ApiError>(&rendered)) return *e;
    prompt = std::get<std::string>(std::move(rendered));
  } else {
    const Json* p = field(body, "prompt");
    if (!p) return bad("prompt", "'prompt' (or 'messages') is required.");
    if (!p->is_string()) return type_error("prompt", "a string", *p);
    prompt = p->get<std::string>();
  }
  auto ids = encode(model, prompt, add_special, chat ? "messages" : "prompt");
  if (auto* e = std::get_if<ApiError>(&ids)) return *e;
  const auto& tokens = std::get<std::vector<int32_t>>(ids);
  json out{{"count", tokens.size()}, {"max_model_len", model.max_position_embeddings}, {"tokens", tokens}};
  if (token_strs) {
    json strs = json::array();
    for (int32_t t : tokens) {
      const std::string* s = model.tokenizer->id_to_token(t);
      strs.push_back(s ? *s : std::string());
    }
    out["token_strs"] = std::move(strs);
  }
  return out;
}

std::variant<json, ApiError> detokenize(const std::string& text, const ServedModel& model) {
  auto parsed = parse_body(text);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& body = std::get<Json>(parsed);
  std::string name;
  if (auto e = parse_model(body, model, &name)) return *e;
  if (auto e = check_names(body, {"model", "tokens"})) return *e;
  const Json* t = field(body, "tokens");
  if (!t) return bad("tokens", "'tokens' is required.");
  std::vector<int32_t> ids;
  if (auto e = get_token_list(*t, "tokens", model.vocab_size, &ids)) return *e;
  return json{{"prompt", model.tokenizer->decode(ids)}};
}

void LogprobQueue::add(engine::TokenLogprobs lp, size_t start_byte, size_t start_char) {
  pending_.emplace_back(start_byte, LogprobEntry{.logprobs = std::move(lp), .text_offset = start_char});
}

std::vector<LogprobEntry> LogprobQueue::take(size_t released_bytes, bool all) {
  std::vector<LogprobEntry> out;
  size_t n = 0;
  while (n < pending_.size() && (all || pending_[n].first < released_bytes))
    out.push_back(std::move(pending_[n++].second));
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

std::vector<LogprobEntry> prompt_logprob_entries(const text::Tokenizer& tokenizer, const std::vector<int32_t>& ids,
                                                 const std::vector<engine::TokenLogprobs>& fed, size_t* chars) {
  std::vector<LogprobEntry> out;
  text::StreamDecoder decoder(tokenizer, /*skip_special_tokens=*/false);
  size_t offset = 0;
  const auto count = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xc0) != 0x80;
    return n;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    LogprobEntry e{.text_offset = offset, .prompt_first = i == 0};
    if (i == 0) {
      e.logprobs.sampled.token = ids[0];
    } else if (i - 1 < fed.size()) {
      e.logprobs = fed[i - 1];
    }
    out.push_back(std::move(e));
    offset += count(decoder.push(ids[i]));
  }
  *chars = offset + count(decoder.finish());
  return out;
}

namespace {
// A token's text as logprobs show it: its bytes, invalid UTF-8 (a piece of a character) as U+FFFD; or
// "token_id:<id>" (vLLM's return_tokens_as_token_ids).
std::string token_text(const ParsedRequest& r, const text::Tokenizer& tokenizer, int32_t id) {
  if (r.return_tokens_as_token_ids) return fmt::format("token_id:{}", id);
  const std::string* b = tokenizer.token_bytes(id);
  return b ? text::utf8_replace_invalid(*b) : std::string();
}
json token_bytes_json(const text::Tokenizer& tokenizer, int32_t id) {
  json a = json::array();
  if (const std::string* b = tokenizer.token_bytes(id)) {
    for (unsigned char c : *b) a.push_back(static_cast<int>(c));
  }
  return a;
}
}  // namespace

json logprobs_json(const ParsedRequest& r, const text::Tokenizer& tokenizer, const std::vector<LogprobEntry>& entries,
                   size_t offset_shift) {
  if (r.logprobs < 0) return json();
  if (r.chat) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      const engine::TokenLogprobs& lp = e.logprobs;
      json top = json::array();
      for (const engine::TokenLogprob& t : lp.top) {
        top.push_back(json{{"token", token_text(r, tokenizer, t.token)},
                           {"logprob", t.logprob},
                           {"bytes", token_bytes_json(tokenizer, t.token)}});
      }
      content.push_back(json{{"token", token_text(r, tokenizer, lp.sampled.token)},
                             {"logprob", lp.sampled.logprob},
                             {"bytes", token_bytes_json(tokenizer, lp.sampled.token)},
                             {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}};
  }
  // Legacy completions: top_logprobs maps token text to logprob, the k most likely plus the sampled token
  // (so up to k + 1 entries, as OpenAI documents); two ids with the same text keep the likelier one. An
  // echoed prompt's first token has no logprob (null), as OpenAI shows it.
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const LogprobEntry& e : entries) {
    const engine::TokenLogprobs& lp = e.logprobs;
    tokens.push_back(token_text(r, tokenizer, lp.sampled.token));
    offsets.push_back(e.text_offset + offset_shift);
    if (e.prompt_first) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(lp.sampled.logprob);
    json top = json::object();
    for (const engine::TokenLogprob& t : lp.top) top.emplace(token_text(r, tokenizer, t.token), t.logprob);
    top.emplace(token_text(r, tokenizer, lp.sampled.token), lp.sampled.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

TextStream::TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stops, bool include_stop,
                       int min_tokens, bool skip_special_tokens)
    : decoder_(tokenizer, skip_special_tokens),
      stops_(std::move(stops)),
      include_stop_(include_stop),
      min_tokens_(min_tokens) {}

std::string TextStream::release() {
  // held_ starts at byte released_bytes_ of the text; a stop string counts only when it ends after
  // search_from_ (the text of the first min_tokens tokens cannot end one, as in vLLM).
  size_t first = std::string::npos;
  const std::string* which = nullptr;
  for (const auto& s : stops_) {
    const int64_t from =
        static_cast<int64_t>(search_from_) - static_cast<int64_t>(released_bytes_) - static_cast<int64_t>(s.size()) + 1;
    const size_t at = held_.find(s, static_cast<size_t>(std::max<int64_t>(from, 0)));
    if (at < first) {
      first = at;
      which = &s;
    }
  }
  if (which) {
    std::string out = held_.substr(0, first + (include_stop_ ? which->size() : 0));
    held_.clear();
    stopped_ = true;
    stop_string_ = *which;
    return out;
  }
  // Hold back the longest tail that could begin a stop string (it starts at a character boundary: stop
  // strings are valid UTF-8 and begin with a lead byte).
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

void TextStream::take_decoded(const std::string& s) {
  held_ += s;
  decoded_bytes_ += s.size();
  for (unsigned char c : s) decoded_chars_ += (c & 0xc0) != 0x80;  // the decoder's output is valid UTF-8
}

std::string TextStream::push(int32_t token) {
  if (stopped_) return "";
  take_decoded(decoder_.push(token));
  if (++pushed_ <= min_tokens_) search_from_ = decoded_bytes_;
  std::string out = release();
  released_bytes_ += out.size();
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  take_decoded(decoder_.finish());
  std::string out = release();
  if (!stopped_) out += held_;
  held_.clear();
  released_bytes_ += out.size();
  return out;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {
json reason_json(const char* r) { return r ? json(r) : json(nullptr); }

// One choice of a response (`chat_key` "message") or chunk ("delta").
json choice_json(const ParsedRequest& r, const ChoiceOut& c, bool chunk) {
  json choice = json{{"index", c.index}};
  if (r.chat) {
    json body = json::object();
    if (!chunk) {
      body["role"] = r.role;
      body["content"] = c.content_null ? json(nullptr) : json(c.text);
      if (c.has_reasoning && r.include_reasoning) body["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.is_null()) body["tool_calls"] = c.tool_calls;
    } else {
      if (c.first_chat_chunk) body["role"] = r.role;
      if (!c.text.empty() || (c.first_chat_chunk && !c.finish_reason && c.reasoning.empty())) body["content"] = c.text;
      if (!c.reasoning.empty() && r.include_reasoning) body["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.is_null()) body["tool_calls"] = c.tool_calls;
    }
    choice[chunk ? "delta" : "message"] = std::move(body);
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = c.logprobs;
  choice["finish_reason"] = reason_json(c.finish_reason);
  choice["stop_reason"] = c.stop_reason;
  if (r.return_token_ids) choice["token_ids"] = c.token_ids;
  return choice;
}

json envelope_json(const ParsedRequest& r, const std::string& id, bool chunk, int64_t created,
                   const std::string& fingerprint) {
  const char* object = r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return json{{"id", id},
              {"object", object},
              {"created", created},
              {"model", r.model},
              {"system_fingerprint", fingerprint},
              {"choices", json::array()}};
}
}  // namespace

json completion_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& fingerprint,
                     const std::vector<ChoiceOut>& choices, const Usage& usage) {
  json j = envelope_json(r, id, false, created, fingerprint);
  for (const ChoiceOut& c : choices) j["choices"].push_back(choice_json(r, c, false));
  j["usage"] = usage_json(usage);
  return j;
}

json chunk_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& fingerprint,
                const ChoiceOut* choice, const std::optional<Usage>& usage) {
  json j = envelope_json(r, id, true, created, fingerprint);
  if (choice) j["choices"].push_back(choice_json(r, *choice, true));
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const ToolCall& c : calls) {
    a.push_back(json{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return a;
}

json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json a = json::array();
  for (const ToolCallDelta& d : deltas) {
    json e = {{"index", d.index}};
    if (d.first) {
      e["id"] = d.id;
      e["type"] = "function";
      e["function"] = {{"name", d.name}, {"arguments", d.arguments}};
    } else {
      e["function"] = {{"arguments", d.arguments}};
    }
    a.push_back(std::move(e));
  }
  return a;
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace genbridge::serve
