// AFD == monolithic, bit for bit: every connector x A:F in {1:1, 2:1, 2:2} x S in {1, 2} over the
// in-process transport (the MPI transport runs the same matrix under mpirun: tests/afd/mpi).

#include <gtest/gtest.h>

#include <mutex>
#include <tuple>

#include "afd/job.h"
#include "afd/runner.h"
#include "afd/support/toy_model.h"

namespace genbridge::afd {
namespace {

using testing::ToyAttention;
using testing::ToyModel;
using testing::Trace;
using testing::Workload;

struct Outcome {
  Status status;
  Trace afd;
};

Outcome run_afd(const AfdConfig& cfg, const ToyModel& model, const Workload& w, int warmup_steps = 0,
                JobOptions options = {}) {
  Outcome o{Status(), Trace(w.num_requests)};
  std::mutex mu;
  const bool lockstep = cfg.connector == ConnectorKind::kSync || !cfg.async_dp;
  RankFns fns;
  fns.attention = [&](Connector& c, Metrics& metrics) -> Status {
    ToyAttention att(model, w, cfg, c.rank());
    AttentionRunner runner(c, &metrics);
    GB_RETURN_IF_ERROR(att.run(runner, lockstep ? w.steps() : 0, warmup_steps));
    std::lock_guard lock(mu);
    for (int r : att.requests()) {
      o.afd.tokens[r] = att.trace().tokens[r];
      o.afd.logit_bits[r] = att.trace().logit_bits[r];
    }
    return ok_status();
  };
  fns.ffn = [&](Connector& c, Metrics& metrics) -> Status {
    FfnRunner runner(c, testing::toy_expert_compute(model), &metrics);
    return runner.run();
  };
  o.status = run_inproc_job(cfg, fns, options);
  return o;
}

void expect_same(const Trace& want, const Trace& got, int num_requests) {
  for (int r = 0; r < num_requests; ++r) {
    ASSERT_EQ(want.tokens[r], got.tokens[r]) << "request " << r;
    ASSERT_EQ(want.logit_bits[r], got.logit_bits[r]) << "request " << r << " logits differ";
    ASSERT_FALSE(got.tokens[r].empty());
  }
}

using Case = std::tuple<ConnectorKind, std::pair<int, int>, int>;

std::string case_name(const Case& c) {
  const std::pair<int, int> af = std::get<1>(c);
  return std::string(connector_kind_name(std::get<0>(c))) + "_" + std::to_string(af.first) + "A" +
         std::to_string(af.second) + "F_S" + std::to_string(std::get<2>(c));
}

class BitIdentity : public ::testing::TestWithParam<Case> {};

TEST_P(BitIdentity, matches_monolithic) {
  const auto [kind, af, stages] = GetParam();
  const AfdConfig cfg = testing::toy_config(kind, af.first, af.second, stages);
  const ToyModel model(cfg);
  const Workload w;
  const Trace want = testing::run_monolithic(model, w);
  const Outcome got = run_afd(cfg, model, w);
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  expect_same(want, got.afd, w.num_requests);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, BitIdentity,
    ::testing::Combine(::testing::Values(ConnectorKind::kSync, ConnectorKind::kAsync),
                       ::testing::Values(std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}), ::testing::Values(1, 2)),
    [](const ::testing::TestParamInfo<Case>& i) { return case_name(i.param); });

TEST(BitIdentityExtra, three_stages_four_ffn_ranks_more_tokens_than_stages) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 4, 3);
    const ToyModel model(cfg);
    Workload w;
    w.num_requests = 13;
    const Outcome got = run_afd(cfg, model, w);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    expect_same(testing::run_monolithic(model, w), got.afd, w.num_requests);
  }
}

TEST(BitIdentityExtra, async_dp_ranks_step_independently) {
  AfdConfig cfg = testing::toy_config(ConnectorKind::kAsync, 3, 2, 2);
  cfg.async_dp = true;
  const ToyModel model(cfg);
  Workload w;
  w.num_requests = 5;  // rank 2 gets 1 request: its step count differs from the others'
  const Outcome got = run_afd(cfg, model, w);
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  expect_same(testing::run_monolithic(model, w), got.afd, w.num_requests);
}

TEST(BitIdentityExtra, no_dense_layers_and_top_k_one) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 2, 2);
    cfg.dense_layers.clear();
    cfg.top_k = 1;
    const ToyModel model(cfg);
    const Workload w;
    const Outcome got = run_afd(cfg, model, w);
    ASSERT_TRUE(got.status.ok()) << got.status.to_string();
    expect_same(testing::run_monolithic(model, w), got.afd, w.num_requests);
  }
}

TEST(BitIdentityExtra, warmup_steps_are_not_measured_and_change_nothing) {
  AfdConfig cfg = testing::toy_config(ConnectorKind::kSync, 2, 1, 2);
  const ToyModel model(cfg);
  const Workload w;
  AfdReport report;
  JobOptions options;
  options.report = &report;
  const Outcome got = run_afd(cfg, model, w, /*warmup_steps=*/2, options);
  ASSERT_TRUE(got.status.ok()) << got.status.to_string();
  expect_same(testing::run_monolithic(model, w), got.afd, w.num_requests);
  int64_t tokens = 0;
  for (int r = 0; r < w.num_requests; ++r) tokens += w.gen_len(r);
  EXPECT_EQ(report.decode_tokens, tokens);
}

}  // namespace
}  // namespace genbridge::afd

namespace genbridge::afd {
namespace {

// The comparison can fail: FFN ranks whose experts differ in one weight change the result.
TEST(BitIdentityExtra, a_different_expert_on_the_ffn_side_is_detected) {
  const AfdConfig cfg = testing::toy_config(ConnectorKind::kAsync, 2, 2, 2);
  const ToyModel model(cfg);
  ToyModel other(cfg);
  for (int e = 0; e < other.E; ++e) other.expert_b[(size_t(1) * other.E + e) * other.H + 5] += 0.25f;  // layer 1 is MoE
  const Workload w;
  Trace afd(w.num_requests);
  std::mutex mu;
  RankFns fns;
  fns.attention = [&](Connector& c, Metrics& metrics) -> Status {
    ToyAttention att(model, w, cfg, c.rank());
    AttentionRunner runner(c, &metrics);
    GB_RETURN_IF_ERROR(att.run(runner, w.steps()));
    std::lock_guard lock(mu);
    for (int r : att.requests()) afd.logit_bits[r] = att.trace().logit_bits[r];
    return ok_status();
  };
  fns.ffn = [&](Connector& c, Metrics& metrics) -> Status {
    return FfnRunner(c, testing::toy_expert_compute(other), &metrics).run();
  };
  ASSERT_TRUE(run_inproc_job(cfg, fns).ok());
  const Trace want = testing::run_monolithic(model, w);
  bool differs = false;
  for (int r = 0; r < w.num_requests; ++r) differs |= want.logit_bits[r] != afd.logit_bits[r];
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace genbridge::afd
