// tools/serve/tool_calls: the tool-call formats on scripted model output (a tiny random model never writes a
// call by itself): whole parses, the same calls streamed one byte at a time, content before and after calls,
// markers split across pieces, broken calls falling back to content; the forced-call grammar accepts exactly
// the format; the template probe finds the format and how null content renders.
#include <gtest/gtest.h>

#include "text/grammar/matcher.h"
#include "tools/serve/tool_calls.h"

namespace genbridge::serve {
namespace {

using ojson = nlohmann::ordered_json;

struct Streamed {
  std::string content;
  std::vector<ToolCall> calls;  // from the deltas
  bool failed = false;
};

// Feeds `text` in pieces of `piece` bytes and rebuilds the calls from the deltas, checking the delta rules.
Streamed stream(ToolCallFormat f, const std::string& text, size_t piece, int max_calls = 1 << 30) {
  ToolCallParser p(f, 42, max_calls);
  Streamed s;
  auto take = [&](const ParseDelta& d) {
    s.content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.first) {
        EXPECT_EQ(c.index, static_cast<int>(s.calls.size()));
        s.calls.push_back({.id = c.id, .name = c.name, .arguments = c.arguments});
      } else {
        EXPECT_FALSE(c.name.size()) << "a later delta names the function again";
        EXPECT_EQ(c.index, static_cast<int>(s.calls.size()) - 1);
        s.calls.back().arguments += c.arguments;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) take(p.feed(text.substr(i, piece)));
  take(p.finish());
  s.failed = p.failed();
  return s;
}

void expect_calls(const std::vector<ToolCall>& got, const std::vector<std::pair<std::string, std::string>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].first);
    EXPECT_EQ(got[i].arguments, want[i].second);
    EXPECT_EQ(got[i].id.rfind("call_", 0), 0u);
    EXPECT_EQ(got[i].id.size(), 29u);
  }
}

// Whole and streamed (1, 3 and 7 bytes at a time) agree, and give `content` and `calls`.
void expect_parse(ToolCallFormat f, const std::string& text, const std::string& content,
                  const std::vector<std::pair<std::string, std::string>>& calls) {
  const auto whole = ToolCallParser::parse(f, text, 42);
  EXPECT_EQ(whole.content, content);
  expect_calls(whole.calls, calls);
  for (size_t piece : {1, 3, 7}) {
    SCOPED_TRACE(piece);
    const Streamed s = stream(f, text, piece);
    EXPECT_FALSE(s.failed);
    EXPECT_EQ(s.content, content);
    expect_calls(s.calls, calls);
    for (size_t i = 0; i < s.calls.size(); ++i) EXPECT_EQ(s.calls[i].id, whole.calls[i].id);
  }
}

TEST(ToolCallParser, hermes_calls_after_content) {
  expect_parse(ToolCallFormat::kHermes,
               "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
               "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
               "Let me check.\n", {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{}"}});
}

TEST(ToolCallParser, hermes_arguments_before_name_and_nested_strings) {
  expect_parse(ToolCallFormat::kHermes,
               "<tool_call>{\"arguments\": {\"q\": \"a}\\\"]{\", \"n\": [1, {\"x\": null}]}, \"name\": \"f\"}"
               "</tool_call>",
               "", {{"f", "{\"q\": \"a}\\\"]{\", \"n\": [1, {\"x\": null}]}"}});
}

TEST(ToolCallParser, hermes_without_calls_is_content_with_a_lone_angle_bracket) {
  expect_parse(ToolCallFormat::kHermes, "a < b and <tool_ but no call", "a < b and <tool_ but no call", {});
}

TEST(ToolCallParser, hermes_broken_call_is_content) {
  const std::string text = "x<tool_call>\n{\"name\": 3}\n</tool_call>";
  const auto whole = ToolCallParser::parse(ToolCallFormat::kHermes, text, 1);
  EXPECT_EQ(whole.content, text);
  EXPECT_TRUE(whole.calls.empty());
  const Streamed s = stream(ToolCallFormat::kHermes, text, 1);
  EXPECT_TRUE(s.failed);
  EXPECT_EQ(s.content, text);  // nothing of the call was sent before it broke
  const auto cut = ToolCallParser::parse(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"argu", 1);
  EXPECT_EQ(cut.content, "<tool_call>\n{\"name\": \"f\", \"argu");  // cut off by max_tokens
}

TEST(ToolCallParser, parallel_tool_calls_false_keeps_the_first_call) {
  const std::string text =
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n"
      "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
  expect_calls(ToolCallParser::parse(ToolCallFormat::kHermes, text, 1, 1).calls, {{"a", "{}"}});
  expect_calls(stream(ToolCallFormat::kHermes, text, 2, 1).calls, {{"a", "{}"}});
}

TEST(ToolCallParser, deepseek_v3_calls) {
  expect_parse(ToolCallFormat::kDeepSeekV3,
               "Sure<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
               "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
               "{\"a\": \"\\n```\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               "Sure", {{"get_weather", "{\"city\": \"Paris\"}"}, {"f", "{\"a\": \"\\n```\"}"}});
}

TEST(ToolCallParser, deepseek_v31_calls) {
  expect_parse(ToolCallFormat::kDeepSeekV31,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"東京\"}"
               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               "", {{"get_weather", "{\"city\": \"東京\"}"}});
}

TEST(ToolCallParser, dsml_parameters_become_json_arguments) {
  expect_parse(
      ToolCallFormat::kDsml,
      "ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"location\" string=\"true\">杭州 \"x\"</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
      "ok\n\n",
      {{"get_weather", "{\"location\": \"杭州 \\\"x\\\"\", \"days\": 3, \"opts\": {\"a\":[1,2]}}"}, {"now", "{}"}});
}

// A forced call's grammar accepts the format with arguments of the tool's schema, and nothing else.
TEST(ToolCallGrammar, forced_calls_follow_the_format_and_the_schema) {
  ToolRequest r;
  r.tools = {{.name = "get_weather",
              .parameters = ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer"}}, "required": ["city"]})")},
             {.name = "now", .parameters = ojson::parse(R"({"type": "object", "properties": {}})")}};
  r.choice = ToolChoice::kRequired;
  std::vector<std::string> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(std::string(1, static_cast<char>(i)));
  auto vocab = text::grammar::Vocabulary::from_bytes(bytes, 256);
  auto accepts = [&](ToolCallFormat f, const ToolRequest& req, const std::string& text) {
    auto g = tool_call_grammar(f, req);
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    auto cg = text::grammar::CompiledGrammar::compile(std::move(g).value(), vocab).value();
    text::grammar::Matcher m(cg, {});
    return m.accept_bytes(text).ok() && m.complete();
  };
  const std::string w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string n = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(accepts(ToolCallFormat::kHermes, r, w));
  EXPECT_TRUE(accepts(ToolCallFormat::kHermes, r, w + "\n" + n));
  EXPECT_FALSE(
      accepts(ToolCallFormat::kHermes, r, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts(ToolCallFormat::kHermes, r, "Sure. " + w));
  ToolRequest one = r;
  one.parallel = false;
  EXPECT_FALSE(accepts(ToolCallFormat::kHermes, one, w + "\n" + n));
  ToolRequest named = r;
  named.choice = ToolChoice::kNamed;
  named.named = "now";
  EXPECT_TRUE(accepts(ToolCallFormat::kHermes, named, n));
  EXPECT_FALSE(accepts(ToolCallFormat::kHermes, named, w));
  EXPECT_TRUE(accepts(ToolCallFormat::kDeepSeekV3, r,
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```"
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"));
  EXPECT_TRUE(accepts(ToolCallFormat::kDeepSeekV31, r,
                      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                      "<｜tool▁calls▁end｜>"));
  EXPECT_TRUE(accepts(ToolCallFormat::kDsml, r,
                      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
                      "string=\"true\">Par is</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">2"
                      "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"));
  ToolRequest bad = r;
  bad.tools[0].parameters = ojson::parse(R"({"type": "object", "properties": {"x": {"not": {}}}})");
  EXPECT_EQ(tool_call_grammar(ToolCallFormat::kHermes, bad).status().message(),
            "tools[0].function.parameters/properties/x/not: 'not' is not supported by constrained decoding "
            "(docs/text.md lists the JSON Schema subset)");
}

text::TokenizerConfig config_with(const std::string& tpl) {
  ojson cfg = {{"chat_template", tpl}, {"eos_token", "<eos>"}};
  return text::TokenizerConfig::from_json_text(cfg.dump()).value();
}

TEST(ProbeTemplate, finds_the_format_and_whether_null_content_renders) {
  // Qwen3's assistant turn (its `in` test fails on None): hermes, null content passed as "".
  const auto qwen = probe_template(config_with(
      "{%- for m in messages %}{%- if m.role == 'assistant' %}{%- if '</think>' in m.content %}x{%- endif %}"
      "{%- for t in m.tool_calls %}<tool_call>\n{\"name\": \"{{ t.function.name }}\", \"arguments\": "
      "{{ t.function.arguments }}}\n</tool_call>{%- endfor %}{%- endif %}{%- endfor %}"));
  EXPECT_EQ(qwen.format, ToolCallFormat::kHermes);
  EXPECT_FALSE(qwen.null_content);
  // DeepSeek-V3's: tool calls only when content is none.
  const auto ds = probe_template(config_with(
      "{%- for m in messages %}{%- if m['role'] == 'assistant' and m['content'] is none %}"
      "{%- for t in m['tool_calls'] %}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ t['type'] }}<｜tool▁sep｜>"
      "{{ t['function']['name'] }}\n```json\n{{ t['function']['arguments'] }}\n```<｜tool▁call▁end｜>"
      "{%- endfor %}{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{%- endif %}{%- endfor %}"));
  EXPECT_EQ(ds.format, ToolCallFormat::kDeepSeekV3);
  EXPECT_TRUE(ds.null_content);
  // A template that prints None for null content, and knows no tool calls.
  const auto plain = probe_template(config_with("{%- for m in messages %}{{ m.content }}{%- endfor %}"));
  EXPECT_EQ(plain.format, ToolCallFormat::kNone);
  EXPECT_FALSE(plain.null_content);
}

}  // namespace
}  // namespace genbridge::serve
