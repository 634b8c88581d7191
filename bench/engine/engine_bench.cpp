// Engine decode throughput on the synthetic `small` preset (built once under $GENBRIDGE_CACHE_DIR or /tmp),
// batch 1 / 8 / 32, monolithic and AFD (in-process, sync connector, S = 1 and 2). Reports decode tokens/s and
// the weight bytes a decode step streams per second (attention + router + the experts the batch routes to +
// LM head) as a ratio to the same-binary copy kernel.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "afd/engine_job.h"
#include "runtime/engine/engine.h"
#include "runtime/model/synthetic.h"
#include "support/bench_util.h"

namespace genbridge::bench {
namespace {

struct Model {
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
};

Model& small_model() {
  static Model m = [] {
    const char* cache = std::getenv("GENBRIDGE_CACHE_DIR");
    const std::filesystem::path dir =
        std::filesystem::path(cache ? cache : "/tmp/genbridge-bench-cache") / "models" / "small-seed0";
    if (!std::filesystem::exists(dir / "config.json")) {
      const Status st = model::write_synthetic_checkpoint("small", 0, dir);
      if (!st.ok()) std::abort();
    }
    Model out;
    out.ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir)).value());
    out.dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
    return out;
  }();
  return m;
}

std::vector<engine::Request> requests(int batch, int new_tokens, int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < batch; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 16; ++i) q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(r, i) * vocab));
    q.max_new_tokens = new_tokens;
    reqs.push_back(q);
  }
  return reqs;
}

// Weight bytes one decode step reads with `batch` tokens: everything but the experts, plus the distinct
// experts the tokens route to (estimated as E * (1 - (1 - k/E)^batch) per MoE layer).
double weight_bytes_per_step(const model::ModelConfig& c, int batch) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts, k = c.num_experts_per_tok;
  const double attn = H * (c.q_size() + 2 * c.kv_size()) + c.q_size() * H;
  double total = c.vocab_size * H;  // LM head
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += attn;
    if (c.is_moe_layer(l)) {
      const double used = E * (1.0 - std::pow(1.0 - k / E, batch));
      total += E * H + used * 3 * H * I + (c.has_shared_expert() ? 3 * H * c.shared_expert_intermediate_size + H : 0);
    } else {
      total += 3 * H * c.intermediate_size;
    }
  }
  return total * 2;  // bf16
}

void BM_decode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0)), afd_stages = static_cast<int>(state.range(1));
  Model& m = small_model();
  const model::ModelConfig& c = m.ckpt->config();
  const int new_tokens = 8;
  double decode_s = 0;
  int64_t decode_tokens = 0;
  for (auto _ : state) {
    engine::EngineMetrics metrics;
    if (afd_stages == 0) {
      auto pool = runtime::KvPagePool::create(
          m.dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), batch);
      auto runner = model::ModelRunner::create(*m.ckpt, *m.dev, *pool);
      engine::LocalExecutor ex(**runner);
      engine::Engine eng(ex, *pool, {.max_batch = batch});
      for (auto& r : requests(batch, new_tokens, c.vocab_size)) (void)eng.submit(r);
      if (!eng.run_to_completion().ok()) state.SkipWithError("engine failed");
      metrics = eng.metrics();
    } else {
      afd::EngineJobOptions o;
      o.afd.num_attention = 1;
      o.afd.num_ffn = 1;
      o.afd.num_stages = afd_stages;
      o.engine.max_batch = batch;
      auto job = afd::run_inproc_engine_job(*m.ckpt, *m.dev, requests(batch, new_tokens, c.vocab_size), batch, o);
      if (!job.ok()) state.SkipWithError(job.status().to_string().c_str());
      else metrics = job->metrics;
    }
    decode_s += metrics.decode_seconds;
    decode_tokens += metrics.decode_tokens;
    state.SetIterationTime(metrics.decode_seconds);
  }
  const double steps = static_cast<double>(decode_tokens) / batch;
  const double gbps = weight_bytes_per_step(c, batch) * steps / decode_s / 1e9;
  const double copy = copy_gbps(static_cast<size_t>(weight_bytes_per_step(c, batch)));
  state.counters["decode_tok/s"] = static_cast<double>(decode_tokens) / decode_s;
  state.counters["weight_GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy;
  state.counters["ratio"] = gbps / copy;
  state.SetLabel(afd_stages == 0 ? "monolithic" : fmt::format("AFD 1A1F sync S={}", afd_stages));
}

BENCHMARK(BM_decode)
    ->ArgNames({"batch", "afd_stages"})
    ->Args({1, 0})
    ->Args({8, 0})
    ->Args({32, 0})
    ->Args({8, 1})
    ->Args({8, 2})
    ->Args({32, 1})
    ->Args({32, 2})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace genbridge::bench
