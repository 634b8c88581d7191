#include "tools/serve/openai.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "text/utf8.h"
#include "tools/serve/output_fields.h"
#include "tools/serve/structured_output.h"

namespace genbridge::serve {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

json error_json(const ApiError& e) {
  return json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

namespace {

constexpr float kMaxApiTemperature = 2.f;  // OpenAI's limit

// A JSON value as a message shows it: compact, at most 40 characters.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

ApiError bad(std::string param, std::string message) {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}
ApiError type_error(const std::string& name, const char* what, const json& v) {
  return bad(name, fmt::format("'{}' must be {}, got {}.", name, what, shown(v)));
}

bool is_int(const json& v) { return v.is_number_integer() || v.is_number_unsigned(); }

// Optional integer field in [lo, hi]; `rule` describes the range in the message.
std::optional<ApiError> get_int(const json& body, const std::string& name, int64_t lo, int64_t hi, const char* rule,
                                std::optional<int64_t>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!is_int(*it)) return type_error(name, "an integer", *it);
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return bad(name, fmt::format("'{}' must be {}, got {} (beyond a signed 64-bit integer).", name, rule, shown(*it)));
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return bad(name, fmt::format("'{}' must be {}, got {}.", name, rule, v));
  *out = v;
  return std::nullopt;
}

// Optional sampling parameter kept as float: a number `range` contains (checked on the float it becomes).
std::optional<ApiError> get_float(const json& body, const std::string& name, const engine::FloatRange& range,
                                  std::optional<float>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return type_error(name, "a number", *it);
  const double v = it->get<double>();
  if (!range.contains(v)) return bad(name, fmt::format("'{}' must be {}, got {}.", name, range.rule(), shown(*it)));
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& body, const std::string& name, bool* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return type_error(name, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

// "content" of a chat message as the reference servers pass it to the template: a string; a list of
// {"type": "text", "text": "..."} parts joined with "\n" (vLLM, llama.cpp); null or absent as "" (vLLM), except
// on an assistant turn with tool_calls when the template renders such a turn's calls from a null content
// (DeepSeek-V3's tests `content is none`; `null_content`, found by probing the template at start-up).
std::optional<ApiError> normalize_content(json& msg, size_t i, bool null_content) {
  const std::string name = fmt::format("messages[{}].content", i);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    const bool calls = msg.value("role", json()) == "assistant" && msg.contains("tool_calls") &&
                       msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
    msg["content"] = calls && null_content ? json(nullptr) : json("");
    return std::nullopt;
  }
  if (it->is_string()) return std::nullopt;
  if (!it->is_array()) return type_error(name, "a string, null or a list of text parts", *it);
  std::string joined;
  for (size_t p = 0; p < it->size(); ++p) {
    const json& part = (*it)[p];
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
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

namespace {

// The request's choice options: one choice (n, best_of), log-probabilities, no echo, suffix or logit_bias.
std::optional<ApiError> parse_choice_options(json& body, bool chat, ParsedRequest& r) {
  // Unsupported options: refused, never ignored.
  std::optional<int64_t> n;
  if (auto e = get_int(body, "n", 1, 1, "1 (this server generates one choice per request)", &n)) return *e;
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null() && *it != 1) {
    return bad("best_of",
               fmt::format("'best_of' must be 1 (this server generates one choice per request), got {}.", shown(*it)));
  }
  // Log-probabilities (0..20 alternatives, OpenAI's limit).
  const std::string logprobs_rule = fmt::format("between 0 and {}", engine::kMaxLogprobs);
  if (!chat) {
    std::optional<int64_t> k;
    if (auto e = get_int(body, "logprobs", 0, engine::kMaxLogprobs, logprobs_rule.c_str(), &k)) return *e;
    if (k) r.logprobs = static_cast<int>(*k);
    if (auto it = body.find("top_logprobs"); it != body.end() && !it->is_null()) {
      return bad("top_logprobs",
                 "'top_logprobs' belongs to /v1/chat/completions; /v1/completions takes 'logprobs': k.");
    }
  } else {
    bool want = false;
    if (auto e = get_bool(body, "logprobs", &want)) return *e;
    std::optional<int64_t> k;
    if (auto e = get_int(body, "top_logprobs", 0, engine::kMaxLogprobs, logprobs_rule.c_str(), &k)) return *e;
    if (k && !want) return bad("top_logprobs", "'top_logprobs' requires 'logprobs': true.");
    if (want) r.logprobs = static_cast<int>(k.value_or(0));
  }
  for (const char* f : {"echo", "suffix", "logit_bias"}) {
    auto it = body.find(f);
    if (it == body.end() || it->is_null() || *it == false) continue;
    if (std::string(f) == "logit_bias" && it->is_object() && it->empty()) continue;
    return bad(f, fmt::format("'{}' is not supported by this server.", f));
  }

  return std::nullopt;
}

// The prompt's tokens: /v1/completions' prompt (text or token ids), or /v1/chat/completions' messages
// rendered by the chat template; encoded with the model's tokenizer.
std::optional<ApiError> parse_prompt(json& body, const ojson* obody, bool chat, const ServedModel& model,
                                     const text::RenderLimits& render_limits, ParsedRequest& r) {
  // prompt / messages
  std::string prompt_text;
  bool have_text = true;
  if (!chat) {
    auto p = body.find("prompt");
    if (p == body.end() || p->is_null()) return bad("prompt", "'prompt' is required.");
    if (p->is_string()) {
      prompt_text = p->get<std::string>();
    } else if (p->is_array() && !p->empty() &&
               std::all_of(p->begin(), p->end(), [](const json& v) { return is_int(v); })) {
      have_text = false;
      for (const json& v : *p) {
        const int64_t t = v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>();
        if (t < 0 || t >= model.vocab_size) {
          return bad("prompt",
                     fmt::format("'prompt' token {} is outside the vocabulary [0, {}).", shown(v), model.vocab_size));
        }
        r.prompt.push_back(static_cast<int32_t>(t));
      }
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      prompt_text = (*p)[0].get<std::string>();
    } else if (p->is_array() && p->size() > 1 &&
               std::all_of(p->begin(), p->end(), [](const json& v) { return v.is_string(); })) {
      return bad("prompt",
                 fmt::format("'prompt' holds {} prompts; this server takes one prompt per request.", p->size()));
    } else {
      return type_error("prompt", "a string or a list of token ids", *p);
    }
  } else {
    if (!model.tokenizer_config || !model.tokenizer_config->chat_template) {
      return bad("messages",
                 "This model has no chat template (no chat_template in tokenizer_config.json, no chat_template.jinja); "
                 "use /v1/completions.");
    }
    auto ms = body.find("messages");
    if (ms == body.end() || ms->is_null()) return bad("messages", "'messages' is required.");
    if (!ms->is_array()) return type_error("messages", "a list of messages", *ms);
    if (ms->empty()) return bad("messages", "'messages' is empty.");
    json messages = *ms;
    for (size_t i = 0; i < messages.size(); ++i) {
      json& msg = messages[i];
      if (!msg.is_object()) return type_error(fmt::format("messages[{}]", i), "an object", msg);
      auto role = msg.find("role");
      if (role == msg.end() || !role->is_string()) {
        return bad(fmt::format("messages[{}].role", i), fmt::format("'messages[{}].role' must be a string.", i));
      }
      if (auto e = normalize_content(msg, i, model.structured && model.structured->template_tools().null_content)) {
        return *e;
      }
    }
    ojson req = ojson::parse(json{{"messages", messages}}.dump());
    req["add_generation_prompt"] = true;
    if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
      if (!t->is_array()) return type_error("tools", "a list of tools", *t);
      req["tools"] = obody ? (*obody)["tools"] : ojson::parse(t->dump());  // as sent: templates print them
    }
    if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
      if (!k->is_object()) return type_error("chat_template_kwargs", "an object", *k);
      for (auto& [key, v] : k->items()) req[key] = ojson::parse(v.dump());
    }
    auto rendered = model.tokenizer_config->render_chat(req, render_limits);
    if (!rendered.ok()) {
      const Status& st = rendered.status();
      if (st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kUnavailable) {
        const bool late = st.code() == StatusCode::kDeadlineExceeded;
        return ApiError{.http_status = late ? 504 : 503,
                        .message = (late ? "The request did not finish within --request-timeout: "
                                         : "The request was cancelled: ") +
                                   st.message(),
                        .type = "server_error",
                        .code = late ? "timeout" : "cancelled"};
      }
      return bad("messages", "The chat template failed: " + st.message());
    }
    prompt_text = std::move(rendered).value();
  }
  if (have_text) {
    auto ids = model.tokenizer->encode(prompt_text);
    if (!ids.ok())
      return bad(chat ? "messages" : "prompt",
                 fmt::format("'{}' cannot be encoded: {}", chat ? "messages" : "prompt", ids.status().message()));
    r.prompt = std::move(ids).value();
  }
  return std::nullopt;
}

// max_tokens (or max_completion_tokens): within the context and the KV pool.
std::optional<ApiError> parse_length(json& body, bool chat, const ServedModel& model, ParsedRequest& r) {
  const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
  // Sampling and length.
  std::optional<int64_t> max_tokens;
  const char* max_name = "max_tokens";
  if (chat && body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null()) {
    max_name = "max_completion_tokens";
  }
  if (auto e = get_int(body, max_name, 1, std::numeric_limits<int64_t>::max(), "at least 1", &max_tokens)) return *e;
  const int64_t max_pos = model.max_position_embeddings;
  if (prompt_len >= max_pos) {
    return bad("prompt", fmt::format("The prompt has {} tokens but this model's maximum context length is {} tokens "
                                     "(the prompt and at least one completion token must fit).",
                                     prompt_len, max_pos));
  }
  if (max_tokens) {
    if (*max_tokens > max_pos - prompt_len) {
      return bad(max_name, fmt::format("This model's maximum context length is {} tokens, but the request asks for {} "
                                       "({} prompt + {} completion tokens); lower '{}' or shorten the prompt.",
                                       max_pos, prompt_len + *max_tokens, prompt_len, *max_tokens, max_name));
    }
    r.max_tokens = static_cast<int>(*max_tokens);
  } else {
    // Default: --default-max-tokens, within the context and the KV pool.
    int64_t cap = std::min<int64_t>(model.default_max_tokens, max_pos - prompt_len);
    cap = std::min(cap, model.kv_pages * model.kv_page_size - prompt_len + 1);
    r.max_tokens = static_cast<int>(std::max<int64_t>(cap, 1));
  }
  const int64_t kv_tokens = prompt_len + r.max_tokens - 1;
  const int64_t pages = (kv_tokens + model.kv_page_size - 1) / model.kv_page_size;
  if (pages > model.kv_pages) {
    return bad(
        max_tokens ? max_name : "prompt",
        fmt::format("The request needs {} KV pages ({} prompt + {} completion tokens at {} tokens per page) but "
                    "the server's KV pool holds {} pages (--kv-memory-mb {}); lower '{}' or shorten the prompt.",
                    pages, prompt_len, r.max_tokens, model.kv_page_size, model.kv_pages, model.kv_memory_mb, max_name));
  }
  return std::nullopt;
}

// temperature, top_p, top_k and seed; the penalties only at their neutral values.
std::optional<ApiError> parse_sampling(json& body, ParsedRequest& r) {
  // The sampler's ranges (engine::kTemperatureRange, kTopPRange, kMaxTopK); temperature at most 2 as OpenAI's.
  std::optional<float> temperature, top_p;
  std::optional<int64_t> top_k, seed;
  if (auto e = get_float(body, "temperature", engine::kTemperatureRange.with_hi(kMaxApiTemperature), &temperature)) {
    return *e;
  }
  if (auto e = get_float(body, "top_p", engine::kTopPRange, &top_p)) return *e;
  const std::string top_k_rule = fmt::format("-1 or 0 (no limit) or an integer in [1, {}]", engine::kMaxTopK);
  if (auto e = get_int(body, "top_k", -1, engine::kMaxTopK, top_k_rule.c_str(), &top_k)) return *e;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    // Any 64-bit integer, signed or not: a negative seed s is the seed s + 2^64.
    if (!is_int(*it)) {
      if (!it->is_number()) return type_error("seed", "an integer", *it);
      const double v = it->get<double>();
      if (v != std::floor(v)) return type_error("seed", "an integer", *it);
      return bad("seed",
                 fmt::format("'seed' must be an integer in [{}, {}], got {}.", std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<uint64_t>::max(), shown(*it)));
    }
    r.sampling.seed = it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
    r.seeded = true;
  }
  r.sampling.temperature = temperature.value_or(1.f);
  r.sampling.top_p = top_p.value_or(1.f);
  r.sampling.top_k = static_cast<int>(std::max<int64_t>(top_k.value_or(0), 0));
  if (Status st = engine::validate(r.sampling); !st.ok()) return bad("", st.message());  // the checks above hold it

  // Sampling options this server does not implement: accepted only at the value that leaves sampling as it is.
  for (const auto& [f, neutral] : {std::pair<const char*, double>{"frequency_penalty", 0.0},
                                   {"presence_penalty", 0.0},
                                   {"repetition_penalty", 1.0},
                                   {"min_p", 0.0}}) {
    auto it = body.find(f);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number()) return type_error(f, "a number", *it);
    if (it->get<double>() != neutral) {
      return bad(f, fmt::format("'{}' is not supported by this server: it must be {} (or absent), got {}.", f, neutral,
                                shown(*it)));
    }
  }

  return std::nullopt;
}

// stop strings, streaming and the extensions (return_token_ids, ignore_eos).
std::optional<ApiError> parse_stop_and_stream(json& body, ParsedRequest& r) {
  // stop
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const json& v) { return v.is_string(); })) {
      if (it->size() > 4)
        return bad("stop", fmt::format("'stop' holds {} strings; at most 4 are allowed.", it->size()));
      for (const json& v : *it) r.stop.push_back(v.get<std::string>());
    } else {
      return type_error("stop", "a string or a list of strings", *it);
    }
    for (const auto& s : r.stop) {
      if (s.empty()) return bad("stop", "'stop' strings must not be empty.");
    }
  }
  if (auto e = get_bool(body, "stream", &r.stream)) return *e;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return type_error("stream_options", "an object", *it);
    if (!r.stream) return bad("stream_options", "'stream_options' is only allowed with 'stream': true.");
    if (auto e = get_bool(*it, "include_usage", &r.include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "'stream_options.include_usage' must be a boolean, got " + shown((*it)["include_usage"]) + ".";
      return *e;
    }
  }
  if (auto e = get_bool(body, "return_token_ids", &r.return_token_ids)) return *e;
  if (auto e = get_bool(body, "ignore_eos", &r.ignore_eos)) return *e;
  return std::nullopt;
}

}  // namespace

std::variant<ParsedRequest, ApiError> parse_request(const std::string& text, bool chat, const ServedModel& model,
                                                    const text::RenderLimits& render_limits) {
  if (auto at = json_too_deep_at(text, kMaxJsonDepth)) {
    return bad("", fmt::format("The request body nests arrays and objects more than {} levels deep (level {} opens at "
                               "byte {}); this server's limit is {} levels.",
                               kMaxJsonDepth, kMaxJsonDepth + 1, *at, kMaxJsonDepth));
  }
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {
    return bad("", fmt::format("The request body is not valid JSON (parse error at byte {}).", e.byte));
  } catch (const json::out_of_range& e) {
    return number_overflow(text, e);
  }
  if (!body.is_object()) return bad("", fmt::format("The request body must be a JSON object, got {}.", shown(body)));
  ParsedRequest r;
  r.chat = chat;

  // model
  auto m = body.find("model");
  if (m == body.end() || m->is_null()) return bad("model", "'model' is required.");
  if (!m->is_string()) return type_error("model", "a string", *m);
  if (m->get<std::string>() != model.name) {
    ApiError e = bad("model", fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                          m->get<std::string>(), model.name));
    e.code = "model_not_found";
    return e;
  }

  // The fields that shape the output read the body with its key order (a schema's properties, tools as sent).
  std::optional<ojson> obody;
  if (has_output_fields(body)) obody = ojson::parse(text);
  if (auto e = parse_choice_options(body, chat, r)) return *e;
  if (auto e = parse_prompt(body, obody ? &*obody : nullptr, chat, model, render_limits, r)) return *e;
  if (r.prompt.empty()) return bad("prompt", "'prompt' is empty: it encodes to no token.");
  if (auto e = parse_length(body, chat, model, r)) return *e;
  if (auto e = parse_sampling(body, r)) return *e;
  if (auto e = parse_stop_and_stream(body, r)) return *e;
  if (obody) {
    if (auto e = parse_output_fields(*obody, chat, model, render_limits, r)) return *e;
  }
  return r;
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

namespace {
// A token's text as logprobs show it: its bytes, invalid UTF-8 (a piece of a character) as U+FFFD.
std::string token_text(const text::Tokenizer& tokenizer, int32_t id) {
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

json logprobs_json(const ParsedRequest& r, const text::Tokenizer& tokenizer, const std::vector<LogprobEntry>& entries) {
  if (r.logprobs < 0) return json();
  if (r.chat) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      const engine::TokenLogprobs& lp = e.logprobs;
      json top = json::array();
      for (const engine::TokenLogprob& t : lp.top) {
        top.push_back(json{{"token", token_text(tokenizer, t.token)},
                           {"logprob", t.logprob},
                           {"bytes", token_bytes_json(tokenizer, t.token)}});
      }
      content.push_back(json{{"token", token_text(tokenizer, lp.sampled.token)},
                             {"logprob", lp.sampled.logprob},
                             {"bytes", token_bytes_json(tokenizer, lp.sampled.token)},
                             {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}};
  }
  // Legacy completions: top_logprobs maps token text to logprob, the k most likely plus the sampled token
  // (so up to k + 1 entries, as OpenAI documents); two ids with the same text keep the likelier one.
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const LogprobEntry& e : entries) {
    const engine::TokenLogprobs& lp = e.logprobs;
    tokens.push_back(token_text(tokenizer, lp.sampled.token));
    token_logprobs.push_back(lp.sampled.logprob);
    json top = json::object();
    for (const engine::TokenLogprob& t : lp.top) top.emplace(token_text(tokenizer, t.token), t.logprob);
    top.emplace(token_text(tokenizer, lp.sampled.token), lp.sampled.logprob);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(e.text_offset);
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(offsets)}};
}

TextStream::TextStream(const text::Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer, /*skip_special_tokens=*/true), stops_(std::move(stops)) {}

std::string TextStream::release() {
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
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
  std::string out = release();
  released_bytes_ += out.size();
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return "";
  take_decoded(decoder_.finish());
  std::string out = release();
  out += held_;
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

// One choice of a response or chunk: the chat body (`message` or `delta`) under `chat_key`, or the
// completion's text.
json choice_json(const ParsedRequest& r, const char* chat_key, json chat_body, const std::string& text,
                 const char* finish_reason, const std::vector<int32_t>& token_ids, const json& logprobs) {
  json choice = json{{"index", 0}, {"logprobs", logprobs}, {"finish_reason", reason_json(finish_reason)}};
  if (r.chat) {
    choice[chat_key] = std::move(chat_body);
  } else {
    choice["text"] = text;
  }
  if (r.return_token_ids) choice["token_ids"] = token_ids;
  return choice;
}

json envelope_json(const std::string& id, const char* object, int64_t created, const std::string& model, json choice) {
  return json{{"id", id},
              {"object", object},
              {"created", created},
              {"model", model},
              {"choices", json::array({std::move(choice)})}};
}
}  // namespace

json completion_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const char* finish_reason, const Usage& usage,
                     const std::vector<int32_t>& token_ids, const json& logprobs) {
  json message = r.chat ? json{{"role", "assistant"}, {"content", text}} : json();
  json j = envelope_json(id, r.chat ? "chat.completion" : "text_completion", created, model,
                         choice_json(r, "message", std::move(message), text, finish_reason, token_ids, logprobs));
  j["usage"] = usage_json(usage);
  return j;
}

json chunk_json(const ParsedRequest& r, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const char* finish_reason, const std::optional<Usage>& usage,
                bool first_chat_chunk, const std::vector<int32_t>& token_ids, const json& logprobs) {
  json delta = json::object();
  if (first_chat_chunk) delta["role"] = "assistant";
  if (!text.empty() || (first_chat_chunk && !finish_reason)) delta["content"] = text;
  json j = envelope_json(id, r.chat ? "chat.completion.chunk" : "text_completion", created, model,
                         choice_json(r, "delta", std::move(delta), text, finish_reason, token_ids, logprobs));
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

std::string sse(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

}  // namespace genbridge::serve
