// Engine throughput on the synthetic `small` preset, in the *_qwen35 rows on `small-qwen35` (6 Gated DeltaNet
// + 2 full-attention layers, sized like small) and in the *_dsv4 rows on `small-dsv4` (DeepSeek-V4: 2 sliding-
// window, 3 ratio-4 and 3 ratio-128 layers, 4 hyper-connection streams, sized like small), each built once under
// $GENBRIDGE_CACHE_DIR or /tmp;
// bf16 weights; threads = GENBRIDGE_NUM_THREADS or the machine's cores; each row with its roofline
// (bench/support/bench_util.h) and the CPU target in the context:
//   engine_prefill/prompt:L     one L-token prompt, one new token; prefill tok/s = prompt tokens / time in
//                               prefill forwards. Figure: fma_frac (FLOPs from the model config below;
//                               target >= 0.5 of the FMA roof), or under avx512_bf16 dot_frac (against the bf16
//                               dot instruction's roof; target >= 0.6, docs/bench/targets.md).
//   engine_decode/batch:B/...   B prompts of `prompt` tokens, `new` tokens each, max batch B; decode
//                               tok/s = decode tokens / time in decode forwards. Per decode step: bytes =
//                               the weights the step reads (attention, router, LM head, and the experts
//                               the B tokens route to, estimated as E (1 - (1 - k/E)^B) per layer) + the KV
//                               cache read; FLOPs = B x the per-token FLOPs below. Figure at B = 1:
//                               mem_frac (target >= 0.7 of the cold copy); x_batch1 = tok/s / tok/s at
//                               batch 1 of the same prompt/new (target at B = 32: >= 8).
//   roof_tok/s                  tok/s at the roofline bound = tok/s / roof_frac.
// Prompts are the CLI's (`genbridge run --num-prompts B --prompt-len L --max-new-tokens N --max-batch B`
// generates the same ones). AFD rows (afd_stages > 0) run 1 attention + 1 FFN rank as threads (in-process
// transport, sync connector) on the same cores: they show the connector's overhead. engine_afd_link rows: the
// same under the link model, step time against injected latency (their counters are described at BM_afd_link).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "afd/engine_job.h"
#include "afd/placement.h"
#include "runtime/engine/assembly.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/deepseek_attention.h"
#include "support/bench_util.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::bench {
namespace {

struct Model {
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
};

// The benchmarked presets: 0 small (Qwen3-MoE, the engine_* rows), 1 small-qwen35 (Qwen3.5-MoE, the
// engine_*_qwen35 rows), 2 small-dsv4 (DeepSeek-V4, the engine_*_dsv4 rows).
constexpr const char* kPresets[] = {"small", "small-qwen35", "small-dsv4"};

// A preset with seed 0 (and `router_skew`, make-model's --router-skew), built once under the cache directory.
Model& load_model(const char* preset, int router_skew) {
  static std::map<std::pair<std::string, int>, Model> models;
  const std::pair<std::string, int> key{preset, router_skew};
  auto it = models.find(key);
  if (it != models.end()) return it->second;
  const char* cache = std::getenv("GENBRIDGE_CACHE_DIR");
  const std::string name =
      router_skew == 0 ? fmt::format("{}-seed0", preset) : fmt::format("{}-skew{}-seed0", preset, router_skew);
  const std::filesystem::path dir = std::filesystem::path(cache ? cache : "/tmp/genbridge-bench-cache") / "models" / name;
  if (!std::filesystem::exists(dir / "config.json")) {
    const Status st = model::write_synthetic_checkpoint(preset, 0, dir, 1, router_skew);
    if (!st.ok()) std::abort();
  }
  Model out;
  out.ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir)).value());
  out.dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
  return models.emplace(key, std::move(out)).first->second;
}

Model& bench_model(int64_t which) { return load_model(kPresets[which], 0); }

// The CLI's generated prompts (tools/run_support.cpp make_requests), greedy.
std::vector<engine::Request> requests(int n, int prompt_len, int new_tokens, int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < n; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < prompt_len; ++i) {
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(0x5eedull + static_cast<uint64_t>(r), i) *
                                              static_cast<double>(vocab)));
    }
    q.max_new_tokens = new_tokens;
    reqs.push_back(q);
  }
  return reqs;
}

// Weight elements of one layer's token mixer: GQA projections (Qwen3.5's q_proj holds [q | gate]) or, for a
// Gated DeltaNet layer, in_proj_qkv / z / b / a, the conv weights and out_proj; DeepSeek-V4: wq_a, wq_b, wkv,
// wo_a, wo_b, the compressor's wkv / wgate and the indexer's wq_b, weights_proj and compressor, and the two
// hyper-connection sites' fn (fp32: counted twice, for their bytes).
double mixer_weights(const model::ModelConfig& c, int64_t l) {
  const double H = c.hidden_size;
  if (c.is_deepseek_v4()) {
    const model::DeepseekV4Config& d = c.dsv4;
    const double D = c.head_dim, heads = c.num_attention_heads, n = d.hc_mult, m = d.compress_ratio(l);
    double w = H * d.q_lora_rank + d.q_lora_rank * heads * D + H * D + heads * D * d.o_lora_rank +
               d.o_groups * d.o_lora_rank * H + 2 * 2 * (2 + n) * n * n * H;
    if (m > 0) w += 2 * (m == 4 ? 2 : 1) * D * H;
    if (m == 4) {
      w += static_cast<double>(d.index_n_heads) * d.index_head_dim * d.q_lora_rank + d.index_n_heads * H +
           2 * 2.0 * d.index_head_dim * H;
    }
    return w;
  }
  if (c.is_linear_layer(l)) {
    const model::Qwen35Config& q = c.qwen35;
    return H * (q.conv_dim() + q.value_dim() + 2.0 * q.linear_num_value_heads) +
           static_cast<double>(q.conv_dim()) * q.linear_conv_kernel_dim + q.value_dim() * H;
  }
  return H * (c.q_proj_size() + 2 * c.kv_size()) + c.q_size() * H;
}

// Weight bytes a forward over `tokens` tokens reads: everything but the embedding, with the distinct
// experts the tokens route to estimated as E (1 - (1 - k/E)^tokens) per MoE layer.
double weight_bytes(const model::ModelConfig& c, double tokens) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts, k = c.num_experts_per_tok;
  double total = c.vocab_size * H;  // LM head
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    total += mixer_weights(c, l);
    if (c.is_moe_layer(l)) {
      const double used = E * (1.0 - std::pow(1.0 - k / E, tokens));
      const double shared = c.is_deepseek_v4()      ? 3 * H * I * c.dsv4.n_shared_experts
                            : c.has_shared_expert() ? 3 * H * c.shared_expert_intermediate_size + H
                                                    : 0;
      total += E * H + used * 3 * H * I + shared;
    } else {
      total += 3 * H * c.intermediate_size;
    }
  }
  return total * static_cast<double>(dtype_size(c.torch_dtype));
}

// FLOPs of one token at position `ctx` (attending to ctx + 1 positions), without the LM head: projections,
// router, routed (+ shared) experts, scores and V accumulation; a Gated DeltaNet layer's conv and its
// recurrence (per value head: S k, the rank-1 update and S q, ~6 dk dv).
double token_flops(const model::ModelConfig& c, double ctx) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts, k = c.num_experts_per_tok;
  double f = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    f += 2 * mixer_weights(c, l);
    if (c.is_deepseek_v4()) {  // window + compressed entries (+ the indexer's scores over the ratio-4 windows)
      const model::DeepseekV4Config& d = c.dsv4;
      const double m = d.compress_ratio(l), visible = m > 0 ? std::floor((ctx + 1) / m) : 0;
      const double entries = m == 4 ? std::min<double>(visible, d.index_topk) : visible;
      f += 4.0 * c.num_attention_heads * c.head_dim * (std::min<double>(ctx + 1, d.sliding_window) + entries);
      if (m == 4) f += 2.0 * d.index_n_heads * d.index_head_dim * visible;
    } else if (c.is_linear_layer(l)) {
      const model::Qwen35Config& q = c.qwen35;
      f += 6.0 * q.linear_num_value_heads * q.linear_key_head_dim * q.linear_value_head_dim;
    } else {
      f += 4.0 * c.num_attention_heads * c.head_dim * (ctx + 1);
    }
    if (c.is_moe_layer(l)) {
      const double shared = c.is_deepseek_v4()      ? 6 * H * I * c.dsv4.n_shared_experts
                            : c.has_shared_expert() ? 6 * H * c.shared_expert_intermediate_size
                                                    : 0;
      f += 2 * H * E + 6 * H * I * k + shared;
    } else {
      f += 6 * H * c.intermediate_size;
    }
  }
  return f;
}
double lm_head_flops(const model::ModelConfig& c) { return 2.0 * c.hidden_size * c.vocab_size; }

// 1 attention + 1 FFN rank as threads of this process, `stages` micro-batches, the link model's one-way
// latency `link_us` (0: none) on every transfer.
Result<afd::EngineJobResult> run_afd(Model& m, std::vector<engine::Request> reqs, int stages, int64_t link_us,
                                     afd::ConnectorKind connector) {
  const int n = static_cast<int>(reqs.size());
  afd::EngineJobOptions o;
  o.afd.num_attention = 1;
  o.afd.num_ffn = 1;
  o.afd.num_stages = stages;
  afd::set_connector(connector, &o.afd);
  o.afd.link_latency_us = link_us;
  o.engine.max_batch = n;
  return afd::run_inproc_engine_job(*m.ckpt, *m.dev, std::move(reqs), n, o);
}

Result<engine::EngineMetrics> run(int64_t which, int n, int prompt_len, int new_tokens, int afd_stages) {
  Model& m = bench_model(which);
  const model::ModelConfig& c = m.ckpt->config();
  auto reqs = requests(n, prompt_len, new_tokens, c.vocab_size);
  if (afd_stages == 0) {
    // The CLI's engine: room for every request at once, bf16 weights.
    const engine::AssemblyOptions assembly{.engine = {.max_batch = n}, .kv_pool = {.state_slots = n}};
    GB_ASSIGN_OR_RETURN(const engine::KvPoolPlan pool, engine::plan_kv_pool(assembly.kv_pool, *m.dev, c, reqs));
    GB_ASSIGN_OR_RETURN(auto job, engine::assemble_engine(*m.ckpt, *m.dev, pool.pages, assembly));
    engine::Engine& eng = *job->engine;
    for (auto& r : reqs) GB_RETURN_IF_ERROR(eng.submit(r));
    GB_RETURN_IF_ERROR(eng.run_to_completion());
    return eng.metrics();
  }
  GB_ASSIGN_OR_RETURN(auto job, run_afd(m, std::move(reqs), afd_stages, 0, afd::ConnectorKind::kSync));
  return job.metrics;
}

template <int64_t which>
void BM_prefill(benchmark::State& state) {
  const int L = static_cast<int>(state.range(0));
  const model::ModelConfig& c = bench_model(which).ckpt->config();
  double best = 1e30;
  for (auto _ : state) {
    auto m = run(which, 1, L, 1, 0);
    if (!m.ok()) return state.SkipWithError(m.status().to_string().c_str());
    state.SetIterationTime(m->prefill_seconds);
    best = std::min(best, m->prefill_seconds);
  }
  double flops = lm_head_flops(c);
  for (int t = 0; t < L; ++t) flops += token_flops(c, t);
  // bf16 weights: where the CPU has the bf16 dot instruction its roof binds (dot_frac), as in the linear bench.
  const Work work{.bytes = weight_bytes(c, L), .flops = flops, .cold = true, .bf16_dot = true};
  set_roofline_counters(state, work, best);
  state.counters["tok/s"] = L / best;
  state.counters["roof_tok/s"] = L / best / state.counters["roof_frac"];
  state.SetLabel(kPresets[which]);
}

template <int64_t which>
void BM_decode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0)), prompt = static_cast<int>(state.range(1)),
            new_tokens = static_cast<int>(state.range(2)), afd_stages = static_cast<int>(state.range(3));
  Model& model = bench_model(which);
  const model::ModelConfig& c = model.ckpt->config();
  // Per sequence and step, a Gated DeltaNet model reads and writes its state slot (DeepSeek-V4: the window
  // rings, read twice: copied into the step's window, then attended).
  const double state_bytes =
      static_cast<double>(model.dev->kv_page_geometry(model::kv_model_shape(c)).state.bytes_per_slot());
  double best = 1e30;
  engine::EngineMetrics metrics;
  for (auto _ : state) {
    auto m = run(which, batch, prompt, new_tokens, afd_stages);
    if (!m.ok()) return state.SkipWithError(m.status().to_string().c_str());
    state.SetIterationTime(m->decode_seconds);
    if (m->decode_seconds < best) {
      best = m->decode_seconds;
      metrics = *m;
    }
  }
  // All requests start and end together: decode steps = new_tokens - 1, each over `batch` tokens at an
  // average context of prompt + new_tokens / 2.
  const double steps = static_cast<double>(metrics.decode_tokens) / batch;
  const double ctx = prompt + new_tokens / 2.0;
  const Work step{.bytes = weight_bytes(c, batch) + batch * ctx * static_cast<double>(metrics.kv_bytes_per_token) +
                           2 * batch * state_bytes,
                  .flops = batch * (token_flops(c, ctx) + lm_head_flops(c)),
                  .cold = true,
                  .read_roof = batch == 1,
                  .bf16_dot = true};
  set_roofline_counters(state, step, best / steps);
  const double tok_s = static_cast<double>(metrics.decode_tokens) / best;
  state.counters["tok/s"] = tok_s;
  state.counters["roof_tok/s"] = tok_s / state.counters["roof_frac"];
  static std::map<std::tuple<int64_t, int, int, int>, double> batch1;
  if (batch == 1) batch1[{which, prompt, new_tokens, afd_stages}] = tok_s;
  if (auto it = batch1.find({which, prompt, new_tokens, afd_stages}); it != batch1.end())
    state.counters["x_batch1"] = tok_s / it->second;
  state.SetLabel(fmt::format("{} {}", kPresets[which],
                             afd_stages == 0 ? "monolithic" : fmt::format("AFD 1A1F sync S={}", afd_stages)));
}

// AFD 1A1F on `small` under the link model: decode step time against the injected one-way latency, per
// connector and stage count, with how much of the link the pipeline keeps off the step. Within a row group
// (batch, stages, connector) the link_us:0 row runs first and is the reference:
//   step_ms     decode step time (the AFD report's mean TPOT; warm-up steps excluded), the best of 3 runs
//   added_ms    step_ms - the link_us:0 row's
//   serial_ms   what the link would add if every transfer were waited for in turn: stages x 2 x latency x
//               MoE layers (one message each way per stage and layer; the bandwidth is unlimited here)
//   hidden      1 - added_ms / serial_ms: the fraction of the link's time the schedule hides
void BM_afd_link(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0)), stages = static_cast<int>(state.range(1));
  const int64_t link_us = state.range(2);
  const auto connector = state.range(3) ? afd::ConnectorKind::kAsync : afd::ConnectorKind::kSync;
  Model& model = bench_model(0);
  const model::ModelConfig& c = model.ckpt->config();
  double step_ms = 1e30, tok_s = 0;
  for (auto _ : state) {
    auto job = run_afd(model, requests(batch, 32, 32, c.vocab_size), stages, link_us, connector);
    if (!job.ok()) return state.SkipWithError(job.status().to_string().c_str());
    state.SetIterationTime(job->report.decode_s);
    if (job->report.tpot_mean_ms < step_ms) {
      step_ms = job->report.tpot_mean_ms;
      tok_s = static_cast<double>(job->report.decode_tokens) / job->report.decode_s;
    }
  }
  int moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
  static std::map<std::tuple<int, int, int>, double> no_link;
  const std::tuple<int, int, int> group{batch, stages, static_cast<int>(state.range(3))};
  if (link_us == 0) no_link[group] = step_ms;
  state.counters["step_ms"] = step_ms;
  state.counters["tok/s"] = tok_s;
  if (auto it = no_link.find(group); it != no_link.end() && link_us > 0) {
    const double serial_ms = stages * 2.0 * static_cast<double>(link_us) / 1000.0 * moe_layers;
    state.counters["added_ms"] = step_ms - it->second;
    state.counters["serial_ms"] = serial_ms;
    state.counters["hidden"] = 1.0 - (step_ms - it->second) / serial_ms;
  }
  state.SetLabel(fmt::format("small AFD 1A1F {} S={}", afd::connector_kind_name(connector), stages));
}

void afd_link_rows(benchmark::internal::Benchmark* b) {
  for (int async : {0, 1}) {
    for (int batch : {8, 32, 64}) {
      for (int stages : {1, 2, 3}) {
        for (int64_t link_us : {0, 1000, 3000}) b->Args({batch, stages, link_us, async});
      }
    }
  }
}

BENCHMARK(BM_afd_link)
    ->Name("engine_afd_link")
    ->ArgNames({"batch", "stages", "link_us", "async"})
    ->Apply(afd_link_rows)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

// Redundant experts on a skewed `small` (make-model --router-skew S): AFD 1A2F, sync, 32 prompts of 32 tokens
// and 32 new tokens at batch 32; the first step (the prefill of every prompt) is warm-up, so the AFD counters
// are the 31 decode steps'. A row first runs the job without copies once to measure the decode load the copies
// are placed from (afd/placement.h), then alternates runs without copies (base) and with `redundant` copies per
// layer, so both see the same machine; the counters are medians over the pairs:
//   step_ms, base_step_ms          decode step time (TPOT) with and without the copies; x_step their ratio
//                                  per pair (below 1: faster)
//   prefill_ms, x_prefill          time in prefill forwards (the engine's), and the ratio likewise
//   layer_rows, base_layer_rows    per MoE layer, the busiest FFN rank's rows / the mean rank's, averaged over
//                                  the layers (1: even); the routing is the same in every run
//   ffn_crit_ms, x_ffn_crit        expert compute on the critical path per decode step: each MoE layer's busiest
//                                  FFN rank, summed over the layers (AfdReport::ffn_critical_ms / steps)
//   even_ms, base_even_ms          the same if every rank took the mean: the work itself, which copies raise
//                                  when a hot expert's weights are read on two ranks
// Each FFN rank's kernels share this machine's cores with the other's (GENBRIDGE_NUM_THREADS=1 gives each rank
// one thread, as separate devices would have).
void BM_afd_eplb(benchmark::State& state) {
  const int redundant = static_cast<int>(state.range(0)), skew = static_cast<int>(state.range(1));
  Model& model = load_model("small", skew);
  const model::ModelConfig& c = model.ckpt->config();
  static std::map<int, afd::ExpertLoad> loads;
  const auto job = [&](int copies) -> Result<afd::EngineJobResult> {
    afd::EngineJobOptions o;
    o.afd.num_attention = 1;
    o.afd.num_ffn = 2;
    o.afd.redundant_experts = copies;
    o.warmup_steps = 1;
    o.engine.max_batch = 32;
    if (copies > 0) o.expert_load = loads.at(skew);
    return afd::run_inproc_engine_job(*model.ckpt, *model.dev, requests(32, 32, 32, c.vocab_size), 32, o);
  };
  if (!loads.count(skew)) {
    auto first = job(0);
    if (!first.ok()) return state.SkipWithError(first.status().to_string().c_str());
    loads[skew] = afd::measured_expert_load(first->report, c);
  }
  struct Run {
    double step_ms, prefill_ms, crit_ms, even_ms, layer_rows;
  };
  std::vector<Run> base, with;
  for (auto _ : state) {
    for (int copies : {0, redundant}) {
      auto j = job(copies);
      if (!j.ok()) return state.SkipWithError(j.status().to_string().c_str());
      const afd::AfdReport& r = j->report;
      const double steps = static_cast<double>(r.decode_steps);
      (copies == 0 ? base : with)
          .push_back({r.tpot_mean_ms, j->metrics.prefill_seconds * 1e3, r.ffn_critical_ms / steps,
                      r.ffn_even_ms / steps, r.layer_ffn_max_over_mean});
      if (copies > 0) state.SetIterationTime(r.decode_s);
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  const auto of = [&](const std::vector<Run>& runs, double Run::*f) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(r.*f);
    return median(v);
  };
  const auto ratio = [&](double Run::*f) {
    std::vector<double> v;
    for (size_t i = 0; i < with.size(); ++i) v.push_back(with[i].*f / base[i].*f);
    return median(v);
  };
  state.counters["step_ms"] = of(with, &Run::step_ms);
  state.counters["base_step_ms"] = of(base, &Run::step_ms);
  state.counters["x_step"] = ratio(&Run::step_ms);
  state.counters["prefill_ms"] = of(with, &Run::prefill_ms);
  state.counters["x_prefill"] = ratio(&Run::prefill_ms);
  state.counters["layer_rows"] = of(with, &Run::layer_rows);
  state.counters["base_layer_rows"] = of(base, &Run::layer_rows);
  state.counters["ffn_crit_ms"] = of(with, &Run::crit_ms);
  state.counters["x_ffn_crit"] = ratio(&Run::crit_ms);
  state.counters["even_ms"] = of(with, &Run::even_ms);
  state.counters["base_even_ms"] = of(base, &Run::even_ms);
  state.SetLabel(fmt::format("small skew {} AFD 1A2F sync, {} redundant experts per layer vs none", skew, redundant));
}

BENCHMARK(BM_afd_eplb)
    ->Name("engine_afd_eplb")
    ->ArgNames({"redundant", "skew"})
    ->Args({2, 8})
    ->Args({4, 8})
    ->Args({8, 8})
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_TEMPLATE(BM_prefill, 0)
    ->Name("engine_prefill")
    ->ArgNames({"prompt"})
    ->Arg(32)
    ->Arg(256)
    ->Arg(512)
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_prefill, 1)
    ->Name("engine_prefill_qwen35")
    ->ArgNames({"prompt"})
    ->Arg(32)
    ->Arg(256)
    ->Arg(512)
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_TEMPLATE(BM_prefill, 2)
    ->Name("engine_prefill_dsv4")
    ->ArgNames({"prompt"})
    ->Arg(32)
    ->Arg(256)
    ->Arg(512)
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_TEMPLATE(BM_decode, 0)
    ->Name("engine_decode")
    ->ArgNames({"batch", "prompt", "new", "afd_stages"})
    ->Args({1, 32, 32, 0})
    ->Args({8, 32, 32, 0})
    ->Args({32, 32, 32, 0})
    ->Args({64, 32, 32, 0})
    // AFD rows (as recorded before: 16-token prompts, 8 new tokens), with their monolithic counterparts.
    ->Args({8, 16, 8, 0})
    ->Args({8, 16, 8, 1})
    ->Args({8, 16, 8, 2})
    ->Args({32, 16, 8, 0})
    ->Args({32, 16, 8, 1})
    ->Args({32, 16, 8, 2})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_decode, 1)
    ->Name("engine_decode_qwen35")
    ->ArgNames({"batch", "prompt", "new", "afd_stages"})
    ->Args({1, 32, 32, 0})
    ->Args({8, 32, 32, 0})
    ->Args({32, 32, 32, 0})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_decode, 2)
    ->Name("engine_decode_dsv4")
    ->ArgNames({"batch", "prompt", "new", "afd_stages"})
    ->Args({1, 32, 32, 0})
    ->Args({8, 32, 32, 0})
    ->Args({32, 32, 32, 0})
    // Past a ratio-128 window and the indexer's top-64 of ratio-4 windows.
    ->Args({1, 512, 32, 0})
    ->Args({8, 512, 32, 0})
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace genbridge::bench
