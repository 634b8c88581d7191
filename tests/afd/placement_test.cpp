// Redundant experts: the plan from a measured load (hand-computed cases), the load file's form and its errors,
// and the config rules the copies obey.
#include "afd/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <vector>

#include "afd/engine_job.h"
#include "afd/rank_job.h"
#include "runtime/engine/sampler.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

// 2 FFN ranks, 8 experts (0..3 on rank 0, 4..7 on rank 1), MoE layers 0 and 2 (layer 1 dense).
AfdConfig config(int redundant) {
  AfdConfig c;
  c.num_ffn = 2;
  c.num_experts = 8;
  c.top_k = 2;
  c.hidden_size = 4;
  c.num_layers = 3;
  c.dense_layers = {1};
  c.redundant_experts = redundant;
  return c;
}

ExpertLoad load(std::vector<int64_t> layer0, std::vector<int64_t> layer2) {
  return ExpertLoad{.source = "test.json", .num_experts = 8, .layers = {0, 2}, .rows = {layer0, layer2}};
}

TEST(Placement, copies_go_to_the_heaviest_experts_on_the_least_loaded_rank_that_does_not_hold_them) {
  // Layer 0: experts 5 and 6 (rank 1) carry most rows. Rank 0 has 4 rows, rank 1 92.
  //   1. expert 5 (50 per copy) -> rank 0, the only rank without it; its copies now take 25 each.
  //   2. expert 6 (40) -> rank 0, which is then full (N / F = 2 slots).
  //   3. 5 and 6 are on both ranks; the heaviest left is a 1-row expert: 0 (lowest id), to rank 1 (free, lacks it).
  //   4. expert 1 -> rank 1.
  // Layer 2: every expert has 10 rows but expert 0 has 100 (rank 0).
  //   1. expert 0 -> rank 1.  2. expert 0 is on both ranks now; 1..7 tie at 10: expert 1 -> rank 1, which is then
  //   full.  3. rank 0 lacks only 4..7: expert 4 -> rank 0.  4. expert 5 -> rank 0.
  AfdConfig c = config(4);
  const ExpertLoad l = load({1, 1, 1, 1, 1, 50, 40, 1}, {100, 10, 10, 10, 10, 10, 10, 10});
  Result<std::vector<ExpertReplica>> r = plan_replicas(c, l);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, (std::vector<ExpertReplica>{
                    {0, 5, 0}, {0, 6, 0}, {0, 0, 1}, {0, 1, 1}, {2, 0, 1}, {2, 1, 1}, {2, 4, 0}, {2, 5, 0}}));
  c.replicas = *r;
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
  // Layer 0's rows per rank with each expert split evenly: rank 0 4 + 25 + 20 - 1/2 - 1/2 = 48, rank 1 the rest.
  EXPECT_EQ(planned_rank_rows(c, l, 0), (std::vector<double>{48.0, 48.0}));
  // No copies: each rank holds its own.
  EXPECT_TRUE(plan_replicas(config(0), l)->empty());
}

TEST(Placement, the_plan_is_refused_for_a_load_of_another_model) {
  ExpertLoad l = load({1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1});
  l.layers = {0, 1};
  EXPECT_EQ(plan_replicas(config(2), l).status().message(),
            "expert load test.json covers MoE layers [0, 1] but the model's are [0, 2]");
  l = ExpertLoad{.source = "x", .num_experts = 4, .layers = {0, 2}, .rows = {{1, 1, 1, 1}, {1, 1, 1, 1}}};
  EXPECT_EQ(plan_replicas(config(2), l).status().message(), "expert load x counts 4 experts but the model has 8");
  EXPECT_EQ(plan_replicas(config(3), load({1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1})).status().message(),
            "--afd-redundant-experts 3: must be a multiple of the 2 FFN ranks in 0..8 (each rank holds the same "
            "number of copies, at most one copy of an expert per rank)");
}

// The most copies a rank can take (E x (F - 1): every expert on every rank) is a valid plan.
TEST(Placement, every_expert_on_every_rank) {
  AfdConfig c = config(8);
  Result<std::vector<ExpertReplica>> r = plan_replicas(c, load({8, 7, 6, 5, 4, 3, 2, 1}, {1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  c.replicas = *r;
  ASSERT_TRUE(validate(c).ok()) << validate(c).to_string();
  const Topology t = make_topology(c, std::vector<int>(3, kRoleUndeclared)).value();
  for (int e = 0; e < 8; ++e) {
    EXPECT_TRUE(t.holds(0, e, 0) && t.holds(0, e, 1) && t.holds(2, e, 0) && t.holds(2, e, 1)) << e;
  }
}

TEST(Placement, the_load_file_round_trips_and_bad_files_are_named) {
  testing::TempDir dir;
  const ExpertLoad l = load({1, 2, 3, 4, 5, 6, 7, 8}, {0, 0, 0, 0, 0, 0, 0, 9});
  ASSERT_TRUE(write_expert_load(dir / "load.json", l).ok());
  Result<ExpertLoad> back = read_expert_load(dir / "load.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->layers, l.layers);
  EXPECT_EQ(back->rows, l.rows);
  EXPECT_EQ(back->num_experts, 8);
  EXPECT_EQ(back->source, (dir / "load.json").string());
  const auto error = [](std::string_view text) { return parse_expert_load(text, "f.json").status().message(); };
  EXPECT_EQ(error("[1]"), "expert load f.json: not a JSON object");
  EXPECT_EQ(error(R"({"format": "x"})"),
            "expert load f.json: 'format' must be \"genbridge-expert-load\" (written by genbridge run "
            "--afd-expert-load-out)");
  const std::string head = R"({"format": "genbridge-expert-load", "version": 1, "num_experts": 2, "layers": )";
  EXPECT_EQ(error(R"({"format": "genbridge-expert-load", "version": 2})"),
            "expert load f.json: 'version' must be 1, got 2");
  EXPECT_EQ(error(head + "[]}"), "expert load f.json: 'layers' must be a non-empty array");
  EXPECT_EQ(error(head + R"([{"layer": 0, "rows": [1]}]})"),
            "expert load f.json: layer 0 has 1 row counts but 'num_experts' is 2");
  EXPECT_EQ(error(head + R"([{"layer": 0, "rows": [1, -1]}]})"),
            "expert load f.json: layer 0: row counts must be integers >= 0, got -1");
  EXPECT_EQ(error(head + R"([{"layer": 2, "rows": [1, 1]}, {"layer": 2, "rows": [1, 1]}]})"),
            "expert load f.json: layer 2 is negative or not above the previous entry's; layers must ascend");
  const std::string missing = read_expert_load(dir / "missing.json").status().message();
  EXPECT_EQ(missing, "expert load: " + (dir / "missing.json").string() + ": cannot open: No such file or directory");
}

TEST(Placement, config_rules_for_copies) {
  const auto error = [](AfdConfig c) { return validate(c).message(); };
  AfdConfig c = config(2);
  EXPECT_EQ(error(c), "afd config: 'replicas' lists 0 copies but 'redundant_experts' 2 x 2 MoE layers needs 4");
  c.replicas = {{0, 5, 0}, {0, 6, 1}, {2, 0, 1}, {2, 4, 0}};
  EXPECT_EQ(error(c), "afd config: 'replicas' is [0, 6, 1] but copies expert 6 onto its home FFN rank 1");
  c.replicas[1] = {0, 5, 0};
  EXPECT_EQ(error(c), "afd config: 'replicas' is [0, 5, 0] but is listed twice");
  c.replicas[1] = {1, 4, 0};
  EXPECT_EQ(error(c), "afd config: 'replicas' is [1, 4, 0] but must name a MoE layer (dense layers have no experts)");
  c.replicas[1] = {0, 4, 0};
  EXPECT_EQ(error(c),
            "afd config: 'replicas' is [0, 4, 0] but gives FFN rank 0 more than 'redundant_experts' / 'ffn_ranks' = 1 "
            "copies in layer 0");
  c.replicas[1] = {0, 1, 1};
  EXPECT_TRUE(validate(c).ok()) << error(c);
  c.redundant_experts = 3;
  EXPECT_EQ(error(c),
            "afd config: 'redundant_experts' is 3 but must be a multiple of 'ffn_ranks' (2) in 0..8 (every FFN rank "
            "holds the same number of copies, at most one copy of an expert per rank)");
  // The JSON form and the settings every rank compares.
  Result<AfdConfig> p = parse_afd_config(
      R"({"ffn_ranks": 2, "num_experts": 8, "top_k": 2, "hidden_size": 4, "num_layers": 3, "dense_layers": [1],
          "redundant_experts": 2, "replicas": [[0, 5, 0], [0, 1, 1], [2, 0, 1], [2, 4, 0]]})");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_NE(canonical_settings(*p).find("redundant_experts=2\nreplicas=[[0,5,0],[0,1,1],[2,0,1],[2,4,0]]\n"),
            std::string::npos)
      << canonical_settings(*p);
  EXPECT_EQ(parse_afd_config(R"({"replicas": [[0, 1]]})").status().message(),
            "afd config: each entry of 'replicas' must be [layer, expert, ffn_rank], got [0,1]");
}

// fill_model_shape plans the copies from the load, and refuses redundant experts without one.
TEST(Placement, a_job_plans_its_copies_from_the_load) {
  model::ModelConfig m;
  m.num_experts = 8;
  m.num_experts_per_tok = 2;
  m.hidden_size = 4;
  m.num_hidden_layers = 3;
  m.mlp_only_layers = {1};
  AfdConfig c;
  c.num_ffn = 2;
  c.redundant_experts = 2;
  EXPECT_EQ(fill_model_shape(m, 8, c).status().message(),
            "afd: 2 redundant experts need a measured expert load to place them (--afd-expert-load FILE, written by "
            "genbridge run --afd ... --afd-expert-load-out FILE)");
  const ExpertLoad l = load({1, 1, 1, 1, 1, 50, 40, 1}, {100, 10, 10, 10, 10, 10, 10, 10});
  Result<ValidAfdConfig> v = fill_model_shape(m, 8, c, &l);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ((*v)->replicas, (std::vector<ExpertReplica>{{0, 5, 0}, {0, 0, 1}, {2, 0, 1}, {2, 4, 0}}));
}

// make-model --router-skew: column 0 of the embedding is the constant feature 4 and column 0 of each router row
// the expert's bias over it; everything else is the unskewed checkpoint's; skew 0 writes the same bytes as none.
// The routing it gives is skewed: per layer, the busiest expert takes several times the mean rows.
TEST(Placement, router_skew_makes_a_few_experts_take_most_rows) {
  testing::TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 5, dir / "plain").ok());
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 5, dir / "zero", 1, 0.0).ok());
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 5, dir / "skew", 1, 6.0).ok());
  EXPECT_EQ(model::write_synthetic_checkpoint("tiny", 5, dir / "bad", 1, -1.0).message(),
            "write_synthetic_checkpoint: router skew -1 must be in 0..100");
  const auto bytes = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(dir / "plain" / "model.safetensors"), bytes(dir / "zero" / "model.safetensors"));
  const model::Checkpoint plain = model::Checkpoint::open(dir / "plain").value();
  const model::Checkpoint skew = model::Checkpoint::open(dir / "skew").value();
  const model::ModelConfig& c = skew.config();
  const auto at = [](const TensorView& v, int64_t r, int64_t col) {
    return bf16_to_float(v.data_as<const bf16_t>()[r * v.stride(0) + col]);
  };
  const TensorView& e0 = plain.weights().embed_tokens;
  const TensorView& e1 = skew.weights().embed_tokens;
  for (int64_t r = 0; r < c.vocab_size; r += 37) {
    EXPECT_EQ(at(e1, r, 0), 4.0f);
    EXPECT_EQ(at(e1, r, 1), at(e0, r, 1));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    std::vector<float> bias;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      bias.push_back(at(skew.weights().layers[l].moe.router, e, 0) * 4.0f);
      EXPECT_EQ(at(skew.weights().layers[l].moe.router, e, 5), at(plain.weights().layers[l].moe.router, e, 5));
    }
    std::sort(bias.begin(), bias.end(), std::greater<>());
    EXPECT_NEAR(bias[0], 6.0, 0.05) << "layer " << l;  // 6 / (0 + 1), through bf16
    EXPECT_NEAR(bias[1], 3.0, 0.05) << "layer " << l;
    EXPECT_NEAR(bias.back(), 6.0 / c.num_experts, 0.01) << "layer " << l;
  }
  // The routing: 8 prompts through AFD 1A1F; the report's per-layer rows.
  const runtime::DeviceOperator dev = runtime::DeviceOperator::create({}).value();
  const auto busiest_over_mean = [&](const model::Checkpoint& ck) {
    std::vector<engine::Request> reqs;
    for (int r = 0; r < 8; ++r) {
      engine::Request q;
      q.id = r;
      for (int i = 0; i < 16; ++i) q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(7 + r, i) * 500));
      q.max_new_tokens = 4;
      reqs.push_back(q);
    }
    EngineJobOptions o;
    o.warmup_steps = 0;
    auto job = run_inproc_engine_job(ck, dev, reqs, 16, o);
    EXPECT_TRUE(job.ok()) << job.status().to_string();
    double sum = 0;
    int layers = 0;
    for (const std::vector<int64_t>& rows : job->report.layer_expert_rows) {
      const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      if (total == 0) continue;
      sum += static_cast<double>(*std::max_element(rows.begin(), rows.end())) * rows.size() / total;
      ++layers;
    }
    return sum / layers;
  };
  const double p = busiest_over_mean(plain), k = busiest_over_mean(skew);
  EXPECT_LT(p, 2.5);
  EXPECT_GT(k, 3.0);  // of 8 experts with top-2 the most is 4
}

}  // namespace
}  // namespace genbridge::afd
