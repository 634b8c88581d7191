// Failure behaviour over the in-process transport: a failing FFN worker ends the whole job at once with
// an error naming it; a hung FFN worker is caught by the deadline, which names the waiting rank, the
// peer, layer, stage and step; no attention rank reports a result after a failure.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "afd/job.h"
#include "afd/runner.h"
#include "afd/transport.h"
#include "afd/support/toy_model.h"

namespace genbridge::afd {
namespace {

using testing::ToyAttention;
using testing::ToyModel;
using testing::Workload;

struct JobRun {
  Status status;
  int64_t ms = 0;
  int attention_finished = 0;
};

// `ffn_compute(rank, connector)` builds each FFN rank's compute.
template <typename MakeCompute>
JobRun run_job(const AfdConfig& cfg, MakeCompute make_compute, std::atomic<bool>* failed_flag = nullptr) {
  const ToyModel model(cfg);
  const Workload w;
  std::atomic<int> finished{0};
  RankFns fns;
  fns.attention = [&](Connector& c, Metrics& m) -> Status {
    ToyAttention att(model, w, cfg, c.rank());
    AttentionRunner runner(c, &m);
    Status s = att.run(runner, w.steps());
    if (!s.ok()) {
      if (failed_flag) *failed_flag = true;
      return s;
    }
    ++finished;
    return ok_status();
  };
  fns.ffn = [&](Connector& c, Metrics& m) -> Status { return FfnRunner(c, make_compute(c.rank(), model), &m).run(); };
  const auto t0 = std::chrono::steady_clock::now();
  JobRun r;
  r.status = run_inproc_job(cfg, fns);
  r.ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  r.attention_finished = finished;
  return r;
}

TEST(AfdFailure, failed_ffn_worker_ends_the_job_naming_the_rank) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 2, 2);
    cfg.timeout_ms = 20000;
    const JobRun r = run_job(cfg, [](int rank, const ToyModel& m) -> ExpertComputeFn {
      ExpertComputeFn inner = testing::toy_expert_compute(m);
      return [rank, inner](const FfnWorkItem& item) -> Status {
        if (rank == 1 && item.meta.step >= 1) return internal_error("injected failure");
        return inner(item);
      };
    });
    ASSERT_FALSE(r.status.ok()) << connector_kind_name(kind);
    const std::string& msg = r.status.message();
    EXPECT_NE(msg.find("ffn rank 1 (world rank 3) failed: afd: ffn rank 1 (world rank 3) failed computing the "
                       "experts of layer 1, stage "),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("step 1: injected failure"), std::string::npos) << msg;
    EXPECT_EQ(r.status.code(), StatusCode::kInternal);
    EXPECT_EQ(r.attention_finished, 0) << "no attention rank may report results after a failure";
    EXPECT_LT(r.ms, 2000) << "well within the 20 s deadline";
  }
}

TEST(AfdFailure, hung_ffn_worker_hits_the_deadline_naming_rank_peer_layer_stage_step) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 1, 2);
    cfg.timeout_ms = 600;
    std::atomic<bool> failed{false};
    const JobRun r = run_job(
        cfg,
        [&](int, const ToyModel& m) -> ExpertComputeFn {
          ExpertComputeFn inner = testing::toy_expert_compute(m);
          return [&failed, inner](const FfnWorkItem& item) -> Status {
            if (item.meta.step == 2 && item.meta.layer == 2) {
              // Stop responding until an attention rank has timed out, then finish normally: an error
              // returned here could reach the job before the attention rank's deadline error does (the
              // flag is set just before that rank returns), so the FFN rank's only failure is the abort.
              while (!failed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
              return inner(item);
            }
            return inner(item);
          };
        },
        &failed);
    ASSERT_FALSE(r.status.ok());
    const std::string& msg = r.status.message();
    EXPECT_EQ(r.status.code(), StatusCode::kDeadlineExceeded) << msg;
    // Sync: the attention ranks are in lockstep and block on layer 1 or 2 of step 2 (the FFN rank stops at
    // layer 2 of step 2). Async: a rank may lag behind and time out on its own earlier layer and step.
    // Sync with two attention ranks: the FFN rank may itself wait for the other attention rank, so the
    // attention ranks wait twice the deadline for expert outputs.
    const std::string where =
        kind == ConnectorKind::kSync ? "layer [12], stage [01], step 2" : "layer [1-3], stage [01], step [0-2]";
    const std::string waited = kind == ConnectorKind::kSync ? "1200" : "600";
    EXPECT_THAT(msg, ::testing::ContainsRegex("attention rank [01] \\(world rank [01]\\) timed out after " + waited +
                                              " ms waiting "
                                              "for the expert outputs of " +
                                              where + " from ffn rank 0 \\(world rank 2\\)$"));
    EXPECT_EQ(r.attention_finished, 0);
    EXPECT_GE(r.ms, 600);
    EXPECT_LT(r.ms, 5000);
  }
}

TEST(AfdFailure, failed_attention_worker_unblocks_the_ffn_ranks) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 1, 1);
    cfg.timeout_ms = 20000;
    cfg.init_timeout_ms = 20000;  // the FFN rank would wait this long for attention rank 1's first step
    const ToyModel model(cfg);
    RankFns fns;
    fns.attention = [&](Connector& c, Metrics&) -> Status {
      if (c.rank() == 1) return internal_error("attention rank 1 lost its KV pool");
      ToyAttention att(model, Workload(), cfg, c.rank());
      AttentionRunner runner(c);
      return att.run(runner, Workload().steps());
    };
    fns.ffn = [&](Connector& c, Metrics&) -> Status { return FfnRunner(c, testing::toy_expert_compute(model)).run(); };
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = run_inproc_job(cfg, fns);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("attention rank 1 (world rank 1) failed: attention rank 1 lost its KV pool"),
              std::string::npos)
        << s.message();
    EXPECT_LT(ms, 2000);
  }
}

// An attention rank that stops between two steps (a stopped process, a stuck scheduler) while the other
// keeps decoding: the FFN rank it owes its next step ends the job within the deadline, naming it, instead
// of waiting without a deadline for a step that never comes.
TEST(AfdFailure, attention_rank_stalled_between_steps_ends_the_job_naming_it) {
  for (ConnectorKind kind : {ConnectorKind::kSync, ConnectorKind::kAsync}) {
    AfdConfig cfg = testing::toy_config(kind, 2, 1, 1);
    cfg.timeout_ms = 500;
    const ToyModel model(cfg);
    const Workload w;
    std::atomic<bool> failed{false};
    RankFns fns;
    fns.attention = [&](Connector& c, Metrics&) -> Status {
      AttentionRunner runner(c);
      if (c.rank() == 1) {
        // One empty step, then silence until the job failed (or 10 s: then it finishes normally).
        const std::vector<int> idle(cfg.num_stages, 0);
        GB_RETURN_IF_ERROR(runner.step(0, idle, false, AttentionLayerFns{}));
        for (int i = 0; i < 10000 && !failed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!failed) return runner.finish();
        // Released: end only when the job's abort reaches this rank (a wait on a message nobody sends), so
        // that the FFN rank's deadline error, not one of ours, is the job's first failure.
        Transport& t = c.transport();
        GB_ASSIGN_OR_RETURN(RequestId id, t.irecv(kAnySource, Channel::kControl, 0x7ead, {}));
        const RequestId ids[] = {id};
        Completion done;
        Result<int> woke = t.wait_any(ids, deadline_after_ms(10000), &done);
        return woke.ok() ? internal_error("a message nobody sent arrived") : woke.status();
      }
      ToyAttention att(model, w, cfg, c.rank());
      Status s = att.run(runner, 0);
      if (!s.ok()) failed = true;
      return s;
    };
    fns.ffn = [&](Connector& c, Metrics&) -> Status {
      Status s = FfnRunner(c, testing::toy_expert_compute(model)).run();
      if (!s.ok()) failed = true;
      return s;
    };
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = run_inproc_job(cfg, fns);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(s.ok()) << connector_kind_name(kind);
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.message();
    const std::string what = kind == ConnectorKind::kSync ? "the next step's control message" : "the next step";
    EXPECT_THAT(s.message(), ::testing::HasSubstr("ffn rank 0 (world rank 2) timed out after 500 ms waiting for " +
                                                  what + " (step 1) from attention rank 1 (world rank 1)"))
        << connector_kind_name(kind);
    EXPECT_LT(ms, 3000) << connector_kind_name(kind);
  }
}

}  // namespace
}  // namespace genbridge::afd
