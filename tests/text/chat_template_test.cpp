// Chat templates: the Jinja2 semantics the subset implements (Python's where @huggingface/jinja differs:
// None/True/2.0 printing, str.strip(chars), code-point indexing), transformers' environment (trim_blocks,
// lstrip_blocks, tojson), and every refusal with its line. The real templates are checked against
// @huggingface/jinja in tests/text/oracle.
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include "support/temp_dir.h"

namespace genbridge::text {
namespace {

using ojson = nlohmann::ordered_json;

std::string render(const std::string& tpl, const ojson& ctx = ojson::object()) {
  auto t = ChatTemplate::parse(tpl);
  if (!t.ok()) return "PARSE ERROR: " + t.status().to_string();
  auto r = t->render(ctx);
  return r.ok() ? *r : "RENDER ERROR: " + r.status().to_string();
}

TEST(ChatTemplate, values_print_as_python_does) {
  EXPECT_EQ(render("{{ none }}|{{ true }}|{{ false }}|{{ 2.0 }}|{{ 3 }}|{{ x }}|{{ undefined_name }}|", {{"x", 1.5}}),
            "None|True|False|2.0|3|1.5||");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }} {{ {'k': 'v', 'q': \"it's\"} }}"),
            "[1, 'a', None, True] {'k': 'v', 'q': \"it's\"}");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e15 }} {{ 1.5e-7 }} {{ 7 / 2 }} {{ 4 / 2 }}"),
            "0.30000000000000004 1e+20 1000000000000000.0 1.5e-07 3.5 2.0");
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 1 ~ 'x' ~ none }}"),
            "3 -4 2 1024 ababab 1xNone");
}

TEST(ChatTemplate, strings_are_code_points) {
  const ojson ctx = {{"s", "h\u00e9llo \U0001F600"}};
  EXPECT_EQ(render("{{ s | length }} {{ s[1] }} {{ s[-1] }} {{ s[::-1] }} {{ s[1:3] }}", ctx),
            "7 \u00e9 \U0001F600 \U0001F600 oll\u00e9h \u00e9l");
  EXPECT_EQ(render("{{ 'xxhixx'.strip('x') }}|{{ '  a b  '.split() }}|{{ 'a,,b'.split(',') }}|{{ ' x '.lstrip() }}|"
                   "{{ 'Hello World'.lower() }}|{{ 'é'.upper() }}|{{ 'a-b-c'.split('-', 1) }}|"
                   "{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith('bc') }}|{{ 'aXbX'.replace('X', '') }}"),
            "hi|['a', 'b']|['a', '', 'b']|x |hello world|\u00c9|['a', 'b-c']|True|True|ab");
}

TEST(ChatTemplate, tojson_is_transformers_json_dumps) {
  const ojson ctx = ojson::parse(R"({"d": {"b": 1, "a": [1, 2.5, null, true, "\u00e9\"\n<>"], "e": {}, "f": []}})");
  EXPECT_EQ(render("{{ d | tojson }}", ctx),
            "{\"b\": 1, \"a\": [1, 2.5, null, true, \"\u00e9\\\"\\n<>\"], \"e\": {}, \"f\": []}");
  EXPECT_EQ(render("{{ d.a | tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  null,\n  true,\n  \"\u00e9\\\"\\n<>\"\n]");
  EXPECT_EQ(render("{{ {'z': 1, 'a': 2} | tojson(sort_keys=true) }}"), "{\"a\": 2, \"z\": 1}");
}

TEST(ChatTemplate, trim_blocks_lstrip_blocks_and_whitespace_control) {
  EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\nend"), "  x\nend");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("x {% if true %}y{% endif %}"), "x y");  // a tag after text on its line keeps the spaces
  EXPECT_EQ(render("{# a comment #}\nz"), "z");
  EXPECT_EQ(render("keep {%+ if true %}v{% endif +%}\nw"), "keep v\nw");
  EXPECT_EQ(render("one trailing newline goes\n"), "one trailing newline goes");
}

TEST(ChatTemplate, loops) {
  const ojson ctx = {{"xs", {"a", "b", "c"}}, {"d", {{"k1", 1}, {"k2", 2}}}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ x }}"
                   "{{ '|' if not loop.last }}{% endfor %}",
                   ctx),
            "103a|212b|321c");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ loop.length }}{{ x }}{% endfor %}", ctx), "2a2c");
  EXPECT_EQ(render("{% for x in [] %}no{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "k1=1;k2=2;");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% if x == 'c' %}"
                   "{% break %}{% endif %}{% endfor %}",
                   ctx),
            "ac");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.cycle('o', 'e') }}{{ loop.previtem }}{% endfor %}", ctx), "oeaob");
  EXPECT_EQ(render("{% for x in xs[::-1] %}{{ x }}{% endfor %}", ctx), "cba");
}

TEST(ChatTemplate, scoping_and_namespace) {
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1, y='a') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}"
                   "{{ ns.x }}{{ ns.y }}"),
            "4a");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set t %}in {{ 1 + 1 }}{% endset %}[{{ t }}]"), "[in 2]");
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(3) %}{{ l }}"), "[3]");
}

TEST(ChatTemplate, macros) {
  EXPECT_EQ(render("{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}{{ m(b=4, a=5) }}"),
            "[1B][23][54]");
  EXPECT_EQ(render("{% macro m(a) %}{{ m(a) }}{% endmacro %}{{ m(1) }}"),
            "RENDER ERROR: InvalidArgument: chat template line 1: macros nest deeper than 64");
}

TEST(ChatTemplate, tests_and_operators) {
  const ojson ctx = {{"m", {{"role", "user"}, {"content", nullptr}}}};
  EXPECT_EQ(render("{{ m.role is defined }}{{ m.x is defined }}{{ m.content is none }}{{ m.role is string }}"
                   "{{ 3 is number }}{{ 3 is odd }}{{ 'ser' in m.role }}{{ 'x' not in ['y'] }}{{ 'role' in m }}"
                   "{{ m.content is not none }}{{ 4 is divisibleby 2 }}{{ false is false }}",
                   ctx),
            "TrueFalseTrueTrueTrueTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}{{ x or 'd' }}{{ 1 and 2 }}{{ not '' }}{{ 1 < 2 <= 2 }}", {{"x", false}}),
            "bd2TrueTrue");
}

TEST(ChatTemplate, filters) {
  const ojson ctx = ojson::parse(R"({"ms": [{"role": "user", "name": "u"}, {"role": "bot", "name": "b"},
                                          {"role": "user", "name": "v"}], "d": {"b": 2, "a": 1}})");
  EXPECT_EQ(
      render("{{ ms | selectattr('role', 'equalto', 'user') | list | length }}|"
             "{{ ms | map(attribute='name') | join(',') }}|{{ ms | rejectattr('role', 'eq', 'user') | first }}|"
             "{{ (ms | last).name }}|{{ d | items | list }}|{{ d | dictsort }}|{{ [3, 1, 2] | sort }}|"
             "{{ ['b', 'A', 'a'] | unique | list }}|{{ missing | default('dflt') }}|{{ '' | default('e', true) }}|"
             "{{ ' t ' | trim }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ '42' | int + 1 }}|"
             "{{ 'x' | float }}|{{ [1, 2.5] | sum }}|{{ 'a\nb' | indent(2) }}|{{ [1, 2] | max }}",
             ctx),
      "2|u,b,v|{'role': 'bot', 'name': 'b'}|v|[['b', 2], ['a', 1]]|[['a', 1], ['b', 2]]|[1, 2, 3]|"
      "['b', 'A']|dflt|e|t|Hello World|Hello|43|0.0|3.5|a\n  b|2");
}

TEST(ChatTemplate, raise_exception_is_an_error_with_its_message) {
  EXPECT_EQ(render("{% if true %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"),
            "RENDER ERROR: InvalidArgument: chat template raised an exception: Only user and assistant roles are "
            "supported!");
}

TEST(ChatTemplate, unsupported_constructs_fail_at_load_with_their_line) {
  EXPECT_EQ(render("a\n{{ x | batch(3) }}"),
            "PARSE ERROR: InvalidArgument: chat template line 2: unsupported filter 'batch'");
  EXPECT_EQ(render("\n\n{% include 'other.jinja' %}"),
            "PARSE ERROR: InvalidArgument: chat template line 3: unsupported statement '{% include %}'");
  EXPECT_EQ(render("{{ x }}\n{{ helper(1) }}"),
            "PARSE ERROR: InvalidArgument: chat template line 2: unsupported function 'helper()' (not a global this "
            "engine provides nor a macro of the template)");
  EXPECT_EQ(render("{{ 'a{}'.format(1) }}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: unsupported method '.format()'");
  EXPECT_EQ(render("{% if x is sameas_not %}{% endif %}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: unsupported test 'sameas_not'");
  EXPECT_EQ(render("{% for x in y recursive %}{% endfor %}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: unsupported construct 'for ... recursive'");
  EXPECT_EQ(render("x\n{% if true %}\n{{ 1 }"),
            "PARSE ERROR: InvalidArgument: chat template line 3: a tag is not closed: '}}' is missing");
  EXPECT_EQ(render("{% if true %}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: the template ends before '{% endif %}'");
  EXPECT_EQ(render("{% endfor %}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: '{% endfor %}' without its opening statement");
  EXPECT_EQ(render("{{ 1 + }}"),
            "PARSE ERROR: InvalidArgument: chat template line 1: unexpected the end of the tag in an expression");
}

TEST(ChatTemplate, render_errors_name_their_line) {
  EXPECT_EQ(render("\n{{ messages[0].role }}", {{"messages", ojson::array()}}),
            "RENDER ERROR: InvalidArgument: chat template line 2: cannot read attribute 'role' of an undefined value");
  EXPECT_EQ(render("{{ 'a' + 1 }}"),
            "RENDER ERROR: InvalidArgument: chat template line 1: unsupported operand types for +: 'str' and 'int'");
  EXPECT_EQ(render("{% set x = 1 %}{% set x.y = 2 %}"),
            "RENDER ERROR: InvalidArgument: chat template line 1: '{% set x.y %}' needs 'x' to be a namespace()");
}

TEST(TokenizerConfig, special_tokens_and_named_templates) {
  const auto c = TokenizerConfig::from_json_text(R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
    "chat_template": [{"name": "default", "template": "{{ bos_token }}D{{ tools }}"},
                      {"name": "tool_use", "template": "T{{ tools | length }}{{ eos_token }}"}]})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c->render_chat(ojson::parse(R"({"messages": []})")), "<s>DNone");
  EXPECT_EQ(*c->render_chat(ojson::parse(R"({"messages": [], "tools": [{}, {}]})")), "T2</s>");
  const auto bad = TokenizerConfig::from_json_text(R"({"chat_template": "{% for %}"})");
  EXPECT_EQ(bad.status().to_string(),
            "InvalidArgument: tokenizer_config.json: $.chat_template: chat template line 1: expected a name but found "
            "the end of the tag");
  const auto none = TokenizerConfig::from_json_text("{}");
  EXPECT_EQ(none->render_chat(ojson::parse(R"({"messages": []})")).status().to_string(),
            "InvalidArgument: render_chat: the tokenizer has no chat template (no chat_template in "
            "tokenizer_config.json, no chat_template.jinja)");
}

// add_bos_token / add_eos_token (what encoding with special tokens adds, e.g. DeepSeek-V3's BOS): booleans, false when
// absent or null.
TEST(TokenizerConfig, add_bos_and_eos_token_flags) {
  const auto c = TokenizerConfig::from_json_text(R"({"add_bos_token": true, "add_eos_token": null})");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->add_bos_token);
  EXPECT_FALSE(c->add_eos_token);
  EXPECT_FALSE(TokenizerConfig::from_json_text("{}")->add_bos_token);
  EXPECT_EQ(TokenizerConfig::from_json_text(R"({"add_bos_token": "yes"})").status().message(),
            "tokenizer_config.json: $.add_bos_token must be a boolean");
}

// A model directory's chat_template.jinja (and additional_chat_templates/<name>.jinja) replace every template of its
// tokenizer_config.json, as transformers loads them (DeepSeek-V4's Jinja template was published as such a file).
TEST(TokenizerConfig, chat_template_jinja_file_replaces_the_configs_templates) {
  testing::TempDir dir;
  testing::write_file_bytes(dir / "tokenizer_config.json", R"({"bos_token": "<s>",
    "chat_template": [{"name": "default", "template": "config"}, {"name": "tool_use", "template": "config tools"},
                      {"name": "rag", "template": "config rag"}]})");
  const ojson chat = ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  const ojson tools = ojson::parse(R"({"messages": [{"role": "user", "content": "t"}], "tools": [{}]})");
  auto c = TokenizerConfig::load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c->render_chat(chat), "config");
  EXPECT_EQ(*c->render_chat(tools), "config tools");

  testing::write_file_bytes(dir / "chat_template.jinja", "{{ bos_token }}file {{ messages[0].content }}\n");
  c = TokenizerConfig::load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  // The file's last newline is not rendered (Jinja2's keep_trailing_newline is off, as in transformers).
  EXPECT_EQ(*c->render_chat(chat), "<s>file hi");
  EXPECT_EQ(*c->render_chat(tools), "<s>file t");  // the config's tool_use template is gone with the rest
  EXPECT_TRUE(c->named_templates.empty());

  std::filesystem::create_directory(dir / "additional_chat_templates");
  testing::write_file_bytes(dir / "additional_chat_templates/tool_use.jinja", "file tools {{ tools | length }}");
  testing::write_file_bytes(dir / "additional_chat_templates/notes.txt", "{% not a template");
  c = TokenizerConfig::load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c->render_chat(tools), "file tools 1");
  EXPECT_EQ(c->named_templates.size(), 1u);

  // The file alone (no tokenizer_config.json): a template without special tokens.
  std::filesystem::remove(dir / "tokenizer_config.json");
  c = TokenizerConfig::load(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c->render_chat(chat), "file hi");
  EXPECT_FALSE(c->bos_token.has_value());
}

TEST(TokenizerConfig, template_file_errors_name_the_file_and_the_line) {
  testing::TempDir dir;
  EXPECT_EQ(TokenizerConfig::load(dir.path()).status().to_string(),
            "InvalidArgument: tokenizer config: " + dir.path().string() +
                " holds neither tokenizer_config.json nor chat_template.jinja");
  testing::write_file_bytes(dir / "chat_template.jinja", "ok\n{% for %}");
  EXPECT_EQ(TokenizerConfig::load(dir.path()).status().to_string(),
            "InvalidArgument: " + (dir / "chat_template.jinja").string() +
                ": chat template line 2: expected a name but found the end of the tag");
  testing::write_file_bytes(dir / "chat_template.jinja", "ok");
  std::filesystem::create_directory(dir / "additional_chat_templates");
  testing::write_file_bytes(dir / "additional_chat_templates/tool_use.jinja", "{{ x | batch(2) }}");
  EXPECT_EQ(TokenizerConfig::load(dir.path()).status().to_string(),
            "InvalidArgument: " + (dir / "additional_chat_templates/tool_use.jinja").string() +
                ": chat template line 1: unsupported filter 'batch'");
}

}  // namespace
}  // namespace genbridge::text
