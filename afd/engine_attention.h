#pragma once
// The attention side of the real engine on an AFD topology (see engine_job.h and rank_job.h).

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_set>
#include <vector>

#include "afd/runner.h"
#include "afd/transports/step_agreement.h"
#include "runtime/engine/executor.h"
#include "runtime/forward/runner.h"

namespace genbridge::afd {

// ForwardExecutor of an attention rank: one forward = one AFD step over `stages` micro-batches.
class AfdExecutor final : public engine::ForwardExecutor {
 public:
  // None of the references are owned; all must outlive the executor. `agreement` may be nullptr (the
  // attention ranks step independently: async connector with async_dp, or a single attention rank). Steps
  // 1..warmup_steps are warm-up: computed as any other, not measured (AttentionRunner::step).
  AfdExecutor(const model::ModelRunner& runner, AttentionRunner& attention, int stages, StepAgreement* agreement,
              int warmup_steps = 0);
  const model::ModelConfig& config() const override { return runner_.config(); }
  Status forward(const model::ForwardInput& input, std::span<float> logits) override;
  std::span<const model::ActivationFault> faults() const override { return faults_; }
  void set_choice_sink(const model::ChoiceSink* sink) override;
  // After the engine finished: keeps sending empty steps while another lockstep rank has work, then tells
  // the FFN ranks this rank is done.
  Status finish();
  int64_t steps() const { return step_; }
  // Serving (afd/serve_job.h): an empty step (every MoE layer's transfers with 0 tokens, as an idle
  // lockstep rank sends) keeps the FFN ranks' deadline on this rank's next step while it has no work; the
  // agreement (nullptr when none) is the one forward() answers; last_step_ns() is when the last step
  // (empty or not) ended, or when the executor was built.
  Status empty_step();
  StepAgreement* agreement() const { return agreement_; }
  int64_t last_step_ns() const { return last_step_ns_; }
  // Tests only (fault injection): called with the step number before each step's forward; an error fails
  // the forward.
  void set_before_step(std::function<Status(int64_t step)> hook) { before_step_ = std::move(hook); }
  // Called after every forward, whether it succeeded or not (a server's live counters).
  void set_after_forward(std::function<void()> hook) { after_forward_ = std::move(hook); }

 private:
  Status step_forward(const model::ForwardInput& input, std::span<float> logits);
  const model::ModelRunner& runner_;
  AttentionRunner& attention_;
  StepAgreement* agreement_;
  std::vector<model::ForwardBatch> batches_;
  std::vector<model::ActivationFault> faults_;  // the last forward's, per input sequence
  // set_choice_sink: each stage's batch tells stage_sinks_[s], which shifts seq_index by the stage's first
  // sequence (stage_seq_begin_[s]) and tells choice_sink_.
  const model::ChoiceSink* choice_sink_ = nullptr;
  std::vector<model::ChoiceSink> stage_sinks_;
  std::vector<int64_t> stage_seq_begin_;
  std::vector<int64_t> planned_tokens_, planned_seqs_;
  int64_t step_ = 0;
  int64_t last_step_ns_ = 0;
  int warmup_steps_ = 0;
  // Sequences seen in an earlier forward: a forward whose sequences are new is a prefill (the engine never
  // mixes prefill and decode in one forward, and prefills a prompt in one forward).
  std::unordered_set<runtime::SeqId> seen_;
  std::unordered_set<runtime::SeqId> prefilled_;  // since the last decode forward
  std::function<Status(int64_t step)> before_step_;
  std::function<void()> after_forward_;
};

}  // namespace genbridge::afd
