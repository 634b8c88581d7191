#include "tools/serve/output_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "text/grammar/json_schema.h"
#include "text/grammar/regex_expr.h"
#include "tools/serve/structured_output.h"

namespace genbridge::serve {

using ojson = nlohmann::ordered_json;
namespace grammar = text::grammar;

namespace {

std::string shown(const ojson& v) {
  std::string s = v.dump(-1, ' ', false, ojson::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}
ApiError bad(std::string param, std::string message) {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}

bool present(const ojson& body, const char* f) { return body.contains(f) && !body[f].is_null(); }

bool valid_tool_name(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

// One source of a grammar for the output: what the cache knows it by, how to build it, and the field it came from.
struct OutputGrammar {
  std::string field;
  std::string key;
  std::function<Result<grammar::Grammar>()> build;
};

std::optional<ApiError> parse_tools(const ojson& body, bool chat, ToolCallFormat format, ToolRequest* tr,
                                    bool* have_tools) {
  *have_tools = present(body, "tools");
  for (const char* f : {"tools", "tool_choice", "parallel_tool_calls"}) {
    if (present(body, f) && !chat) {
      return bad(f, fmt::format("'{}' applies to /v1/chat/completions only.", f));
    }
  }
  if (*have_tools) {
    const ojson& tools = body["tools"];
    if (!tools.is_array()) return bad("tools", fmt::format("'tools' must be a list of tools, got {}.", shown(tools)));
    std::set<std::string> names;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", ojson()) != "function") {
        return bad(at + ".type", fmt::format("'{}.type' must be \"function\", got {}.", at,
                                             t.is_object() && t.contains("type") ? shown(t["type"]) : "nothing"));
      }
      if (!t.contains("function") || !t["function"].is_object()) {
        return bad(at + ".function", fmt::format("'{}.function' must be an object with a 'name'.", at));
      }
      const ojson& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string() || !valid_tool_name(f["name"].get<std::string>())) {
        return bad(at + ".function.name",
                   fmt::format("'{}.function.name' must be 1 to 64 letters, digits, '_', '.' or '-', got {}.", at,
                               f.contains("name") ? shown(f["name"]) : "nothing"));
      }
      const std::string name = f["name"].get<std::string>();
      if (!names.insert(name).second) {
        return bad("tools", fmt::format("'tools' names the function '{}' twice.", name));
      }
      ojson params = ojson{{"type", "object"}, {"properties", ojson::object()}};
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) {
          return bad(at + ".function.parameters",
                     fmt::format("'{}.function.parameters' must be a JSON Schema object, got {}.", at,
                                 shown(f["parameters"])));
        }
        params = f["parameters"];
      }
      if (f.contains("strict") && !f["strict"].is_null() && !f["strict"].is_boolean()) {
        return bad(at + ".function.strict",
                   fmt::format("'{}.function.strict' must be a boolean, got {}.", at, shown(f["strict"])));
      }
      tr->tools.push_back({.name = name, .parameters = std::move(params)});
    }
  }
  if (present(body, "parallel_tool_calls")) {
    if (!body["parallel_tool_calls"].is_boolean()) {
      return bad("parallel_tool_calls",
                 fmt::format("'parallel_tool_calls' must be a boolean, got {}.", shown(body["parallel_tool_calls"])));
    }
    tr->parallel = body["parallel_tool_calls"].get<bool>();
  }
  tr->choice = *have_tools && !tr->tools.empty() ? ToolChoice::kAuto : ToolChoice::kNone;
  if (present(body, "tool_choice")) {
    const ojson& c = body["tool_choice"];
    if (c == "none") {
      tr->choice = ToolChoice::kNone;
    } else if (c == "auto") {
      // kAuto with tools; without tools nothing to call
    } else if (c == "required") {
      tr->choice = ToolChoice::kRequired;
    } else if (c.is_object() && c.value("type", ojson()) == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") && c["function"]["name"].is_string()) {
      tr->choice = ToolChoice::kNamed;
      tr->named = c["function"]["name"].get<std::string>();
    } else {
      return bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                            "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {}.",
                                            shown(c)));
    }
    if ((tr->choice == ToolChoice::kRequired || tr->choice == ToolChoice::kNamed) && tr->tools.empty()) {
      return bad("tool_choice", fmt::format("'tool_choice' {} needs 'tools' to call.", shown(c)));
    }
    if (tr->choice == ToolChoice::kNamed &&
        std::none_of(tr->tools.begin(), tr->tools.end(), [&](const Tool& t) { return t.name == tr->named; })) {
      std::string all;
      for (const Tool& t : tr->tools) all += (all.empty() ? "" : ", ") + t.name;
      return bad("tool_choice.function.name",
                 fmt::format("'tool_choice.function.name' is '{}', which is not among 'tools' ({}).", tr->named, all));
    }
  }
  if ((tr->choice == ToolChoice::kRequired || tr->choice == ToolChoice::kNamed) && format == ToolCallFormat::kNone) {
    return bad("tool_choice",
               fmt::format("'tool_choice' {} forces a tool call in the model's format, but this model's chat template "
                           "writes tool calls in no format this server knows (hermes, deepseek_v3, deepseek_v31, "
                           "dsml).",
                           shown(body["tool_choice"])));
  }
  return std::nullopt;
}

// response_format, guided_*, structured_outputs: at most one grammar for the output.
std::optional<ApiError> parse_output_grammar(const ojson& body, std::vector<OutputGrammar>* out) {
  for (const char* f : {"guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "structural_tag"}) {
    if (present(body, f)) {
      return bad(f, fmt::format("'{}' is not supported by this server (constrained decoding takes guided_json, "
                                "guided_regex, guided_choice, structured_outputs and response_format).",
                                f));
    }
  }
  auto json_schema = [&](const std::string& field, const ojson& schema) {
    out->push_back({.field = field, .key = "json_schema:" + schema.dump(), .build = [schema, field] {
                      return grammar::json_schema_grammar(schema, field);
                    }});
  };
  auto regex = [&](const std::string& field, const std::string& pattern) {
    out->push_back({.field = field, .key = "regex:" + pattern, .build = [pattern, field]() -> Result<grammar::Grammar> {
                      grammar::GrammarBuilder b;
                      auto e = grammar::regex_expr(b, pattern);
                      if (!e.ok()) return invalid_argument(fmt::format("{}: {}", field, e.status().message()));
                      return b.build(b.rule("regex", *e));
                    }});
  };
  auto choice = [&](const std::string& field, const ojson& list) -> std::optional<ApiError> {
    if (!list.is_array() || list.empty() ||
        !std::all_of(list.begin(), list.end(), [](const ojson& v) { return v.is_string(); })) {
      return bad(field, fmt::format("'{}' must be a non-empty list of strings, got {}.", field, shown(list)));
    }
    std::vector<std::string> options;
    for (const ojson& v : list) options.push_back(v.get<std::string>());
    out->push_back({.field = field, .key = "choice:" + list.dump(), .build = [options] {
                      grammar::GrammarBuilder b;
                      std::vector<grammar::GrammarBuilder::Expr> alts;
                      for (const std::string& o : options) alts.push_back(b.literal(o));
                      return b.build(b.rule("choice", b.alt(std::move(alts))));
                    }});
    return std::nullopt;
  };
  auto json_value = [&](const std::string& field, const ojson& v) -> std::optional<ApiError> {
    // A schema object, or (vLLM) a string holding one.
    if (v.is_string()) {
      ojson parsed = ojson::parse(v.get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
        return bad(field, fmt::format("'{}' must be a JSON Schema (an object, or a string holding one), got {}.", field,
                                      shown(v)));
      }
      json_schema(field, parsed);
    } else if (v.is_object() || v.is_boolean()) {
      json_schema(field, v);
    } else {
      return bad(field, fmt::format("'{}' must be a JSON Schema (an object, or a string holding one), got {}.", field,
                                    shown(v)));
    }
    return std::nullopt;
  };
  if (present(body, "response_format")) {
    const ojson& rf = body["response_format"];
    const ojson type = rf.is_object() ? rf.value("type", ojson()) : ojson();
    if (!rf.is_object()) {
      return bad("response_format",
                 fmt::format("'response_format' must be an object with a 'type', got {}.", shown(rf)));
    }
    if (type == "json_object") {
      out->push_back(
          {.field = "response_format", .key = "json_object", .build = [] { return grammar::json_object_grammar(); }});
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
        return bad("response_format.json_schema",
                   "'response_format.json_schema' must be an object {\"name\": ..., \"schema\": {...}} with type "
                   "\"json_schema\".");
      }
      const ojson& js = rf["json_schema"];
      if (js.contains("name") && !js["name"].is_null() && !js["name"].is_string()) {
        return bad("response_format.json_schema.name",
                   fmt::format("'response_format.json_schema.name' must be a string, got {}.", shown(js["name"])));
      }
      if (js.contains("strict") && !js["strict"].is_null() && !js["strict"].is_boolean()) {
        return bad("response_format.json_schema.strict",
                   fmt::format("'response_format.json_schema.strict' must be a boolean, got {}.", shown(js["strict"])));
      }
      if (!js.contains("schema") || !(js["schema"].is_object() || js["schema"].is_boolean())) {
        return bad("response_format.json_schema.schema",
                   fmt::format("'response_format.json_schema.schema' must be a JSON Schema object, got {}.",
                               js.contains("schema") ? shown(js["schema"]) : "nothing"));
      }
      json_schema("response_format.json_schema.schema", js["schema"]);
    } else if (type != "text") {
      return bad("response_format.type",
                 fmt::format("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got {}.",
                             rf.contains("type") ? shown(rf["type"]) : "nothing"));
    }
  }
  if (present(body, "guided_json")) {
    if (auto e = json_value("guided_json", body["guided_json"])) return e;
  }
  if (present(body, "guided_regex")) {
    if (!body["guided_regex"].is_string()) {
      return bad("guided_regex", fmt::format("'guided_regex' must be a string, got {}.", shown(body["guided_regex"])));
    }
    regex("guided_regex", body["guided_regex"].get<std::string>());
  }
  if (present(body, "guided_choice")) {
    if (auto e = choice("guided_choice", body["guided_choice"])) return e;
  }
  if (present(body, "structured_outputs")) {
    const ojson& so = body["structured_outputs"];
    if (!so.is_object()) {
      return bad("structured_outputs", fmt::format("'structured_outputs' must be an object, got {}.", shown(so)));
    }
    for (const auto& [k, v] : so.items()) {
      if (v.is_null()) continue;
      const std::string f = "structured_outputs." + k;
      if (k == "json") {
        if (auto e = json_value(f, v)) return e;
      } else if (k == "regex") {
        if (!v.is_string()) return bad(f, fmt::format("'{}' must be a string, got {}.", f, shown(v)));
        regex(f, v.get<std::string>());
      } else if (k == "choice") {
        if (auto e = choice(f, v)) return e;
      } else if (k == "json_object") {
        if (!v.is_boolean()) return bad(f, fmt::format("'{}' must be a boolean, got {}.", f, shown(v)));
        if (v.get<bool>()) {
          out->push_back({.field = f, .key = "json_object", .build = [] { return grammar::json_object_grammar(); }});
        }
      } else {
        return bad(f, fmt::format("'{}' is not supported by this server (structured_outputs takes json, regex, choice "
                                  "and json_object).",
                                  f));
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_output_fields(const ojson& body, bool chat, const ServedModel& model,
                                            const text::RenderLimits& limits, ParsedRequest& r) {
  ToolRequest tr;
  bool have_tools = false;
  // The format of the template that rendered the prompt (the model's, or the request's chat_template).
  const ToolCallFormat format = chat ? r.template_tools.format : ToolCallFormat::kNone;
  if (auto e = parse_tools(body, chat, format, &tr, &have_tools)) return e;
  std::vector<OutputGrammar> grammars;
  if (auto e = parse_output_grammar(body, &grammars)) return e;
  if (tr.choice != ToolChoice::kNone && format != ToolCallFormat::kNone) {
    r.tool_format = format;
    r.max_tool_calls = tr.parallel ? 1 << 30 : 1;
  }
  if (tr.choice == ToolChoice::kRequired || tr.choice == ToolChoice::kNamed) {
    if (!grammars.empty()) {
      return bad(grammars[0].field, fmt::format("'{}' and 'tool_choice' {} both constrain the output; give one.",
                                                grammars[0].field, shown(body["tool_choice"])));
    }
    ojson key = {{"format", tool_call_format_name(format)},
                 {"choice", body["tool_choice"]},
                 {"parallel", tr.parallel},
                 {"tools", body["tools"]}};
    grammars.push_back({.field = "tool_choice", .key = "tools:" + key.dump(), .build = [format, tr] {
                          return tool_call_grammar(format, tr);
                        }});
  }
  if (grammars.empty()) return std::nullopt;
  if (grammars.size() > 1) {
    return bad(grammars[1].field,
               fmt::format("'{}' and '{}' both constrain the output; give one.", grammars[0].field, grammars[1].field));
  }
  if (!model.structured) {
    return bad(grammars[0].field,
               fmt::format("'{}' needs the model's tokenizer, which this server has not.", grammars[0].field));
  }
  const OutputGrammar& og = grammars[0];
  const grammar::CompileOptions options{.deadline = limits.deadline, .cancelled = limits.cancelled};
  auto cg = model.structured->compile(og.key, og.build, options);
  if (!cg.ok()) {
    const Status& st = cg.status();
    if (st.code() == StatusCode::kDeadlineExceeded || st.code() == StatusCode::kUnavailable) {
      const bool late = st.code() == StatusCode::kDeadlineExceeded;
      return ApiError{
          .http_status = late ? 504 : 503,
          .message = (late ? "The request did not finish within --request-timeout: " : "The request was cancelled: ") +
                     st.message(),
          .type = "server_error",
          .code = late ? "timeout" : "cancelled"};
    }
    if (st.code() == StatusCode::kResourceExhausted) {
      return bad(og.field, fmt::format("'{}' is too large for constrained decoding: {}", og.field, st.message()));
    }
    // The builders' messages start with the field's path (a schema's keyword, a pattern's offset).
    const std::string& m = st.message();
    return bad(og.field, m.rfind(og.field, 0) == 0 || m.rfind("tools[", 0) == 0
                             ? m + "."
                             : fmt::format("'{}' cannot be used for constrained decoding: {}.", og.field, m));
  }
  // The shortest output, and the stop token after it, must fit max_tokens.
  const bool stops = (!r.ignore_eos && !model.eos_tokens.empty()) || !r.stop_token_ids.empty();
  const int64_t need = (*cg)->min_tokens() + (stops ? 1 : 0);
  if (need > r.max_tokens) {
    return bad(r.chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
               fmt::format("max_tokens is {}, but the shortest output '{}' allows takes {} tokens{}; raise max_tokens.",
                           r.max_tokens, og.field, need, stops ? " (the stop token included)" : ""));
  }
  r.grammar = std::move(cg).value();
  return std::nullopt;
}

}  // namespace genbridge::serve
