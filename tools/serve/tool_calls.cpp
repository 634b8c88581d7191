#include "tools/serve/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>

#include "text/grammar/json_schema.h"

namespace genbridge::serve {

using nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace grammar = text::grammar;

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kDeepSeekV31:
      return "deepseek_v31";
    case ToolCallFormat::kDsml:
      return "dsml";
    case ToolCallFormat::kDsmlFunctionCalls:
      return "dsml (function_calls)";
  }
  return "?";
}

namespace {

// The markers of each format.
constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kDsV3ArgsOpen = "\n```json\n", kDsV3ArgsClose = "\n```<｜tool▁call▁end｜>";
constexpr std::string_view kDsmlToolCalls = "<｜DSML｜tool_calls>", kDsmlToolCallsEnd = "</｜DSML｜tool_calls>";
constexpr std::string_view kDsmlFunctionCalls = "<｜DSML｜function_calls>",
                           kDsmlFunctionCallsEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=\"", kDsmlInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParam = "<｜DSML｜parameter name=\"", kDsmlParamEnd = "</｜DSML｜parameter>";
constexpr std::string_view kDsmlString = "\" string=\"", kDsmlTagEnd = "\">";
constexpr std::string_view kProbeTool = "genbridge_probe_tool";

std::string_view calls_open(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes:
      return kHermesOpen;
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kDeepSeekV31:
      return kDsCallsBegin;
    case ToolCallFormat::kDsml:
      return kDsmlToolCalls;
    case ToolCallFormat::kDsmlFunctionCalls:
      return kDsmlFunctionCalls;
    case ToolCallFormat::kNone:
      break;
  }
  return {};
}

// The longest suffix of `s` that is a proper prefix of `marker` (text that may still become the marker).
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k) {
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

TemplateToolSupport probe_template(const text::TokenizerConfig& config) {
  TemplateToolSupport t;
  if (!config.chat_template) return t;
  auto render = [&](const ojson& content) -> std::optional<std::string> {
    ojson call = {{"id", "call_probe"},
                  {"type", "function"},
                  {"function", {{"name", kProbeTool}, {"arguments", "{\"probe\": 1}"}}}};
    ojson req = {
        {"messages",
         ojson::array({ojson{{"role", "user"}, {"content", "probe"}},
                       ojson{{"role", "assistant"}, {"content", content}, {"tool_calls", ojson::array({call})}}})},
        {"tools",
         ojson::array({ojson{
             {"type", "function"},
             {"function", {{"name", kProbeTool}, {"description", "probe"}, {"parameters", {{"type", "object"}}}}}}})}};
    text::RenderLimits limits;
    limits.max_steps = 100'000;
    auto r = config.render_chat(req, limits);
    if (!r.ok() || r->find(kProbeTool) == std::string::npos) return std::nullopt;
    return std::move(r).value();
  };
  std::optional<std::string> out = render(nullptr);
  // Jinja prints None as "None": a template that does so did not mean null content.
  t.null_content = out && out->find("None") == std::string::npos;
  if (!t.null_content) out = render("");
  if (!out) return t;
  const std::string& s = *out;
  if (s.find(kHermesOpen) != std::string::npos) {
    t.format = ToolCallFormat::kHermes;
  } else if (s.find(kDsmlToolCalls) != std::string::npos) {
    t.format = ToolCallFormat::kDsml;
  } else if (s.find(kDsmlFunctionCalls) != std::string::npos) {
    t.format = ToolCallFormat::kDsmlFunctionCalls;
  } else if (s.find(std::string(kDsCallBegin) + "function" + std::string(kDsSep)) != std::string::npos) {
    t.format = ToolCallFormat::kDeepSeekV3;
  } else if (s.find(std::string(kDsCallBegin) + std::string(kProbeTool) + std::string(kDsSep)) != std::string::npos) {
    t.format = ToolCallFormat::kDeepSeekV31;
  }
  return t;
}

Result<grammar::Grammar> tool_call_grammar(ToolCallFormat format, const ToolRequest& request) {
  using Expr = grammar::GrammarBuilder::Expr;
  grammar::GrammarBuilder b;
  grammar::JsonRules rules(b);
  std::vector<Expr> calls;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const Tool& tool = request.tools[i];
    if (request.choice == ToolChoice::kNamed && tool.name != request.named) continue;
    const std::string where = fmt::format("tools[{}].function.parameters", i);
    if (format == ToolCallFormat::kDsml || format == ToolCallFormat::kDsmlFunctionCalls) {
      // One line per parameter, in the schema's order; strings raw (string="true"), other values as JSON.
      std::vector<Expr> params;
      const ojson& p = tool.parameters;
      if (p.is_object() && p.contains("properties") && p["properties"].is_object()) {
        std::vector<std::string> required;
        if (p.contains("required") && p["required"].is_array()) {
          for (const ojson& r : p["required"]) {
            if (r.is_string()) required.push_back(r.get<std::string>());
          }
        }
        for (const auto& [name, schema] : p["properties"].items()) {
          const bool raw = schema.is_object() && schema.value("type", ojson()) == "string" &&
                           std::all_of(schema.items().begin(), schema.items().end(), [](const auto& kv) {
                             return kv.key() == "type" || kv.key() == "description" || kv.key() == "title";
                           });
          Expr value;
          if (raw) {
            value = b.star(b.alt({b.codepoints(0, '<' - 1), b.codepoints('<' + 1, 0x10FFFF)}));
          } else {
            auto r = rules.schema(schema, where + "/properties/" + name);
            if (!r.ok()) return r.status();
            value = b.call(*r);
          }
          Expr line = b.seq({b.literal(std::string(kDsmlParam) + name + std::string(kDsmlString) +
                                       (raw ? "true" : "false") + std::string(kDsmlTagEnd)),
                             value, b.literal(std::string(kDsmlParamEnd) + "\n")});
          const bool req = std::find(required.begin(), required.end(), name) != required.end();
          params.push_back(req ? line : b.optional(line));
        }
      }
      calls.push_back(b.seq({b.literal(std::string(kDsmlInvoke) + tool.name + std::string(kDsmlTagEnd) + "\n"),
                             b.seq(params.empty() ? std::vector<Expr>{b.empty()} : params),
                             b.literal(std::string(kDsmlInvokeEnd) + "\n")}));
      continue;
    }
    auto args = rules.schema(tool.parameters, where);
    if (!args.ok()) return args.status();
    switch (format) {
      case ToolCallFormat::kHermes:
        calls.push_back(b.seq({b.literal("<tool_call>\n{\"name\": " + json(tool.name).dump() + ", \"arguments\": "),
                               b.call(*args), b.literal("}\n</tool_call>")}));
        break;
      case ToolCallFormat::kDeepSeekV3:
        calls.push_back(b.seq({b.literal(std::string(kDsCallBegin) + "function" + std::string(kDsSep) + tool.name +
                                         std::string(kDsV3ArgsOpen)),
                               b.call(*args), b.literal(std::string(kDsV3ArgsClose))}));
        break;
      case ToolCallFormat::kDeepSeekV31:
        calls.push_back(b.seq({b.literal(std::string(kDsCallBegin) + tool.name + std::string(kDsSep)), b.call(*args),
                               b.literal(std::string(kDsCallEnd))}));
        break;
      default:
        return invalid_argument("tool calls: this model's chat template writes no tool-call format genbridge knows");
    }
  }
  if (calls.empty()) return invalid_argument("tool calls: no tool to call");
  const Expr one = b.alt(calls);
  std::string open, sep, close;
  switch (format) {
    case ToolCallFormat::kHermes:
      sep = "\n";
      break;
    case ToolCallFormat::kDeepSeekV3:
      open = kDsCallsBegin, sep = "\n", close = kDsCallsEnd;
      break;
    case ToolCallFormat::kDeepSeekV31:
      open = kDsCallsBegin, close = kDsCallsEnd;
      break;
    case ToolCallFormat::kDsml:
      open = std::string(kDsmlToolCalls) + "\n", close = kDsmlToolCallsEnd;
      break;
    case ToolCallFormat::kDsmlFunctionCalls:
      open = std::string(kDsmlFunctionCalls) + "\n", close = kDsmlFunctionCallsEnd;
      break;
    case ToolCallFormat::kNone:
      break;
  }
  const bool many = request.parallel && request.choice == ToolChoice::kRequired;
  const Expr all = many ? b.seq({one, b.star(b.seq({b.literal(sep), one}))}) : one;
  return b.build(b.rule("tool_calls", b.seq({b.literal(open), all, b.literal(close)})));
}

// ---- parsing ----

enum class ToolCallParser::State {
  kContent,      // text; looking for the format's opening marker
  kHermesBody,   // inside <tool_call>: the JSON object, then </tool_call>
  kHermesAfter,  // after </tool_call>: whitespace, another <tool_call>, or content
  kDsBetween,    // between DeepSeek calls: <｜tool▁call▁begin｜> or <｜tool▁calls▁end｜>
  kDsType,       // V3: the call's type, up to <｜tool▁sep｜>
  kDsName,       // the function's name
  kDsArgs,       // the arguments, up to the call's end marker
  kDsmlBetween,  // between invokes
  kDsmlName,     // the invoke's name, up to ">
  kDsmlParams,   // between parameters
  kDsmlParamName,
  kDsmlParamKind,
  kDsmlParamValue,
  kFailed,  // the format broke: everything is content
};

// The hermes call object, read one character at a time.
struct ToolCallParser::Scan {
  enum S { kOpen, kKeyOrEnd, kKey, kColon, kValueStart, kValue, kComma, kDone } s = kOpen;
  bool first_key = true, esc = false, in_str = false, scalar = false;
  std::string key_raw, key, value, name;
  int depth = 0;
  bool have_name = false, have_args = false;
};

ToolCallParser::ToolCallParser(ToolCallFormat format, uint64_t id_seed, int max_calls)
    : format_(format), seed_(id_seed), max_calls_(max_calls), state_(State::kContent) {}

ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;

std::string ToolCallParser::next_id() {
  const uint64_t a = splitmix(seed_), c = splitmix(seed_);
  return fmt::format("call_{:016x}{:08x}", a, static_cast<uint32_t>(c));
}

void ToolCallParser::begin_call(ParseDelta* out, const std::string& name) {
  call_open_ = true;
  call_sent_ = static_cast<int>(calls_.size()) < max_calls_;
  if (!call_sent_) {
    ++dropped_;
    return;
  }
  calls_.push_back({.id = next_id(), .name = name, .arguments = ""});
  out->calls.push_back(
      {.index = static_cast<int>(calls_.size()) - 1, .first = true, .id = calls_.back().id, .name = name});
  if (!pending_args_.empty()) {
    const std::string p = std::move(pending_args_);
    pending_args_.clear();
    add_arguments(out, p);
  }
}

void ToolCallParser::add_arguments(ParseDelta* out, const std::string& text) {
  if (text.empty()) return;
  if (!call_open_) {
    pending_args_ += text;
    return;
  }
  if (!call_sent_) return;
  calls_.back().arguments += text;
  const int index = static_cast<int>(calls_.size()) - 1;
  if (!out->calls.empty() && out->calls.back().index == index) {
    out->calls.back().arguments += text;
  } else {
    out->calls.push_back({.index = index, .arguments = text});
  }
}

bool ToolCallParser::end_call(ParseDelta* out) {
  (void)out;
  if (!call_open_) return false;
  call_open_ = false;
  if (!call_sent_) return true;
  const std::string& a = calls_.back().arguments;
  const json parsed = json::parse(a, nullptr, /*allow_exceptions=*/false);
  return !parsed.is_discarded() && parsed.is_object();
}

void ToolCallParser::fail(ParseDelta* out) {
  failed_ = true;
  state_ = State::kFailed;
  out->content += block_ + buf_;
  block_.clear();
  buf_.clear();
}

ParseDelta ToolCallParser::feed(const std::string& text) {
  ParseDelta out;
  buf_ += text;
  run(&out, false);
  return out;
}

ParseDelta ToolCallParser::finish() {
  ParseDelta out;
  run(&out, true);
  if (state_ != State::kContent && state_ != State::kHermesAfter && state_ != State::kFailed) fail(&out);
  if (state_ == State::kHermesAfter) buf_.clear();  // whitespace after the last call
  return out;
}

void ToolCallParser::run(ParseDelta* out, bool at_end) {
  while (step(out, at_end)) {
  }
}

bool ToolCallParser::step(ParseDelta* out, bool at_end) {
  // Consumes `n` bytes of buf_ into the current call's text.
  auto take = [&](size_t n) {
    block_.append(buf_, 0, n);
    buf_.erase(0, n);
  };
  // Skips whitespace; then whether buf_ starts with `m` (true), may still (nullopt), or does not (false).
  auto starts = [&](std::string_view m) -> std::optional<bool> {
    if (buf_.compare(0, m.size(), m) == 0 && buf_.size() >= m.size()) return true;
    if (buf_.size() < m.size() && std::string_view(m).substr(0, buf_.size()) == buf_) return std::nullopt;
    return false;
  };
  auto skip_ws = [&] {
    size_t n = 0;
    while (n < buf_.size() && is_ws(buf_[n])) ++n;
    take(n);
  };
  // Text up to `m` (not included) once `m` is in buf_; nullopt while it is not.
  auto until = [&](std::string_view m) -> std::optional<std::string> {
    const size_t at = buf_.find(m);
    if (at == std::string::npos) return std::nullopt;
    std::string s = buf_.substr(0, at);
    take(at + m.size());
    return s;
  };
  switch (state_) {
    case State::kFailed:
      out->content += buf_;
      buf_.clear();
      return false;
    case State::kContent: {
      const std::string_view open = calls_open(format_);
      if (open.empty()) {
        out->content += buf_;
        buf_.clear();
        return false;
      }
      const size_t at = buf_.find(open);
      if (at == std::string::npos) {
        const size_t hold = at_end ? 0 : partial_suffix(buf_, open);
        out->content.append(buf_, 0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return false;
      }
      out->content.append(buf_, 0, at);
      buf_.erase(0, at);
      block_.clear();
      take(open.size());
      switch (format_) {
        case ToolCallFormat::kHermes:
          scan_ = std::make_unique<Scan>();
          state_ = State::kHermesBody;
          break;
        case ToolCallFormat::kDeepSeekV3:
        case ToolCallFormat::kDeepSeekV31:
          state_ = State::kDsBetween;
          break;
        default:
          state_ = State::kDsmlBetween;
          break;
      }
      return true;
    }
    case State::kHermesAfter: {
      skip_ws();
      if (buf_.empty()) return false;
      auto s = starts(kHermesOpen);
      if (!s) return at_end ? (state_ = State::kContent, true) : false;
      if (*s) {
        block_.clear();
        take(kHermesOpen.size());
        scan_ = std::make_unique<Scan>();
        state_ = State::kHermesBody;
        return true;
      }
      state_ = State::kContent;  // text after the calls
      return true;
    }
    case State::kHermesBody: {
      Scan& sc = *scan_;
      while (!buf_.empty()) {
        if (sc.s == Scan::kDone) {
          skip_ws();
          if (buf_.empty()) return false;
          auto s = starts(kHermesClose);
          if (!s) return false;
          if (!*s) {
            fail(out);
            return false;
          }
          take(kHermesClose.size());
          if (!sc.have_name) {
            fail(out);
            return false;
          }
          if (!sc.have_args) add_arguments(out, "{}");
          if (!end_call(out)) {
            fail(out);
            return false;
          }
          block_.clear();
          state_ = State::kHermesAfter;
          return true;
        }
        const char c = buf_[0];
        bool consume = true;
        switch (sc.s) {
          case Scan::kOpen:
            if (c == '{') {
              sc.s = Scan::kKeyOrEnd;
            } else if (!is_ws(c)) {
              fail(out);
              return false;
            }
            break;
          case Scan::kKeyOrEnd:
            if (c == '"') {
              sc.s = Scan::kKey;
              sc.key_raw.clear();
            } else if (c == '}' && sc.first_key) {
              sc.s = Scan::kDone;
            } else if (!is_ws(c)) {
              fail(out);
              return false;
            }
            break;
          case Scan::kKey:
            if (sc.esc) {
              sc.esc = false;
              sc.key_raw += c;
            } else if (c == '\\') {
              sc.esc = true;
              sc.key_raw += c;
            } else if (c == '"') {
              const json k = json::parse("\"" + sc.key_raw + "\"", nullptr, false);
              if (k.is_discarded()) {
                fail(out);
                return false;
              }
              sc.key = k.get<std::string>();
              sc.s = Scan::kColon;
            } else {
              sc.key_raw += c;
            }
            break;
          case Scan::kColon:
            if (c == ':') {
              sc.s = Scan::kValueStart;
            } else if (!is_ws(c)) {
              fail(out);
              return false;
            }
            break;
          case Scan::kValueStart:
            if (is_ws(c)) break;
            sc.value.clear();
            sc.depth = 0;
            sc.in_str = sc.scalar = sc.esc = false;
            sc.s = Scan::kValue;
            consume = false;
            break;
          case Scan::kValue: {
            bool complete = false;
            if (sc.value.empty()) {
              if (c == '{' || c == '[') {
                sc.depth = 1;
              } else if (c == '"') {
                sc.in_str = true;
              } else if (std::string_view("-0123456789tfn").find(c) != std::string_view::npos) {
                sc.scalar = true;
              } else {
                fail(out);
                return false;
              }
            } else if (sc.in_str) {
              if (sc.esc) {
                sc.esc = false;
              } else if (c == '\\') {
                sc.esc = true;
              } else if (c == '"') {
                sc.in_str = false;
                complete = sc.depth == 0;
              }
            } else if (sc.scalar) {
              if (is_ws(c) || c == ',' || c == '}' || c == ']') {
                consume = false;
                complete = true;
              }
            } else if (c == '"') {
              sc.in_str = true;
            } else if (c == '{' || c == '[') {
              ++sc.depth;
            } else if (c == '}' || c == ']') {
              complete = --sc.depth == 0;
            }
            if (consume) {
              sc.value += c;
              if (sc.key == "arguments") add_arguments(out, std::string(1, c));
            }
            if (complete) {
              if (sc.key == "name") {
                const json n = json::parse(sc.value, nullptr, false);
                if (n.is_discarded() || !n.is_string() || sc.have_name) {
                  fail(out);
                  return false;
                }
                sc.have_name = true;
                begin_call(out, n.get<std::string>());
              } else if (sc.key == "arguments") {
                if (sc.value[0] != '{' || sc.have_args) {
                  fail(out);
                  return false;
                }
                sc.have_args = true;
              }
              sc.s = Scan::kComma;
            }
            break;
          }
          case Scan::kComma:
            if (c == ',') {
              sc.s = Scan::kKeyOrEnd;
              sc.first_key = false;
            } else if (c == '}') {
              sc.s = Scan::kDone;
            } else if (!is_ws(c)) {
              fail(out);
              return false;
            }
            break;
          case Scan::kDone:
            break;
        }
        if (consume) take(1);
      }
      return false;
    }
    case State::kDsBetween: {
      skip_ws();
      if (buf_.empty()) return false;
      if (auto s = starts(kDsCallBegin); !s || *s) {
        if (!s) return false;
        take(kDsCallBegin.size());
        state_ = format_ == ToolCallFormat::kDeepSeekV3 ? State::kDsType : State::kDsName;
        return true;
      }
      if (auto s = starts(kDsCallsEnd); !s || *s) {
        if (!s) return false;
        take(kDsCallsEnd.size());
        block_.clear();
        state_ = State::kContent;
        return true;
      }
      fail(out);
      return false;
    }
    case State::kDsType: {
      if (!until(kDsSep)) return false;
      state_ = State::kDsName;
      return true;
    }
    case State::kDsName: {
      const std::string_view end = format_ == ToolCallFormat::kDeepSeekV3 ? kDsV3ArgsOpen : kDsSep;
      auto name = until(end);
      if (!name) return false;
      begin_call(out, *name);
      state_ = State::kDsArgs;
      return true;
    }
    case State::kDsArgs: {
      const std::string_view end = format_ == ToolCallFormat::kDeepSeekV3 ? kDsV3ArgsClose : kDsCallEnd;
      const size_t at = buf_.find(end);
      if (at == std::string::npos) {
        const size_t n = buf_.size() - partial_suffix(buf_, end);
        add_arguments(out, buf_.substr(0, n));
        take(n);
        return false;
      }
      add_arguments(out, buf_.substr(0, at));
      take(at + end.size());
      if (!end_call(out)) {
        fail(out);
        return false;
      }
      state_ = State::kDsBetween;
      return true;
    }
    case State::kDsmlBetween: {
      skip_ws();
      if (buf_.empty()) return false;
      const std::string_view close = format_ == ToolCallFormat::kDsml ? kDsmlToolCallsEnd : kDsmlFunctionCallsEnd;
      if (auto s = starts(kDsmlInvoke); !s || *s) {
        if (!s) return false;
        take(kDsmlInvoke.size());
        state_ = State::kDsmlName;
        return true;
      }
      if (auto s = starts(close); !s || *s) {
        if (!s) return false;
        take(close.size());
        block_.clear();
        state_ = State::kContent;
        return true;
      }
      fail(out);
      return false;
    }
    case State::kDsmlName: {
      auto name = until(kDsmlTagEnd);
      if (!name) return false;
      begin_call(out, *name);
      params_ = 0;
      state_ = State::kDsmlParams;
      return true;
    }
    case State::kDsmlParams: {
      skip_ws();
      if (buf_.empty()) return false;
      if (auto s = starts(kDsmlParam); !s || *s) {
        if (!s) return false;
        take(kDsmlParam.size());
        state_ = State::kDsmlParamName;
        return true;
      }
      if (auto s = starts(kDsmlInvokeEnd); !s || *s) {
        if (!s) return false;
        take(kDsmlInvokeEnd.size());
        add_arguments(out, params_ == 0 ? "{}" : "}");
        if (!end_call(out)) {
          fail(out);
          return false;
        }
        state_ = State::kDsmlBetween;
        return true;
      }
      fail(out);
      return false;
    }
    case State::kDsmlParamName: {
      auto name = until(kDsmlString);
      if (!name) return false;
      param_name_ = *name;
      state_ = State::kDsmlParamKind;
      return true;
    }
    case State::kDsmlParamKind: {
      auto kind = until(kDsmlTagEnd);
      if (!kind) return false;
      if (*kind != "true" && *kind != "false") {
        fail(out);
        return false;
      }
      param_string_ = *kind == "true";
      state_ = State::kDsmlParamValue;
      return true;
    }
    case State::kDsmlParamValue: {
      auto value = until(kDsmlParamEnd);
      if (!value) return false;
      std::string v;
      if (param_string_) {
        v = json(*value).dump(-1, ' ', false, json::error_handler_t::replace);
      } else {
        const json parsed = json::parse(*value, nullptr, false);
        if (parsed.is_discarded()) {
          fail(out);
          return false;
        }
        v = parsed.dump(-1, ' ', false, json::error_handler_t::replace);
      }
      add_arguments(out, (params_++ == 0 ? "{" : ", ") + json(param_name_).dump() + ": " + v);
      state_ = State::kDsmlParams;
      return true;
    }
  }
  return false;
}

ToolCallParser::Whole ToolCallParser::parse(ToolCallFormat format, const std::string& text, uint64_t id_seed,
                                            int max_calls) {
  ToolCallParser p(format, id_seed, max_calls);
  ParseDelta a = p.feed(text);
  ParseDelta b = p.finish();
  if (p.failed()) return {.content = text, .calls = {}};
  return {.content = a.content + b.content, .calls = p.calls()};
}

}  // namespace genbridge::serve
