// Chat templates are bounded (docs/text.md "Limits"): every limit of RenderLimits and kMaxTemplateNesting with
// its exact error, the deadline and the cancel flag, range() that is never built as a list for a loop, and
// values nested far deeper than any limit (from the context, or built by the template) that neither crash
// the render nor its clean-up. Each case ends by itself within a few seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>

#include "text/chat_template.h"

namespace genbridge::text {
namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

std::string render(const std::string& tpl, const RenderLimits& limits = {}, const ojson& ctx = ojson::object()) {
  auto t = ChatTemplate::parse(tpl);
  if (!t.ok()) return "PARSE ERROR: " + t.status().to_string();
  auto r = t->render(ctx, limits);
  return r.ok() ? *r : "RENDER ERROR: " + r.status().to_string();
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

constexpr const char* kStepsError =
    "RENDER ERROR: ResourceExhausted: chat template line 1: the render takes more than 100000 steps (max_steps: "
    "statements, expressions, loop iterations and items walked)";

TEST(ChatTemplateLimits, nested_range_loops_end_at_max_steps) {
  RenderLimits small;
  small.max_steps = 100000;
  EXPECT_EQ(render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", small),
            kStepsError);
  EXPECT_EQ(render("{% for i in range(1000000000000000000) %}{% endfor %}", small), kStepsError);
  // The default: a million steps, then the error (not a render of 10^12 iterations). The bound only catches a
  // render that ignores the limit: the steps take ~1 s in Release and ~23 s under the sanitizers on 2 idle
  // cores, more on a loaded machine.
  const auto t0 = Clock::now();
  EXPECT_EQ(render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the render takes more than 1000000 steps "
            "(max_steps: statements, expressions, loop iterations and items walked)");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(120));
}

TEST(ChatTemplateLimits, filters_count_the_items_they_walk) {
  RenderLimits small;
  small.max_steps = 100000;
  // unique compares each item with the ones kept: quadratic, counted as such.
  EXPECT_EQ(render("{{ range(2000) | unique | length }}", small), kStepsError);
  EXPECT_EQ(render("{{ range(1000) | unique | length }}"), "1000");
}

TEST(ChatTemplateLimits, range_in_a_loop_is_never_a_list) {
  EXPECT_EQ(render("{% for i in range(1000000000000000000) %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endfor %}"),
            "012");
  EXPECT_EQ(render("{% for i in range(10, 0, -3) %}{{ i }}:{{ loop.revindex }}:{{ loop.length }}:{{ loop.previtem }}:"
                   "{{ loop.nextitem }} {% endfor %}"),
            "10:4:4::7 7:3:4:10:4 4:2:4:7:1 1:1:4:4: ");
  EXPECT_EQ(render("{% for i in range(5) if i is odd %}{{ i }}{% else %}none{% endfor %}|{% for i in range(0) %}x"
                   "{% else %}empty{% endfor %}"),
            "13|empty");
  EXPECT_EQ(render("{% macro range(n) %}m{{ n }}{% endmacro %}{% for c in range(2) %}{{ c }}{% endfor %}"), "m2");
  // As a value it is a list, refused before it is built when it cannot fit.
  EXPECT_EQ(render("{{ range(1000000000000) | length }}"),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the render takes more than 1000000 steps "
            "(max_steps: statements, expressions, loop iterations and items walked)");
  RenderLimits small;
  small.max_built_bytes = 1 << 20;
  EXPECT_EQ(render("{{ range(100000) | length }}", small),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the render builds more than 1048576 bytes of "
            "strings, lists and dicts (max_built_bytes)");
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 10, 4) | list }} {{ range(3, 0, -1) | list }}"),
            "[0, 1, 2] [1, 5, 9] [3, 2, 1]");
}

TEST(ChatTemplateLimits, output_ends_at_max_output_bytes) {
  const auto t0 = Clock::now();
  EXPECT_EQ(render("{% set s = 'x' * 1000000 %}\n{% for i in range(1000000) %}{{ s }}{% endfor %}"),
            "RENDER ERROR: ResourceExhausted: chat template line 2: the rendered text would exceed 33554432 bytes "
            "(max_output_bytes)");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  RenderLimits small;
  small.max_output_bytes = 10;
  EXPECT_EQ(render("0123456789", small), "0123456789");
  EXPECT_EQ(render("0123456789{{ 'x' }}", small),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the rendered text would exceed 10 bytes "
            "(max_output_bytes)");
  // A macro's output and a block set are strings the template builds: the same bound.
  EXPECT_EQ(render("{% macro m() %}{% for i in range(20) %}y{% endfor %}{% endmacro %}{% set x = m() %}", small),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the rendered text would exceed 10 bytes "
            "(max_output_bytes)");
}

TEST(ChatTemplateLimits, every_string_the_template_builds_is_bounded) {
  const std::string kString =
      "RENDER ERROR: ResourceExhausted: chat template line 1: a string would exceed 33554432 bytes (max_output_bytes)";
  EXPECT_EQ(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            kString);
  EXPECT_EQ(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"),
            kString);
  EXPECT_EQ(render("{{ 'ab' * 100000000 }}"), kString);
  EXPECT_EQ(render("{% set s = 'x' * 10000000 %}{{ [s, s, s, s] | join }}"), kString);
  EXPECT_EQ(render("{% set s = 'x' * 10000000 %}{{ ''.join([s, s, s, s]) }}"), kString);
  EXPECT_EQ(render("{% set s = 'x' * 10000000 %}{{ [s, s, s, s] }}"), kString);
  EXPECT_EQ(render("{% set s = 'x' * 10000000 %}{{ [s, s, s, s] | tojson }}"), kString);
  EXPECT_EQ(render("{{ ('x' * 10000000).replace('x', 'yyyy') }}"), kString);
  EXPECT_EQ(render("{{ ('x' * 10000000) | replace('x', 'yyyy') }}"), kString);
  EXPECT_EQ(render("{{ ('x' * 10000000).replace('', 'yyy') }}"), kString);
  EXPECT_EQ(render("{{ 'a\\nb' | indent(1000000000) }}"), kString);
  EXPECT_EQ(render("{{ [[[1]]] | tojson(indent=100000000) }}"), kString);
}

TEST(ChatTemplateLimits, built_bytes_end_at_max_built_bytes) {
  const std::string kBuilt =
      "RENDER ERROR: ResourceExhausted: chat template line 1: the render builds more than 268435456 bytes of strings, "
      "lists and dicts (max_built_bytes)";
  RenderLimits steps;  // enough steps for the bytes to end these first
  steps.max_steps = 100'000'000;
  // 1 MB copied into a list 1,000 times.
  EXPECT_EQ(render("{% set l = [] %}{% set s = 'x' * 1000000 %}{% for i in range(1000) %}{% set _ = l.append(s) %}"
                   "{% endfor %}",
                   steps),
            kBuilt);
  // Ten million words of a 20 MB string: refused at the part that passes the limit, not after all of them.
  EXPECT_EQ(render("{{ ('a ' * 10000000).split() | length }}", steps), kBuilt);
  EXPECT_EQ(render("{{ ('a\\n' * 10000000).splitlines() | length }}", steps), kBuilt);
  // A list doubled in place of a string.
  EXPECT_EQ(
      render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", steps),
      kBuilt);
  // Characters walked as values.
  EXPECT_EQ(render("{% for c in 'x' * 30000000 %}{% endfor %}"),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the render takes more than 1000000 steps "
            "(max_steps: statements, expressions, loop iterations and items walked)");
}

TEST(ChatTemplateLimits, deadline_and_cancel_reach_the_render) {
  RenderLimits late;
  late.deadline = Clock::now() + std::chrono::milliseconds(100);
  late.max_steps = int64_t{1} << 62;
  const auto t0 = Clock::now();
  const std::string r =
      render("x{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", late);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(std::regex_match(
      r, std::regex("RENDER ERROR: DeadlineExceeded: chat template line 1: the render passed its deadline after "
                    "[0-9]+ steps")))
      << r;
  RenderLimits cancel;
  int calls = 0;
  cancel.cancelled = [&] { return ++calls == 3; };
  const std::string c =
      render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", cancel);
  EXPECT_EQ(c, "RENDER ERROR: Unavailable: chat template line 1: the render was cancelled after " +
                   std::to_string(3 * RenderLimits::kPollSteps) + " steps");
  EXPECT_EQ(calls, 3);
  // A render shorter than kPollSteps never looks at the clock or the flag.
  cancel.cancelled = [] { return true; };
  EXPECT_EQ(render("{% for i in range(3) %}.{% endfor %}", cancel), std::string(3, '.'));
}

TEST(ChatTemplateLimits, template_nesting_is_a_parse_error) {
  const std::string kExpr =
      "PARSE ERROR: InvalidArgument: chat template line 1: an expression nests deeper than 128 levels (brackets, "
      "operators and calls within each other)";
  EXPECT_EQ(render("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ " + repeat("[", 100000) + repeat("]", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ " + repeat("{'a': ", 1000) + "1" + repeat("}", 1000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ " + repeat("not ", 100000) + "x }}"), kExpr);
  EXPECT_EQ(render("{{ " + repeat("-", 100000) + "1 }}"), kExpr);
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ 'a'" + repeat(" | trim", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ x" + repeat(".a", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ x" + repeat("[0]", 100000) + " }}"), kExpr);
  EXPECT_EQ(render("{{ " + repeat("range(", 1000) + "1" + repeat(")", 1000) + " }}"), kExpr);
  EXPECT_EQ(render(repeat("{% if true %}", 100000) + repeat("{% endif %}", 100000)),
            "PARSE ERROR: InvalidArgument: chat template line 1: blocks nest deeper than 128 levels");
  EXPECT_EQ(render(repeat("{% for i in [1] %}", 200) + repeat("{% endfor %}", 200)),
            "PARSE ERROR: InvalidArgument: chat template line 1: blocks nest deeper than 128 levels");
  // Within the limit: parsed and rendered.
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "1");
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 100) + " }}"), "101");
  EXPECT_EQ(render(repeat("{% if true %}", 100) + "y" + repeat("{% endif %}", 100)), "y");
}

TEST(ChatTemplateLimits, render_recursion_ends_at_max_render_depth) {
  EXPECT_EQ(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "RENDER ERROR: InvalidArgument: chat template line 1: macros nest deeper than 64");
  RenderLimits shallow;
  shallow.max_render_depth = 20;
  EXPECT_EQ(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", shallow),
            "RENDER ERROR: ResourceExhausted: chat template line 1: the render nests deeper than 20 levels "
            "(max_render_depth: blocks, expressions and macro calls together)");
}

TEST(ChatTemplateLimits, values_nested_deeper_than_max_value_depth) {
  const std::string kDeep =
      "RENDER ERROR: ResourceExhausted: chat template line 1: a value nests deeper than 256 levels of lists and dicts "
      "(max_value_depth)";
  // Built by the template: 100,000 levels. Printing, tojson and == stop at the limit; freeing the chain (at the
  // end of the render) does not recurse.
  const std::string build =
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}";
  EXPECT_EQ(render(build + "{{ ns.l | tojson }}"), kDeep);
  EXPECT_EQ(render(build + "{{ ns.l }}"), kDeep);
  EXPECT_EQ(render(build + "{{ ns.l == ns.l }}"), kDeep);
  EXPECT_EQ(render(build + "{{ ns.l | length }}"), "1");
  // A list that holds itself.
  EXPECT_EQ(render("{% set l = [] %}{% set _ = l.append(l) %}{{ l | tojson }}"), kDeep);
  // Within the limit.
  EXPECT_EQ(render("{{ " + repeat("[", 100) + repeat("]", 100) + " | tojson }}"), repeat("[", 100) + repeat("]", 100));
}

// `levels` arrays within each other, built without recursion (nlohmann's copy recurses: never copied).
ojson nested_arrays(int levels) {
  ojson deep = ojson::array();
  for (int i = 1; i < levels; ++i) {
    ojson outer = ojson::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  return deep;
}

TEST(ChatTemplateLimits, context_nested_deeper_than_max_value_depth) {
  // 54,000 nested arrays in a message field.
  ojson message = {{"role", "user"}, {"content", "hi"}};
  message["extra"] = nested_arrays(54000);
  ojson request = ojson::object();
  request["messages"] = ojson::array();
  request["messages"].push_back(std::move(message));
  const auto config = TokenizerConfig::from_json_text(R"({"chat_template": "{{ messages | tojson }}"})");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(config->render_chat(request).status().to_string(),
            "InvalidArgument: chat template: the value at $.messages nests deeper than 256 levels of lists and dicts "
            "(max_value_depth)");
  ojson ctx = ojson::object();
  ctx["x"] = nested_arrays(54000);
  EXPECT_EQ(render("{{ x | tojson }}", {}, ctx),
            "RENDER ERROR: InvalidArgument: chat template: the value at $.x nests deeper than 256 levels of lists and "
            "dicts (max_value_depth)");
  // Within the limit.
  ctx["x"] = nested_arrays(200);
  EXPECT_EQ(render("{{ x | tojson }}", {}, ctx), repeat("[", 200) + repeat("]", 200));
}

}  // namespace
}  // namespace genbridge::text
