// The real engine on every AFD topology of the matrix (connector x A:F x stages, in-process transport)
// gives the monolithic engine's tokens and logits bit for bit, on a synthetic checkpoint with a dense
// layer and a shared expert. (The same matrix over MPI runs the stand-in model under mpirun.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "afd/engine_job.h"
#include "afd/support/engine_job_case.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  Fixture() {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir / "m")).value());
    dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
  }
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

const std::vector<engine::RequestResult>& monolithic() {
  static std::vector<engine::RequestResult> res = [] {
    Fixture& f = fixture();
    const model::ModelConfig& c = f.ckpt->config();
    auto pool = runtime::KvPagePool::create(
        f.dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 16);
    auto runner = model::ModelRunner::create(*f.ckpt, *f.dev, *pool);
    engine::LocalExecutor ex(**runner);
    engine::Engine eng(ex, *pool, {.record_logits = true});
    for (auto& r : requests(c.vocab_size)) EXPECT_TRUE(eng.submit(r).ok());
    EXPECT_TRUE(eng.run_to_completion().ok());
    return eng.results();
  }();
  return res;
}

struct Case {
  ConnectorKind connector;
  int a, f, s;
};

class EngineAfd : public ::testing::TestWithParam<Case> {};

TEST_P(EngineAfd, tokens_and_logits_equal_the_monolithic_engine) {
  const Case k = GetParam();
  Fixture& f = fixture();
  EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
  auto job = run_inproc_engine_job(*f.ckpt, *f.dev, requests(f.ckpt->config().vocab_size), 16, o);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const auto& mono = monolithic();
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
  for (ConnectorKind c : {ConnectorKind::kSync, ConnectorKind::kAsync})
    for (auto [a, f] : {std::pair{1, 1}, {2, 1}, {2, 2}})
      for (int s : {1, 2}) out.push_back({c, a, f, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineAfd, ::testing::ValuesIn(matrix()), [](const auto& info) {
  const Case& k = info.param;
  return fmt::format("{}_{}A{}F_S{}", connector_kind_name(k.connector), k.a, k.f, k.s);
});

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
