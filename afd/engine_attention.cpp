// The attention side of the engine on an AFD topology: AfdExecutor, the engine's ForwardExecutor that runs
// attention and the router locally and sends each MoE layer's tokens to the FFN ranks.

#include "afd/engine_attention.h"

#include <algorithm>

namespace genbridge::afd {

AfdExecutor::AfdExecutor(const model::ModelRunner& runner, AttentionRunner& attention, int stages,
                         StepAgreement* agreement, int warmup_steps)
    : runner_(runner),
      attention_(attention),
      agreement_(agreement),
      batches_(static_cast<size_t>(stages)),
      planned_tokens_(static_cast<size_t>(stages), 0),
      planned_seqs_(static_cast<size_t>(stages), 0),
      last_step_ns_(now_ns()),
      warmup_steps_(warmup_steps) {}

Status AfdExecutor::forward(const model::ForwardInput& in, std::span<float> logits) {
  const Status s = step_forward(in, logits);
  if (after_forward_) after_forward_();
  return s;
}

Status AfdExecutor::step_forward(const model::ForwardInput& in, std::span<float> logits) {
  if (before_step_) GB_RETURN_IF_ERROR(before_step_(step_ + 1));
  if (agreement_) GB_RETURN_IF_ERROR(agreement_->any_active(true).status());
  const int S = static_cast<int>(batches_.size());
  const int64_t num_seqs = static_cast<int64_t>(in.seq_ids.size()), T = static_cast<int64_t>(in.tokens.size());
  const int64_t vocab = runner_.config().vocab_size;
  // Contiguous groups of whole sequences, balanced by tokens: stage s ends once the running total reaches
  // (s + 1) * T / S (a stage may stay empty when there are fewer sequences than stages).
  std::vector<int64_t> seq_end(static_cast<size_t>(S)), tok_begin(static_cast<size_t>(S + 1), 0),
      seq_begin(static_cast<size_t>(S + 1), 0);
  {
    int64_t s_idx = 0, tokens = 0;
    for (int s = 0; s < S; ++s) {
      seq_begin[s] = s_idx;
      tok_begin[s] = tokens;
      const int64_t goal = (s + 1) * T / S;
      while (s_idx < num_seqs && (tokens < goal || s == S - 1)) tokens += in.q_lens[s_idx++];
      seq_end[s] = s_idx;
    }
    tok_begin[S] = tokens;
    seq_begin[S] = s_idx;
  }
  std::vector<int> stage_tokens(static_cast<size_t>(S), 0);
  for (int s = 0; s < S; ++s) {
    const int64_t n = seq_end[s] - seq_begin[s], t = tok_begin[s + 1] - tok_begin[s];
    stage_tokens[s] = static_cast<int>(t);
    if (n == 0) continue;
    if (t > planned_tokens_[s] || n > planned_seqs_[s]) {
      planned_tokens_[s] = std::max(planned_tokens_[s], t);
      planned_seqs_[s] = std::max(planned_seqs_[s], n);
      batches_[s] = runner_.make_batch(planned_tokens_[s], planned_seqs_[s]);
      if (choice_sink_) batches_[s].set_choice_sink(&stage_sinks_[s]);
    }
    if (choice_sink_) stage_seq_begin_[s] = seq_begin[s];
    const model::ForwardInput sub{in.tokens.subspan(tok_begin[s], t), in.seq_ids.subspan(seq_begin[s], n),
                                  in.q_lens.subspan(seq_begin[s], n)};
    GB_RETURN_IF_ERROR(runner_.begin(batches_[s], sub));
  }
  AttentionLayerFns fns;
  fns.attend = [&](int layer, int stage, MoeInput* moe) -> Status {
    model::ForwardBatch& b = batches_[stage];
    GB_RETURN_IF_ERROR(runner_.attention_block(b, layer));
    if (moe) {
      GB_RETURN_IF_ERROR(runner_.route(b, layer));
      // With a quantized dispatch route() quantized the input: its rows travel (docs/afd.md#quantized-dispatch).
      const TensorView rows = b.moe_dispatch_rows();
      *moe = MoeInput{rows.rank() == 2 ? rows : b.moe_input(), b.topk_ids(), b.topk_weights()};
    }
    return ok_status();
  };
  fns.combine = [&](int layer, int stage, const MoeInput&, TensorView expert_out) -> Status {
    return runner_.finish_moe(batches_[stage], layer, &expert_out);
  };
  const StepPhase phase = num_seqs > 0 && !seen_.contains(in.seq_ids[0]) ? StepPhase::kPrefill : StepPhase::kDecode;
  // A decode forward holds every running sequence except those prefilled since the previous decode: any
  // other has ended (a server's stream of requests would otherwise grow the set for ever).
  if (phase == StepPhase::kDecode) {
    seen_.swap(prefilled_);
    prefilled_.clear();
  } else {
    for (const runtime::SeqId id : in.seq_ids) prefilled_.insert(id);
  }
  for (const runtime::SeqId id : in.seq_ids) seen_.insert(id);
  ++step_;
  GB_RETURN_IF_ERROR(attention_.step(step_, stage_tokens, step_ <= warmup_steps_, fns, phase));
  last_step_ns_ = now_ns();
  faults_.clear();
  for (int s = 0; s < S; ++s) {
    const int64_t n = seq_end[s] - seq_begin[s];
    if (n == 0) continue;
    GB_RETURN_IF_ERROR(runner_.logits(batches_[s], logits.subspan(seq_begin[s] * vocab, n * vocab)));
    const std::span<const model::ActivationFault> f = batches_[s].faults();
    faults_.insert(faults_.end(), f.begin(), f.end());
  }
  return ok_status();
}

void AfdExecutor::set_choice_sink(const model::ChoiceSink* sink) {
  choice_sink_ = sink;
  const size_t S = batches_.size();
  stage_seq_begin_.assign(S, 0);
  stage_sinks_.clear();
  for (size_t s = 0; s < S; ++s) {
    stage_sinks_.push_back([this, s](const model::TokenChoices& c) {
      model::TokenChoices shifted = c;
      shifted.seq_index += stage_seq_begin_[s];
      (*choice_sink_)(shifted);
    });
  }
  for (size_t s = 0; s < S; ++s) {
    if (planned_tokens_[s] > 0) batches_[s].set_choice_sink(sink ? &stage_sinks_[s] : nullptr);
  }
}

Status AfdExecutor::empty_step() {
  const std::vector<int> idle(batches_.size(), 0);
  ++step_;
  GB_RETURN_IF_ERROR(attention_.step(step_, idle, step_ <= warmup_steps_, AttentionLayerFns{}));
  last_step_ns_ = now_ns();
  return ok_status();
}

Status AfdExecutor::finish() {
  if (agreement_) {
    for (;;) {
      GB_ASSIGN_OR_RETURN(const bool any, agreement_->any_active(false));
      if (!any) break;
      GB_RETURN_IF_ERROR(empty_step());
    }
  }
  return attention_.finish();
}

}  // namespace genbridge::afd
