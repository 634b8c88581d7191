#pragma once
// ForwardExecutor: how the engine runs one forward over a set of sequences. The monolithic executor
// runs the whole model here; an attention-FFN disaggregated executor (afd/) runs attention here and the
// experts on FFN ranks. The engine's scheduling does not depend on which.

#include <cstdint>
#include <span>

#include "genbridge/core/status.h"
#include "runtime/engine/step_trace.h"
#include "runtime/forward/runner.h"

namespace genbridge::engine {

class ForwardExecutor {
 public:
  virtual ~ForwardExecutor() = default;
  virtual const model::ModelConfig& config() const = 0;
  // One forward over the sequences of `input` (their KV pages already hold the new lengths): writes the
  // new tokens' K/V and the last position's fp32 logits of every sequence into logits[S * vocab]. Blocks.
  virtual Status forward(const model::ForwardInput& input, std::span<float> logits) = 0;
  // After a forward that succeeded: per sequence of its input, in order, the first activation fault of its
  // rows (model::ActivationFault; found() false for a healthy sequence). Valid until the next forward.
  virtual std::span<const model::ActivationFault> faults() const = 0;
  // Hands every following forward's routing and indexer choices to `sink` (model::TokenChoices; its
  // seq_index indexes the forward's input). Not owned; nullptr: off.
  virtual void set_choice_sink(const model::ChoiceSink* sink) = 0;
};

// Runs the whole model in this process (every expert local).
class LocalExecutor final : public ForwardExecutor {
 public:
  explicit LocalExecutor(const model::ModelRunner& runner) : runner_(runner) {}
  const model::ModelConfig& config() const override { return runner_.config(); }
  Status forward(const model::ForwardInput& input, std::span<float> logits) override;
  std::span<const model::ActivationFault> faults() const override { return batch_.faults(); }
  void set_choice_sink(const model::ChoiceSink* sink) override;
  // Records every phase of every following forward into `trace` (not owned; nullptr: none).
  void set_trace(StepTrace* trace) { trace_ = trace; }

 private:
  const model::ModelRunner& runner_;
  model::ForwardBatch batch_;
  int64_t planned_tokens_ = 0, planned_seqs_ = 0;
  StepTrace* trace_ = nullptr;
  const model::ChoiceSink* choice_sink_ = nullptr;
  int64_t step_ = 0;
};

}  // namespace genbridge::engine
