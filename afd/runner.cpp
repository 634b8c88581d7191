#include "afd/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace genbridge::afd {

// ---- FFN ----

FfnRunner::FfnRunner(Connector& connector, ExpertComputeFn compute, Metrics* metrics)
    : connector_(connector), compute_(std::move(compute)), metrics_(metrics) {}

Status FfnRunner::serve(FfnWorkItem& item) {
  const int64_t t0 = now_ns();
  Status s = compute_(item);
  const int64_t t1 = now_ns();
  if (!s.ok()) {
    return Status(s.code(), fmt::format("afd: {} failed computing the experts of layer {}, stage {}, step {}: {}",
                                        connector_.topology().rank_name(connector_.world_rank()), item.meta.layer,
                                        item.meta.stage, item.meta.step, s.message()));
  }
  if (metrics_) {
    metrics_->add_busy_ns(t1 - t0);
    metrics_->add_layer_busy_ns(item.meta.layer, t1 - t0);
    metrics_->span(SpanKind::kFfn, t0, t1, item.meta.layer, item.meta.stage, item.meta.step, -1);
    // The expert load: one row per (token, slot) routed to an expert of this rank.
    const int k = connector_.config().top_k;
    const int32_t* ids = item.topk_ids.data_as<const int32_t>();
    for (size_t r = 0; r < item.row_token.size(); ++r) {
      metrics_->add_expert_rows(item.meta.layer, ids[static_cast<size_t>(item.row_token[r]) * k + item.row_slot[r]], 1);
    }
  }
  ++items_;
  GB_RETURN_IF_ERROR(connector_.send_ffn_output(item.out, std::move(item.state)));
  if (metrics_) metrics_->mark_window(t0, now_ns());
  return ok_status();
}

Status FfnRunner::run() {
  ControlPlane* cp = connector_.control_plane();
  const std::vector<int> layers = connector_.config().moe_layers();
  const int S = connector_.config().num_stages;
  if (cp != nullptr) {
    for (;;) {
      GB_ASSIGN_OR_RETURN(StepControl ctl, cp->recv_step());
      if (ctl.stop) return ok_status();
      if (metrics_) metrics_->set_recording(!ctl.warmup);
      const int64_t begin = now_ns();
      for (int layer : layers) {
        for (int s = 0; s < S; ++s) {
          GB_ASSIGN_OR_RETURN(FfnWorkItem item, connector_.recv_attn_output(s));
          if (item.meta.layer != layer) {
            return internal_error(fmt::format("afd: FFN runner expected layer {} but the connector returned layer {}",
                                              layer, item.meta.layer));
          }
          GB_RETURN_IF_ERROR(serve(item));
        }
      }
      if (metrics_) metrics_->mark_window(begin, now_ns());
    }
  }
  for (;;) {
    GB_ASSIGN_OR_RETURN(std::optional<FfnWorkItem> item, connector_.recv_work_item());
    if (!item) return ok_status();
    if (metrics_) metrics_->set_recording(!item->warmup);  // each transfer says whether its step is warm-up
    GB_RETURN_IF_ERROR(serve(*item));
  }
}

// ---- attention ----

AttentionRunner::AttentionRunner(Connector& connector, Metrics* metrics) : connector_(connector), metrics_(metrics) {
  const AfdConfig& cfg = connector_.config();
  moe_index_.assign(cfg.num_layers, -1);
  const std::vector<int> layers = cfg.moe_layers();
  for (size_t i = 0; i < layers.size(); ++i) moe_index_[layers[i]] = static_cast<int>(i);
  expert_out_.resize(cfg.num_stages);
  for (auto& b : expert_out_) {
    b.resize(static_cast<size_t>(cfg.max_tokens_per_stage) * cfg.top_k * cfg.hidden_size);
  }
  moe_.resize(cfg.num_stages);
}

Status AttentionRunner::dispatch(int layer, int stage, int64_t step, int n, const AttentionLayerFns& fns) {
  const AfdConfig& cfg = connector_.config();
  MoeInput& in = moe_[stage];
  if (n > 0) {
    const int64_t t0 = now_ns();
    GB_RETURN_IF_ERROR(fns.attend(layer, stage, &in));
    if (metrics_) {
      const int64_t t1 = now_ns();
      metrics_->add_busy_ns(t1 - t0);
      metrics_->span(SpanKind::kAttention, t0, t1, layer, stage, step, -1);
    }
  } else {
    // An idle stage still sends a well-formed, empty transfer.
    in.hidden = cfg.dispatch_row_bytes > 0 ? TensorView(nullptr, DType::kU8, {0, cfg.dispatch_row_bytes})
                                           : TensorView(nullptr, DType::kBF16, {0, cfg.hidden_size});
    in.topk_ids = TensorView(nullptr, DType::kI32, {0, cfg.top_k});
    in.topk_weights = TensorView(nullptr, DType::kF32, {0, cfg.top_k});
  }
  TransferMeta meta = TransferMeta::attention(layer, stage, step, n);
  meta.warmup = warmup_;
  return connector_.send_attn_output(in.hidden, meta, Routing{in.topk_ids, in.topk_weights});
}

Status AttentionRunner::collect(int layer, int stage, int n, const AttentionLayerFns& fns) {
  const AfdConfig& cfg = connector_.config();
  TensorView out(expert_out_[stage].data(), DType::kBF16, {n, cfg.top_k, cfg.hidden_size});
  const int64_t t0 = now_ns();
  GB_ASSIGN_OR_RETURN(TransferMeta meta, connector_.recv_ffn_output(out, stage));
  const int64_t t1 = now_ns();
  if (meta.layer != layer) {
    return internal_error(fmt::format("afd: attention runner expected layer {} of stage {} but received layer {}",
                                      layer, stage, meta.layer));
  }
  if (metrics_) {
    metrics_->add_idle_ns(t1 - t0);
    metrics_->span(SpanKind::kWait, t0, t1, layer, stage, step_, -1);
  }
  if (n == 0) return ok_status();
  GB_RETURN_IF_ERROR(fns.combine(layer, stage, moe_[stage], out));
  if (metrics_) {
    const int64_t t2 = now_ns();
    metrics_->add_busy_ns(t2 - t1);
    metrics_->span(SpanKind::kAttention, t1, t2, layer, stage, step_, -1);
  }
  return ok_status();
}

Status AttentionRunner::step(int64_t step, std::span<const int> stage_tokens, bool warmup, const AttentionLayerFns& fns,
                             StepPhase phase) {
  const AfdConfig& cfg = connector_.config();
  GB_RETURN_IF_ERROR(check_stage_tokens(cfg, stage_tokens, "afd attention runner"));
  const int S = cfg.num_stages;
  step_ = step;
  warmup_ = warmup;
  if (metrics_) metrics_->set_recording(!warmup);
  const int64_t begin = now_ns();
  if (ControlPlane* cp = connector_.control_plane(); cp != nullptr) {
    GB_RETURN_IF_ERROR(cp->send_step(step, stage_tokens, warmup));
  }
  // Per-stage FIFO: a stage's MoE outputs of layer L are collected when the stage starts layer L+1, so the
  // other stages' attention runs while they cross the link and the FFN ranks compute them. The FFN ranks
  // receive in the same (layer, stage) order, with a control plane as without one.
  std::array<int, kMaxStages> pending;
  pending.fill(-1);
  for (int layer = 0; layer < cfg.num_layers; ++layer) {
    for (int s = 0; s < S; ++s) {
      if (pending[s] >= 0) {
        GB_RETURN_IF_ERROR(collect(pending[s], s, stage_tokens[s], fns));
        pending[s] = -1;
      }
      if (moe_index_[layer] < 0) {
        if (stage_tokens[s] > 0) GB_RETURN_IF_ERROR(fns.attend(layer, s, nullptr));
      } else {
        GB_RETURN_IF_ERROR(dispatch(layer, s, step, stage_tokens[s], fns));
        pending[s] = layer;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    if (pending[s] >= 0) GB_RETURN_IF_ERROR(collect(pending[s], s, stage_tokens[s], fns));
  }
  if (metrics_) {
    const int64_t end = now_ns();
    int64_t tokens = 0;
    for (int n : stage_tokens) tokens += n;
    metrics_->record_step(phase, tokens, end - begin);
    metrics_->mark_window(begin, end);
  }
  return ok_status();
}

Status AttentionRunner::finish() { return connector_.finish(); }

}  // namespace genbridge::afd
