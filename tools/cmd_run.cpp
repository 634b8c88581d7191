// genbridge run: the main job. Loads (or builds once and caches) a model, decodes a batch of prompts with
// continuous batching, prints the generated ids and a metrics table.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <unistd.h>

#include "genbridge/core/threading.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/npy.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/runner.h"
#include "runtime/model/synthetic.h"
#include "tools/commands.h"
#include "tools/run_support.h"

namespace genbridge::tools {

std::filesystem::path cache_root() {
  if (const char* d = std::getenv("GENBRIDGE_CACHE_DIR")) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::filesystem::path(x) / "genbridge";
  if (const char* h = std::getenv("HOME")) return std::filesystem::path(h) / ".cache" / "genbridge";
  return std::filesystem::temp_directory_path() / "genbridge-cache";
}

std::filesystem::path synthetic_model_dir(const RunOptions& o) {
  return cache_root() / "models" / fmt::format("{}-seed{}", o.preset, o.model_seed);
}

Result<std::filesystem::path> resolve_model_dir(const RunOptions& o) {
  if (!o.model_dir.empty()) return std::filesystem::path(o.model_dir);
  const std::filesystem::path dir = synthetic_model_dir(o);
  if (std::filesystem::exists(dir / "config.json")) return dir;  // config.json is written last: complete
  if (!o.quiet) fmt::print(stderr, "building synthetic model '{}' (seed {}) once, cached in {} ...\n", o.preset, o.model_seed, dir.string());
  const auto t0 = std::chrono::steady_clock::now();
  GB_RETURN_IF_ERROR(model::write_synthetic_checkpoint(o.preset, o.model_seed, dir));
  if (!o.quiet) {
    fmt::print(stderr, "  built in {:.1f} s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return dir;
}

Result<std::vector<engine::Request>> make_requests(const RunOptions& o, int64_t vocab) {
  std::vector<engine::Request> reqs;
  engine::SamplingParams sp{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .seed = o.seed};
  if (!o.prompts.empty()) {
    for (size_t r = 0; r < o.prompts.size(); ++r) {
      engine::Request q;
      std::stringstream ss(o.prompts[r]);
      std::string item;
      while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0') {
          return invalid_argument(fmt::format("--prompt {}: '{}' is not a token id (expected comma-separated integers)", r, item));
        }
        q.prompt.push_back(static_cast<int32_t>(v));
      }
      reqs.push_back(std::move(q));
    }
  } else {
    // Deterministic prompts: a counter-based hash of (request, position), uniform over the vocabulary.
    for (int r = 0; r < o.num_prompts; ++r) {
      engine::Request q;
      for (int i = 0; i < o.prompt_len; ++i) {
        q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(0x5eedull + static_cast<uint64_t>(r), i) *
                                                static_cast<double>(vocab)));
      }
      reqs.push_back(std::move(q));
    }
  }
  for (size_t r = 0; r < reqs.size(); ++r) {
    reqs[r].id = static_cast<int64_t>(r);
    reqs[r].max_new_tokens = o.max_new_tokens;
    reqs[r].stop_tokens = o.stop_tokens;
    reqs[r].sampling = sp;
    reqs[r].sampling.seed = o.seed + r;
  }
  return reqs;
}

namespace {

int fail(const Status& s) {
  fmt::print(stderr, "genbridge run: {}\n", s.to_string());
  return 1;
}

}  // namespace

int run(const RunOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  if (!o.afd.empty()) return run_afd(o);
  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());

  auto dir = resolve_model_dir(o);
  if (!dir.ok()) return fail(dir.status());
  auto ckpt = model::Checkpoint::open(*dir);
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& cfg = ckpt->config();
  if (!o.quiet) fmt::print(stderr, "{}\n", describe_model(*ckpt));

  auto reqs = make_requests(o, cfg.vocab_size);
  if (!reqs.ok()) return fail(reqs.status());
  auto pool = make_pool(*dev, cfg, *reqs, o.kv_memory_mb);
  if (!pool.ok()) return fail(pool.status());
  auto runner = model::ModelRunner::create(*ckpt, *dev, *pool);
  if (!runner.ok()) return fail(runner.status());

  engine::LocalExecutor executor(**runner);
  std::optional<engine::StepTrace> trace;  // --trace: every phase of every forward
  if (!o.trace.empty()) executor.set_trace(&trace.emplace());
  engine::Engine eng(executor, *pool,
                     {.max_batch = o.max_batch, .record_logits = !o.dump_logits.empty()});
  for (auto& r : *reqs) {
    if (Status s = eng.submit(std::move(r)); !s.ok()) return fail(s);
  }
  ProgressPrinter progress(o.quiet);
  if (Status s = eng.run_to_completion([&](const engine::Progress& p) { progress.update(p); }); !s.ok()) {
    progress.clear();
    return fail(s);
  }
  progress.clear();
  if (!o.trace.empty()) {
    if (Status s = trace->write(o.trace); !s.ok()) return fail(s);
    if (!o.quiet) fmt::print(stderr, "wrote trace {}\n", o.trace);
  }
  print_results(eng.results());
  print_metrics(eng.metrics(), *dev, cfg, static_cast<int64_t>(eng.results().size()), 1);
  if (!o.dump_logits.empty()) {
    if (Status s = dump_logits(o.dump_logits, eng.results(), cfg.vocab_size); !s.ok()) return fail(s);
  }
  int refused = 0;
  for (const auto& r : eng.results()) refused += r.reason == engine::FinishReason::kRefused;
  return refused ? 3 : 0;
}

}  // namespace genbridge::tools
