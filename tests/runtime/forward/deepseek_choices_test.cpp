// What the forward pass reports it chose (ForwardBatch::set_choice_sink, EngineOptions::record_choices, the
// CLI's --dump-choices) against independent fp64 computations, on the DeepSeek-V3.2 preset (tiny-dsa: layer 0
// dense, layers 1-2 MoE, every layer DSA with index_topk 64) and V3 (tiny-dsv3, no indexer):
//   - the routed experts and weights of every MoE layer against the fp64 reference's grouped_topk_route evaluated
//     in fp64 on the very hidden states the router saw (moe_input of that layer, captured between phases);
//   - the indexer's top-k positions against the fp64 reference forward (tests/support): exactly at layer 0
//     where the reference's score gap at the cut is clear (layer 0 sees the embeddings, the same hidden
//     states up to bf16 rounding), by overlap at every layer;
//   - the engine's records (prefill, then decode steps) equal the runner's, and the in-process AFD engine
//     records exactly what the monolithic one does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "afd/engine_job.h"
#include "ops/common/moe/moe_ref.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/forward/runner.h"
#include "support/deepseek_reference_forward.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

const Checkpoint& checkpoint(const std::string& preset) {
  static genbridge::testing::TempDir dir;
  static std::map<std::string, std::unique_ptr<Checkpoint>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    EXPECT_TRUE(write_synthetic_checkpoint(preset, 11, dir / preset).ok());
    slot = std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / preset)).value());
  }
  return *slot;
}

std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint64_t salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((i * 2654435761u + 12345u + salt * 7919u) % static_cast<uint64_t>(vocab));
  return t;
}

// One recorded (position, layer), copied out of the sink's spans.
struct Rec {
  int64_t seq = 0, position = 0, layer = 0;
  std::vector<int32_t> experts;
  std::vector<float> weights;
  std::vector<int32_t> index;
  bool operator==(const Rec&) const = default;
};

double bf16_value(const TensorView& t, int64_t row, int64_t col) {
  return bf16_to_float(t.data_as<const bf16_t>()[row * t.stride(0) + col * t.stride(1)]);
}

// Runs `seq` as one prefill through the runner's phases, recording the choices and every MoE layer's
// moe_input (the router's input), then checks each MoE record against the fp64 router on that input.
// Returns the records.
std::vector<Rec> check_router_on_the_same_hidden_states(const std::string& preset, const std::vector<int32_t>& seq) {
  const Checkpoint& ck = checkpoint(preset);
  const ModelConfig& c = ck.config();
  const int64_t n = static_cast<int64_t>(seq.size()), H = c.hidden_size, E = c.num_experts, k = c.num_experts_per_tok;
  auto dev = runtime::DeviceOperator::create({});
  EXPECT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(kv_model_shape(c)), 4);
  EXPECT_TRUE(pool.ok());
  auto runner = ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  ForwardBatch batch = (*runner)->make_batch(n, 1);
  std::vector<Rec> recs;
  const ChoiceSink sink = [&](const TokenChoices& t) {
    recs.push_back({t.seq_index,
                    t.position,
                    t.layer,
                    {t.expert_ids.begin(), t.expert_ids.end()},
                    {t.expert_weights.begin(), t.expert_weights.end()},
                    {t.index_positions.begin(), t.index_positions.end()}});
  };
  batch.set_choice_sink(&sink);
  EXPECT_TRUE(pool->admit(1, n, n).ok());
  const std::vector<runtime::SeqId> ids = {1};
  const std::vector<int32_t> q_lens = {static_cast<int32_t>(n)};
  EXPECT_TRUE((*runner)->begin(batch, {seq, ids, q_lens}).ok());
  std::map<int64_t, std::vector<double>> moe_in;  // layer -> [n, H]
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_TRUE((*runner)->attention_block(batch, l).ok());
    if (!c.is_moe_layer(l)) continue;
    EXPECT_TRUE((*runner)->route(batch, l).ok());
    std::vector<double>& x = moe_in[l];
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) x.push_back(bf16_value(batch.moe_input(), t, h));
    EXPECT_TRUE((*runner)->local_experts(batch, l, 0, E).ok());
    EXPECT_TRUE((*runner)->finish_moe(batch, l).ok());
  }
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  EXPECT_TRUE((*runner)->logits(batch, logits).ok());
  // The fp64 router: logits = router . x exactly, then moe/grouped_topk_router's contract.
  int64_t checked = 0;
  double worst_weight = 0;
  for (const Rec& r : recs) {
    EXPECT_EQ(r.seq, 0);
    if (!c.is_moe_layer(r.layer)) {
      EXPECT_TRUE(r.experts.empty()) << "dense layer " << r.layer;
      continue;
    }
    if (static_cast<int64_t>(r.experts.size()) != k || r.weights.size() != r.experts.size()) {
      ADD_FAILURE() << "layer " << r.layer << " position " << r.position << ": " << r.experts.size() << " experts";
      continue;
    }
    const LayerWeights& lw = ck.weights().layers[r.layer];
    std::vector<double> lg(static_cast<size_t>(E)), bias(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double dot = 0;
      for (int64_t h = 0; h < H; ++h) dot += bf16_value(lw.moe.router, e, h) * moe_in[r.layer][r.position * H + h];
      lg[e] = dot;
      const TensorView& b = lw.moe.e_score_correction_bias;
      bias[e] = b.dtype() == DType::kF32 ? b.data_as<const float>()[e] : bf16_to_float(b.data_as<const bf16_t>()[e]);
    }
    std::vector<int64_t> want_ids;
    std::vector<double> want_w;
    double margin = 0;
    const DeepseekConfig& d = c.deepseek;
    ref::grouped_topk_route(lg.data(), bias.data(), E, d.n_group, d.topk_group, k, c.norm_topk_prob,
                            d.routed_scaling_factor, want_ids, want_w, &margin);
    if (margin < 1e-4) continue;  // an fp32 evaluation may legitimately decide a near-tie the other way
    ++checked;
    std::map<int64_t, double> want;
    for (int64_t j = 0; j < k; ++j) want[want_ids[j]] = want_w[j];
    for (int64_t j = 0; j < k; ++j) {
      if (!want.contains(r.experts[j])) {
        ADD_FAILURE() << "layer " << r.layer << " position " << r.position << ": expert " << r.experts[j]
                      << " is not among the fp64 router's choice";
        continue;
      }
      const double err = std::abs(r.weights[j] - want[r.experts[j]]) / std::abs(want[r.experts[j]]);
      worst_weight = std::max(worst_weight, err);
      EXPECT_LE(err, 1e-4) << "layer " << r.layer << " position " << r.position << " expert " << r.experts[j];
    }
  }
  std::printf("%s: %lld MoE records checked against the fp64 router, worst relative weight error %.2e\n",
              preset.c_str(), static_cast<long long>(checked), worst_weight);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l);
  EXPECT_GE(2 * checked, n * moe_layers) << "too few records without a near-tie";
  return recs;
}

TEST(DeepseekChoices, dsa_routed_experts_match_the_fp64_router_on_the_same_hidden_states) {
  const auto recs = check_router_on_the_same_hidden_states("tiny-dsa", tokens(100, 512));
  // Every position has one record per layer (every tiny-dsa layer has the indexer), in token then layer order.
  ASSERT_EQ(recs.size(), 300u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].position, static_cast<int64_t>(i / 3));
    EXPECT_EQ(recs[i].layer, static_cast<int64_t>(i % 3));
  }
}

TEST(DeepseekChoices, v3_routed_experts_match_the_fp64_router_on_the_same_hidden_states) {
  const auto recs = check_router_on_the_same_hidden_states("tiny-dsv3", tokens(40, 512));
  // No indexer: records only for the MoE layers (1 and 2), without index positions.
  ASSERT_EQ(recs.size(), 80u);
  for (const Rec& r : recs) {
    EXPECT_NE(r.layer, 0);
    EXPECT_TRUE(r.index.empty());
  }
}

// The indexer's dumped top-k against the fp64 reference forward: exactly at layer 0 where the reference's
// relative score gap at the cut exceeds 3% (the synthetic indexer's scores are not peaked, see
// deepseek_runner_test.cpp), by mean overlap at every layer; sizes min(index_topk, position + 1), causal.
TEST(DeepseekChoices, dsa_index_topk_positions_match_the_fp64_reference) {
  const Checkpoint& ck = checkpoint("tiny-dsa");
  const ModelConfig& c = ck.config();
  const std::vector<int32_t> seq = tokens(160, c.vocab_size);
  const std::vector<Rec> recs = check_router_on_the_same_hidden_states("tiny-dsa", seq);
  LoadOptions native;
  native.precision = WeightPrecision::kNative;
  const Checkpoint exact = Checkpoint::open(ck.dir(), native).value();
  const genbridge::testing::DeepseekReference ref =
      genbridge::testing::deepseek_reference_forward(exact.config(), exact.weights(), seq);
  int64_t clear = 0, past_topk = 0;
  double overlap = 0;
  for (const Rec& r : recs) {
    std::vector<int64_t> mine(r.index.begin(), r.index.end());
    const std::vector<int64_t>& want = ref.index_selected[r.layer][r.position];
    ASSERT_EQ(mine.size(), want.size()) << "layer " << r.layer << " position " << r.position;
    EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
    EXPECT_LE(mine.back(), r.position) << "not causal";
    const double rel_margin = ref.index_margin[r.layer][r.position] / ref.index_score_scale[r.layer][r.position];
    if (r.layer == 0 && rel_margin > 3e-2) {
      ++clear;
      past_topk += r.position >= c.deepseek.index_topk;
      EXPECT_EQ(mine, want) << "layer 0 position " << r.position << " (relative margin " << rel_margin << ")";
    }
    std::vector<int64_t> both;
    std::set_intersection(mine.begin(), mine.end(), want.begin(), want.end(), std::back_inserter(both));
    overlap += static_cast<double>(both.size()) / static_cast<double>(want.size());
  }
  std::printf("tiny-dsa: %lld clear layer-0 selections equal (%lld past index_topk), mean overlap %.4f\n",
              static_cast<long long>(clear), static_cast<long long>(past_topk),
              overlap / static_cast<double>(recs.size()));
  EXPECT_GE(past_topk, 5) << "too few clear layer-0 decisions past index_topk";
  EXPECT_GE(overlap / static_cast<double>(recs.size()), 0.97);
}

// The engine's records: a request's prefill (step 0) records every prompt position, each decode step its one
// new position; monolithic and in-process AFD (both connectors, two attention ranks) record the same bits.
TEST(DeepseekChoices, engine_records_every_step_and_afd_records_the_same) {
  const Checkpoint& ck = checkpoint("tiny-dsa");
  const ModelConfig& c = ck.config();
  auto make_requests = [&] {
    std::vector<engine::Request> reqs;
    for (int64_t i = 0; i < 3; ++i) {
      engine::Request r;
      r.id = i;
      r.prompt = tokens(60 + 5 * i, c.vocab_size, i);
      r.max_new_tokens = 8;
      reqs.push_back(std::move(r));
    }
    return reqs;
  };
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(kv_model_shape(c)), 16);
  ASSERT_TRUE(pool.ok());
  auto runner = ModelRunner::create(ck, *dev, *pool);
  ASSERT_TRUE(runner.ok());
  engine::LocalExecutor executor(**runner);
  std::vector<engine::RequestResult> mono;
  {
    engine::Engine eng(executor, *pool, {.max_batch = 4, .record_choices = true});
    for (auto& r : make_requests()) ASSERT_TRUE(eng.submit(std::move(r)).ok());
    ASSERT_TRUE(eng.run_to_completion().ok());
    mono = eng.results();
  }
  const auto reqs = make_requests();
  for (size_t i = 0; i < mono.size(); ++i) {
    const engine::RequestChoices& ch = mono[i].choices;
    const int64_t P = static_cast<int64_t>(reqs[i].prompt.size()), L = c.num_hidden_layers;
    ASSERT_EQ(mono[i].tokens.size(), 8u);
    // Prefill: P positions; steps 1..7: one position each (the 8th token is never fed back).
    ASSERT_EQ(static_cast<int64_t>(ch.records.size()), (P + 7) * L) << "request " << i;
    size_t e = 0, x = 0;
    for (size_t j = 0; j < ch.records.size(); ++j) {
      const engine::ChoiceRecord& r = ch.records[j];
      const int64_t pos = static_cast<int64_t>(j) / L;
      EXPECT_EQ(r.position, pos);
      EXPECT_EQ(r.step, pos < P ? 0 : pos - P + 1);
      EXPECT_EQ(r.layer, static_cast<int64_t>(j) % L);
      EXPECT_EQ(r.num_experts, c.is_moe_layer(r.layer) ? c.num_experts_per_tok : 0);
      EXPECT_EQ(r.num_index, std::min<int64_t>(c.deepseek.index_topk, pos + 1));
      for (int32_t q = 0; q < r.num_index; ++q) EXPECT_LE(ch.index_positions[x + q], pos);
      e += r.num_experts;
      x += r.num_index;
    }
    EXPECT_EQ(e, ch.expert_ids.size());
    EXPECT_EQ(x, ch.index_positions.size());
  }
  // Request 0's prefill records (batched with the other prompts) equal a single-sequence prefill's: the
  // kernels are batch-invariant and the records are per sequence.
  {
    const std::vector<Rec> alone = check_router_on_the_same_hidden_states("tiny-dsa", reqs[0].prompt);
    const engine::RequestChoices& ch = mono[0].choices;
    size_t e = 0, x = 0;
    for (size_t j = 0; j < alone.size(); ++j) {
      const engine::ChoiceRecord& r = ch.records[j];
      EXPECT_EQ(r.position, alone[j].position);
      EXPECT_EQ(r.layer, alone[j].layer);
      EXPECT_EQ(std::vector<int32_t>(ch.expert_ids.begin() + e, ch.expert_ids.begin() + e + r.num_experts),
                alone[j].experts);
      EXPECT_EQ(std::vector<int32_t>(ch.index_positions.begin() + x, ch.index_positions.begin() + x + r.num_index),
                alone[j].index);
      e += r.num_experts;
      x += r.num_index;
    }
  }
  for (afd::ConnectorKind kind : {afd::ConnectorKind::kSync, afd::ConnectorKind::kAsync}) {
    afd::EngineJobOptions o;
    o.afd.num_attention = 2;
    o.afd.num_ffn = 1;
    o.afd.connector = kind;
    o.afd.async_dp = kind == afd::ConnectorKind::kAsync;
    o.afd.timeout_ms = 20000;
    o.engine.record_choices = true;
    auto job = afd::run_inproc_engine_job(ck, *dev, make_requests(), 16, o);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    ASSERT_EQ(job->results.size(), mono.size());
    for (size_t i = 0; i < mono.size(); ++i) {
      const engine::RequestChoices &a = job->results[i].choices, &m = mono[i].choices;
      EXPECT_EQ(job->results[i].tokens, mono[i].tokens) << "request " << i;
      ASSERT_EQ(a.records.size(), m.records.size()) << "request " << i;
      for (size_t j = 0; j < m.records.size(); ++j) {
        EXPECT_EQ(a.records[j].step, m.records[j].step);
        EXPECT_EQ(a.records[j].position, m.records[j].position);
        EXPECT_EQ(a.records[j].layer, m.records[j].layer);
      }
      EXPECT_EQ(a.expert_ids, m.expert_ids) << "request " << i;
      EXPECT_EQ(a.expert_weights, m.expert_weights) << "request " << i;
      EXPECT_EQ(a.index_positions, m.index_positions) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace genbridge::model
