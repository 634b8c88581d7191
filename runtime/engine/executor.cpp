#include "runtime/engine/executor.h"

#include <algorithm>

namespace genbridge::engine {

Status LocalExecutor::forward(const model::ForwardInput& input, std::span<float> logits) {
  const auto tokens = static_cast<int64_t>(input.tokens.size()), seqs = static_cast<int64_t>(input.seq_ids.size());
  if (tokens > planned_tokens_ || seqs > planned_seqs_) {
    // Plan once for the largest batch seen so far; steady-state decode never re-plans.
    planned_tokens_ = std::max(planned_tokens_, tokens);
    planned_seqs_ = std::max(planned_seqs_, seqs);
    batch_ = runner_.make_batch(planned_tokens_, planned_seqs_);
    if (choice_sink_) batch_.set_choice_sink(choice_sink_);
  }
  if (!trace_) return runner_.forward(batch_, input, logits);
  const int64_t step = ++step_;
  const model::ForwardPhaseObserver observer = [this, step](model::ForwardPhase p, int64_t layer, int64_t b,
                                                            int64_t e) { trace_->add(p, layer, step, b, e); };
  return runner_.forward(batch_, input, logits, &observer);
}

void LocalExecutor::set_choice_sink(const model::ChoiceSink* sink) {
  choice_sink_ = sink;
  if (planned_tokens_ > 0) batch_.set_choice_sink(sink);
}

}  // namespace genbridge::engine
