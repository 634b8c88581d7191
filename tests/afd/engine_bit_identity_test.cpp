// The real engine on every AFD topology of the matrix (connector x A:F x stages x MoE dispatch, in-process
// transport) gives the monolithic engine's tokens and logits bit for bit, on a synthetic checkpoint with a dense
// layer and a shared expert. With --moe-dispatch quantized the attention ranks send the generation's quantized
// rows and the monolithic engine quantizes at the same point. (The same matrix over MPI runs the stand-in model
// under mpirun.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <memory>

#include "afd/engine_job.h"
#include "afd/placement.h"
#include "afd/support/engine_job_case.h"
#include "runtime/device/moe_dispatch.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  std::unique_ptr<runtime::DeviceOperator> quantized_dispatch;  // --moe-dispatch quantized
  Fixture() {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir / "m")).value());
    dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
    runtime::DeviceConfig dc;
    dc.moe_dispatch = "quantized";
    quantized_dispatch =
        std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create(dc)).value());
  }
  const runtime::DeviceOperator& device(bool quantized) const { return quantized ? *quantized_dispatch : *dev; }
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<engine::Request> requests(int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < 5; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 4 + 3 * r; ++i)
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(77 + r, i) * vocab));
    q.max_new_tokens = 3 + r % 3;  // ranks finish at different steps
    reqs.push_back(q);
  }
  return reqs;
}

std::vector<engine::RequestResult> run_monolithic(const runtime::DeviceOperator& dev) {
  Fixture& f = fixture();
  const model::ModelConfig& c = f.ckpt->config();
  auto pool =
      runtime::KvPagePool::create(dev.kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 16);
  auto runner = model::ModelRunner::create(*f.ckpt, dev, *pool);
  engine::LocalExecutor ex(**runner);
  engine::Engine eng(ex, *pool, {.record_logits = true});
  for (auto& r : requests(c.vocab_size)) EXPECT_TRUE(eng.submit(r).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  return eng.results();
}

const std::vector<engine::RequestResult>& monolithic(bool quantized_dispatch = false) {
  static const std::vector<engine::RequestResult> bf16 = run_monolithic(fixture().device(false));
  static const std::vector<engine::RequestResult> quantized = run_monolithic(fixture().device(true));
  return quantized_dispatch ? quantized : bf16;
}

struct Case {
  ConnectorKind connector;
  int a, f, s;
  bool quantized_dispatch = false;
};

class EngineAfd : public ::testing::TestWithParam<Case> {};

TEST_P(EngineAfd, tokens_and_logits_equal_the_monolithic_engine) {
  const Case k = GetParam();
  Fixture& f = fixture();
  EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
  auto job =
      run_inproc_engine_job(*f.ckpt, f.device(k.quantized_dispatch), requests(f.ckpt->config().vocab_size), 16, o);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const auto& mono = monolithic(k.quantized_dispatch);
  ASSERT_EQ(job->results.size(), mono.size());
  for (size_t r = 0; r < mono.size(); ++r) {
    EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
    EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r;
  }
  EXPECT_GT(job->report.decode_tokens, 0);
  EXPECT_EQ(job->num_ranks, k.a + k.f);
}

std::vector<Case> matrix() {
  std::vector<Case> out;
  for (bool q : {false, true})
    for (ConnectorKind c : {ConnectorKind::kSync, ConnectorKind::kAsync})
      for (auto [a, f] : {std::pair{1, 1}, {2, 1}, {2, 2}})
        for (int s : {1, 2}) out.push_back({c, a, f, s, q});
  return out;
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineAfd, ::testing::ValuesIn(matrix()), [](const auto& info) {
  const Case& k = info.param;
  return fmt::format("{}_{}A{}F_S{}{}", connector_kind_name(k.connector), k.a, k.f, k.s,
                     k.quantized_dispatch ? "_quantized_dispatch" : "");
});

// Redundant experts: copies planned from the load a first run measured split every hot expert's rows between
// its holders; the tokens and logits stay the monolithic engine's, the copies compute rows (each rank's rows are
// no longer its own experts' alone) and with every expert on both ranks the busiest rank per layer carries less.
TEST(EngineAfd, redundant_experts_keep_every_bit_and_even_out_the_ffn_ranks) {
  Fixture& f = fixture();
  const model::ModelConfig& c = f.ckpt->config();
  for (const Case& k : {Case{ConnectorKind::kSync, 1, 2, 1}, Case{ConnectorKind::kAsync, 2, 2, 2}}) {
    EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
    o.warmup_steps = 0;
    auto first = run_inproc_engine_job(*f.ckpt, *f.dev, requests(c.vocab_size), 16, o);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    o.expert_load = measured_expert_load(first->report, c);
    for (int redundant : {2, static_cast<int>(c.num_experts)}) {
      SCOPED_TRACE(fmt::format("{} {}A{}F S{}, {} redundant experts", connector_kind_name(k.connector), k.a, k.f, k.s,
                               redundant));
      o.afd.redundant_experts = redundant;
      auto job = run_inproc_engine_job(*f.ckpt, *f.dev, requests(c.vocab_size), 16, o);
      ASSERT_TRUE(job.ok()) << job.status().to_string();
      const auto& mono = monolithic();
      ASSERT_EQ(job->results.size(), mono.size());
      for (size_t r = 0; r < mono.size(); ++r) {
        EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
        EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r;
      }
      // The same rows in all (the routing is the same), but not where their experts live.
      EXPECT_EQ(job->report.expert_rows, first->report.expert_rows);
      const int64_t home0 = std::accumulate(job->report.expert_rows.begin(),
                                            job->report.expert_rows.begin() + c.num_experts / 2, int64_t{0});
      EXPECT_NE(job->report.ffn_rows[0], home0);
      // Every expert on both ranks: each one's rows alternate between them.
      if (redundant == c.num_experts) {
        EXPECT_LT(job->report.layer_ffn_max_over_mean, first->report.layer_ffn_max_over_mean);
      }
    }
  }
}

// The quantized dispatch is in force: its logits are not the bf16 dispatch's, and the attention ranks send
// fewer bytes (the generation's rows: H + 4 or H + H/32 bytes per token instead of 2 H), expert outputs the same.
TEST(EngineAfd, quantized_dispatch_sends_the_rows_and_changes_the_experts_input) {
  Fixture& f = fixture();
  EXPECT_NE(monolithic(true)[0].logits, monolithic(false)[0].logits);
  std::map<bool, AfdReport> reports;
  for (bool q : {false, true}) {
    auto job = run_inproc_engine_job(*f.ckpt, f.device(q), requests(f.ckpt->config().vocab_size), 16,
                                     engine_job_case(ConnectorKind::kSync, 1, 1, 1));
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    reports[q] = job->report;
  }
  auto bytes = [](const AfdReport& r, Direction d) {
    int64_t n = 0;
    for (const AfdReport::Link& l : r.links) n += l.direction == d ? l.bytes : 0;
    return n;
  };
  const int64_t H = f.ckpt->config().hidden_size;
  const int64_t row = runtime::dispatch_row_bytes(*f.quantized_dispatch->moe_dispatch(), H);
  EXPECT_LT(row, 2 * H);
  EXPECT_EQ(bytes(reports[true], Direction::kFfnToAttn), bytes(reports[false], Direction::kFfnToAttn));
  const int64_t bf16_sent = bytes(reports[false], Direction::kAttnToFfn),
                q_sent = bytes(reports[true], Direction::kAttnToFfn);
  EXPECT_LT(q_sent, bf16_sent);
  // The same messages: the difference is the rows, (2 H - row) bytes per dispatched token.
  EXPECT_EQ((bf16_sent - q_sent) % (2 * H - row), 0);
}

EngineJobOptions options_for(ConnectorKind kind, int a, int f, int s, int warmup_steps) {
  EngineJobOptions o;
  o.afd.num_attention = a;
  o.afd.num_ffn = f;
  o.afd.num_stages = s;
  o.afd.connector = kind;
  o.afd.async_dp = kind == ConnectorKind::kAsync;
  o.afd.timeout_ms = 20000;
  o.engine.record_logits = true;
  o.warmup_steps = warmup_steps;
  return o;
}

int64_t messages(const AfdReport& r, Direction d) {
  int64_t n = 0;
  for (const AfdReport::Link& l : r.links) n += l.direction == d ? l.messages : 0;
  return n;
}

// The AFD report counts prefill and decode tokens apart, with the engine's numbers (it used to count every
// token of every step as a decode token, and prefill steps in TPOT).
TEST(EngineAfd, report_counts_prefill_and_decode_tokens_as_the_engine_does) {
  Fixture& f = fixture();
  struct StepCase {
    ConnectorKind kind;
    int a, f, s;
    int64_t prefill_steps, decode_steps;  // every request admitted at once: one prefill step per attention rank
  };
  // 5 requests with 3, 4, 5, 3, 4 new tokens: one rank decodes 4 steps; two ranks (requests 0, 2, 4 and
  // 1, 3) 4 + 3 steps (a lockstep rank's empty steps are not decode steps).
  for (const StepCase& k :
       {StepCase{ConnectorKind::kSync, 1, 1, 1, 1, 4}, StepCase{ConnectorKind::kSync, 2, 1, 2, 2, 7},
        StepCase{ConnectorKind::kAsync, 2, 2, 1, 2, 7}}) {
    auto job = run_inproc_engine_job(*f.ckpt, *f.dev, requests(f.ckpt->config().vocab_size), 16,
                                     options_for(k.kind, k.a, k.f, k.s, 0));
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    EXPECT_EQ(job->report.prefill_tokens, job->metrics.prefill_tokens);
    EXPECT_EQ(job->report.decode_tokens, job->metrics.decode_tokens);
    EXPECT_EQ(job->report.prefill_tokens, 4 + 7 + 10 + 13 + 16);
    EXPECT_EQ(job->report.decode_tokens, (3 - 1) + (4 - 1) + (5 - 1) + (3 - 1) + (4 - 1));
    EXPECT_EQ(job->report.prefill_steps, k.prefill_steps);
    EXPECT_EQ(job->report.decode_steps, k.decode_steps);
    EXPECT_GT(job->report.tpot_mean_ms, 0.0);
    EXPECT_GT(job->report.tokens_per_s_per_rank, 0.0);
    // The expert load: every measured token computes top_k rows in every MoE layer, on the FFN ranks that own
    // the experts, and each expert's rows land on its owner.
    const model::ModelConfig& c = f.ckpt->config();
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l) ? 1 : 0;
    const int64_t rows = (job->report.prefill_tokens + job->report.decode_tokens) * c.num_experts_per_tok * moe_layers;
    ASSERT_EQ(job->report.ffn_rows.size(), static_cast<size_t>(k.f));
    ASSERT_EQ(job->report.expert_rows.size(), static_cast<size_t>(c.num_experts));
    int64_t sum = 0;
    for (int ffn = 0; ffn < k.f; ++ffn) {
      int64_t owned = 0;
      const int64_t per = c.num_experts / k.f;
      for (int64_t e = ffn * per; e < (ffn + 1) * per; ++e) owned += job->report.expert_rows[e];
      EXPECT_EQ(job->report.ffn_rows[ffn], owned) << "FFN rank " << ffn;
      sum += owned;
    }
    EXPECT_EQ(sum, rows);
    EXPECT_GE(job->report.ffn_load_max_over_mean, 1.0);
    EXPECT_GE(job->report.expert_load_max_over_mean, 1.0);
  }
}

// --afd-warmup-steps N: the first N steps of every attention rank run as usual (same tokens and logits)
// and are left out of the AFD metrics, on the attention side and on the FFN side (sync: announced on the
// control plane; async: flagged in each transfer). The engine's own table is unchanged.
TEST(EngineAfd, warmup_steps_are_left_out_of_the_afd_metrics_only) {
  Fixture& f = fixture();
  const int64_t moe_layers = f.ckpt->config().num_moe_layers();
  struct WarmCase {
    ConnectorKind kind;
    int a, f, s;
  };
  for (const WarmCase& k : {WarmCase{ConnectorKind::kSync, 2, 1, 2}, WarmCase{ConnectorKind::kAsync, 2, 2, 1},
                            WarmCase{ConnectorKind::kSync, 1, 1, 1}}) {
    auto cold = run_inproc_engine_job(*f.ckpt, *f.dev, requests(f.ckpt->config().vocab_size), 16,
                                      options_for(k.kind, k.a, k.f, k.s, 0));
    auto warm = run_inproc_engine_job(*f.ckpt, *f.dev, requests(f.ckpt->config().vocab_size), 16,
                                      options_for(k.kind, k.a, k.f, k.s, 2));
    ASSERT_TRUE(cold.ok()) << cold.status().to_string();
    ASSERT_TRUE(warm.ok()) << warm.status().to_string();
    const std::string name = fmt::format("{}_{}A{}F_S{}", connector_kind_name(k.kind), k.a, k.f, k.s);
    for (size_t r = 0; r < cold->results.size(); ++r) {
      EXPECT_EQ(warm->results[r].tokens, cold->results[r].tokens) << name << " request " << r;
      EXPECT_EQ(warm->results[r].logits, cold->results[r].logits) << name << " request " << r;
    }
    EXPECT_EQ(warm->metrics.prefill_tokens, cold->metrics.prefill_tokens) << name;
    EXPECT_EQ(warm->metrics.decode_tokens, cold->metrics.decode_tokens) << name;
    // Step 1 (the prefill) and step 2 (every request's first decode) of each attention rank are warm-up.
    EXPECT_EQ(cold->report.prefill_steps + cold->report.decode_steps -
                  (warm->report.prefill_steps + warm->report.decode_steps),
              2 * k.a)
        << name;
    EXPECT_EQ(warm->report.prefill_tokens, 0) << name;
    EXPECT_EQ(cold->report.decode_tokens - warm->report.decode_tokens, 5) << name;
    // Measured + warm-up still add up to the engine's counts.
    EXPECT_EQ(warm->report.warmup_steps, 2 * k.a) << name;
    EXPECT_EQ(warm->report.prefill_tokens + warm->report.warmup_prefill_tokens, warm->metrics.prefill_tokens) << name;
    EXPECT_EQ(warm->report.decode_tokens + warm->report.warmup_decode_tokens, warm->metrics.decode_tokens) << name;
    // Each step moves one message per (attention rank, FFN rank, MoE layer, stage) each way.
    for (Direction d : {Direction::kAttnToFfn, Direction::kFfnToAttn}) {
      EXPECT_EQ(messages(cold->report, d) - messages(warm->report, d), 2 * k.a * k.f * moe_layers * k.s)
          << name << " direction " << static_cast<int>(d);
    }
  }
}

TEST(EngineAfd, failing_attention_rank_ends_the_whole_job) {
  Fixture& f = fixture();
  // Attention rank 0 fails at start-up (a malformed request): the other attention rank and both FFN ranks
  // must stop (no hang) and the job's error must name the failed rank and its reason.
  EngineJobOptions o;
  o.afd.num_attention = 2;
  o.afd.num_ffn = 2;
  o.afd.timeout_ms = 5000;
  auto reqs = requests(f.ckpt->config().vocab_size);
  reqs[0].prompt.push_back(-1);  // never reaches the FFN: rejected at submit on its attention rank
  auto job = run_inproc_engine_job(*f.ckpt, *f.dev, reqs, 16, o);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("request 0: prompt token -1 is outside the vocabulary"), std::string::npos)
      << job.status().to_string();
}

}  // namespace
}  // namespace genbridge::afd
