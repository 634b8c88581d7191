// Observability: histogram percentiles, the serialized form, the job summary and the trace writer.

#include "afd/metrics.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "afd/job.h"
#include "afd/runner.h"
#include "afd/support/toy_model.h"

namespace genbridge::afd {
namespace {

TEST(LatencyHistogram, percentiles_within_bucket_resolution) {
  LatencyHistogram h;
  EXPECT_EQ(h.percentile_ns(50), 0.0);
  for (int i = 1; i <= 1000; ++i) h.record(int64_t{i} * 1000);  // 1..1000 us
  EXPECT_EQ(h.count(), 1000);
  EXPECT_NEAR(h.percentile_ns(50), 500e3, 500e3 * 0.0625);
  EXPECT_NEAR(h.percentile_ns(99), 990e3, 990e3 * 0.0625);
  EXPECT_EQ(h.percentile_ns(100), 1000e3);  // clamped to the observed maximum
  EXPECT_EQ(h.percentile_ns(0), 1000.0);    // and minimum
  EXPECT_DOUBLE_EQ(h.mean_ns(), 500.5e3);
  LatencyHistogram g;
  g.record(7);
  g.merge(h);
  EXPECT_EQ(g.count(), 1001);
  EXPECT_EQ(g.percentile_ns(0), 7.0);
}

TEST(Metrics, serialize_round_trip) {
  AfdConfig cfg = testing::toy_config(ConnectorKind::kSync, 1, 1, 2);
  Metrics m(cfg, 3, Role::kFfn, 1, 4);
  m.record_transfer(Direction::kAttnToFfn, 1, 1, 1500, 4096);
  m.record_transfer(Direction::kFfnToAttn, 3, 0, 2500, 8192);
  m.add_busy_ns(100);
  m.record_step(StepPhase::kPrefill, 5, 700);
  m.record_step(StepPhase::kDecode, 2, 300);
  m.mark_window(1000, 3000);
  m.span(SpanKind::kFfn, 1000, 1100, 1, 1, 7, -1);
  m.set_recording(false);
  m.record_transfer(Direction::kAttnToFfn, 1, 1, 99999, 1);  // not recorded: warm-up
  Result<Metrics> r = Metrics::deserialize(m.serialize());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->world_rank(), 3);
  EXPECT_EQ(r->role(), Role::kFfn);
  EXPECT_EQ(r->role_rank(), 1);
  EXPECT_EQ(r->transfer(Direction::kAttnToFfn, 1, 1).bytes, 4096);
  EXPECT_EQ(r->transfer(Direction::kAttnToFfn, 1, 1).messages, 1);
  EXPECT_EQ(r->transfer(Direction::kFfnToAttn, 3, 0).latency.percentile_ns(50), 2500.0);
  EXPECT_EQ(r->busy_ns(), 100);
  EXPECT_EQ(r->prefill_tokens(), 5);
  EXPECT_EQ(r->decode_tokens(), 2);
  EXPECT_EQ(r->prefill_step_latency().sum_ns(), 700);
  EXPECT_EQ(r->decode_step_latency().sum_ns(), 300);
  EXPECT_EQ(r->wall_ns(), 2000);
  ASSERT_EQ(r->events().size(), 1u);
  EXPECT_EQ(r->events()[0].step, 7);
  EXPECT_EQ(Metrics::deserialize("nope").status().code(), StatusCode::kInvalidArgument);
  std::string truncated = m.serialize();
  truncated.pop_back();
  EXPECT_EQ(Metrics::deserialize(truncated).status().code(), StatusCode::kInvalidArgument);
}

TEST(Metrics, summary_counts_every_rank_in_tokens_per_second_and_prefill_apart) {
  AfdConfig cfg = testing::toy_config(ConnectorKind::kSync, 2, 1, 1);
  std::vector<Metrics> ranks;
  for (int a = 0; a < 2; ++a) {
    Metrics m(cfg, a, Role::kAttention, a);
    m.set_recording(false);
    m.record_step(StepPhase::kDecode, 999, 999'000'000);  // warm-up: not measured
    m.set_recording(true);
    m.record_step(StepPhase::kPrefill, 100, 40'000'000);
    m.record_step(StepPhase::kDecode, 150, 10'000'000);
    m.record_step(StepPhase::kDecode, 150, 10'000'000 + a * 2'000'000);
    m.record_step(StepPhase::kDecode, 0, 5'000'000);  // an idle lockstep step: not a decode step
    m.add_idle_ns(250'000'000);
    m.mark_window(1'000'000'000, 2'000'000'000);
    ranks.push_back(std::move(m));
  }
  Metrics f(cfg, 2, Role::kFfn, 0);
  f.add_busy_ns(600'000'000);
  f.mark_window(1'000'000'000, 2'000'000'000);
  f.record_transfer(Direction::kAttnToFfn, 1, 0, 5000, 100);
  ranks.push_back(std::move(f));
  const AfdReport r = summarize(ranks);
  EXPECT_EQ(r.prefill_tokens, 200);
  EXPECT_EQ(r.prefill_steps, 2);
  EXPECT_EQ(r.decode_tokens, 600);
  EXPECT_EQ(r.decode_steps, 4);
  EXPECT_DOUBLE_EQ(r.wall_s, 1.0);
  EXPECT_DOUBLE_EQ(r.decode_s, 0.022);                          // the longest attention rank's decode steps
  EXPECT_NEAR(r.tokens_per_s_per_rank, 600 / 0.022 / 3, 1e-6);  // every rank in the denominator
  EXPECT_DOUBLE_EQ(r.ffn_busy_fraction, 0.6);
  EXPECT_DOUBLE_EQ(r.attention_idle_fraction, 0.25);
  EXPECT_NEAR(r.tpot_mean_ms, 10.5, 1e-9);  // decode steps only: the 40 ms prefill steps do not count
  EXPECT_NEAR(r.prefill_step_mean_ms, 40.0, 1e-9);
  ASSERT_EQ(r.links.size(), 1u);
  EXPECT_EQ(r.links[0].bytes, 100);
  const nlohmann::json j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["prefill_tokens"], 200);
  EXPECT_EQ(j["decode_tokens"], 600);
  EXPECT_EQ(j["decode_steps"], 4);
  EXPECT_EQ(j["links"][0]["direction"], "attention_to_ffn");
  EXPECT_EQ(r.warmup_steps, 2);
  EXPECT_EQ(r.warmup_decode_tokens, 2 * 999);
  EXPECT_EQ(r.warmup_prefill_tokens, 0);
  EXPECT_NE(report_text(r).find("200 prefill + 2598 decode tokens, of which 0 + 1998 in 2 warm-up steps"),
            std::string::npos)
      << report_text(r);
  EXPECT_NE(report_text(r).find("200 prefill tokens in 2 steps (mean 40.000 ms), 600 decode tokens in 4 steps"),
            std::string::npos)
      << report_text(r);
  EXPECT_NE(report_text(r).find("9090.9 tokens/s per rank (all ranks counted"), std::string::npos) << report_text(r);
}

// The expert load: rows per expert and per FFN rank over the measured steps, their max / mean ratios (the mean
// over every expert of the model, idle ones included), through serialize() as gather() moves them.
TEST(Metrics, expert_load_per_ffn_rank_and_per_expert) {
  AfdConfig cfg = testing::toy_config(ConnectorKind::kSync, 1, 2, 1);
  cfg.num_experts = 8;
  std::vector<Metrics> ranks;
  ranks.emplace_back(cfg, 0, Role::kAttention, 0);
  Metrics f0(cfg, 1, Role::kFfn, 0), f1(cfg, 2, Role::kFfn, 1);
  f0.set_recording(false);
  f0.add_expert_rows(0, 0, 1000);  // warm-up: not counted
  f0.set_recording(true);
  f0.add_expert_rows(0, 0, 25);
  f0.add_expert_rows(cfg.num_layers - 1, 0, 5);
  f0.add_expert_rows(0, 3, 10);
  f1.add_expert_rows(0, 5, 20);
  f1.add_expert_rows(cfg.num_layers, 5, 7);  // outside the model: ignored
  f1.add_expert_rows(0, 8, 7);
  f0.add_layer_busy_ns(0, 3'000'000);
  f0.add_layer_busy_ns(1, 1'000'000);
  f1.add_layer_busy_ns(0, 1'000'000);
  f1.add_layer_busy_ns(1, 2'000'000);
  EXPECT_EQ(f0.expert_rows(), (std::vector<int64_t>{30, 0, 0, 10, 0, 0, 0, 0}));
  for (const Metrics* f : {&f0, &f1}) ranks.push_back(Metrics::deserialize(f->serialize()).value());
  const AfdReport r = summarize(ranks);
  EXPECT_EQ(r.ffn_rows, (std::vector<int64_t>{40, 20}));
  EXPECT_EQ(r.expert_rows, (std::vector<int64_t>{30, 0, 0, 10, 0, 20, 0, 0}));
  ASSERT_EQ(r.layer_expert_rows.size(), static_cast<size_t>(cfg.num_layers));
  EXPECT_EQ(r.layer_expert_rows[0], (std::vector<int64_t>{25, 0, 0, 10, 0, 20, 0, 0}));
  EXPECT_EQ(r.layer_expert_rows.back()[0], 5);
  // Per layer over the FFN ranks: layer 0 [35, 20] (max / mean 35 / 27.5), the last layer [5, 0] (2): mean of the two.
  EXPECT_DOUBLE_EQ(r.worst_layer_ffn_max_over_mean, 2.0);
  EXPECT_DOUBLE_EQ(r.layer_ffn_max_over_mean, (35.0 / 27.5 + 2.0) / 2);
  // Time: layer 0 waits 3 ms for f0 (mean 2), layer 1 2 ms for f1 (mean 1.5).
  EXPECT_DOUBLE_EQ(r.ffn_critical_ms, 5.0);
  EXPECT_DOUBLE_EQ(r.ffn_even_ms, 3.5);
  EXPECT_DOUBLE_EQ(r.ffn_load_max_over_mean, 40.0 / 30.0);
  EXPECT_DOUBLE_EQ(r.expert_load_max_over_mean, 30.0 / (60.0 / 8.0));
  const nlohmann::json j = nlohmann::json::parse(report_json(r));
  EXPECT_EQ(j["ffn_rows"], nlohmann::json::parse("[40, 20]"));
  EXPECT_EQ(j["expert_rows"][5], 20);
  EXPECT_NE(report_text(r).find("expert load: rows per FFN rank [40, 20] (max / mean 1.333); the busiest expert, 0, "
                                "30 rows (max / mean over 8 experts 4.000); per MoE layer, busiest FFN rank / mean "
                                "1.636 on average, 2.000 at worst\nexpert compute on the critical path (each MoE "
                                "layer's busiest FFN rank, summed): 5.0 ms, 3.5 ms if every rank took the mean"),
            std::string::npos)
      << report_text(r);
}

// A whole in-process job with the report and the trace on.
TEST(Metrics, job_report_and_chrome_trace) {
  const AfdConfig cfg = testing::toy_config(ConnectorKind::kAsync, 2, 2, 2);
  const testing::ToyModel model(cfg);
  const testing::Workload w;
  RankFns fns;
  fns.attention = [&](Connector& c, Metrics& m) -> Status {
    testing::ToyAttention att(model, w, cfg, c.rank());
    AttentionRunner runner(c, &m);
    return att.run(runner, w.steps());
  };
  fns.ffn = [&](Connector& c, Metrics& m) -> Status {
    return FfnRunner(c, testing::toy_expert_compute(model), &m).run();
  };
  AfdReport report;
  JobOptions o;
  o.report = &report;
  o.trace_events = 10000;
  o.trace_path = ::testing::TempDir() + "afd_trace_test.json";
  ASSERT_TRUE(run_inproc_job(cfg, fns, o).ok());
  EXPECT_EQ(report.num_ranks, 4);
  EXPECT_EQ(report.decode_tokens, 17);
  EXPECT_GT(report.tokens_per_s_per_rank, 0.0);
  EXPECT_GT(report.ffn_busy_fraction, 0.0);
  EXPECT_LE(report.ffn_busy_fraction, 1.0);
  EXPECT_GE(report.attention_idle_fraction, 0.0);
  EXPECT_LE(report.attention_idle_fraction, 1.0);
  // 3 MoE layers x 2 stages x 2 directions; each direction carries one message per (attention, FFN) pair.
  ASSERT_EQ(report.links.size(), 12u);
  for (const AfdReport::Link& l : report.links) {
    EXPECT_EQ(l.messages, 2 * 2 * w.steps()) << l.layer << " " << l.stage;
    EXPECT_GT(l.bytes, 0);
    EXPECT_GT(l.p50_us, 0.0);
    EXPECT_GE(l.p99_us, l.p50_us);
  }
  std::ifstream in(o.trace_path);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json t = nlohmann::json::parse(ss.str());
  int spans[4] = {}, processes = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") ++processes;
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    ++spans[e["tid"].get<int>()];
  }
  EXPECT_EQ(processes, 4);
  EXPECT_GT(spans[static_cast<int>(SpanKind::kAttention)], 0);
  EXPECT_GT(spans[static_cast<int>(SpanKind::kFfn)], 0);
  EXPECT_GT(spans[static_cast<int>(SpanKind::kTransfer)], 0);
  EXPECT_GT(spans[static_cast<int>(SpanKind::kWait)], 0);
  std::remove(o.trace_path.c_str());
}

}  // namespace
}  // namespace genbridge::afd
