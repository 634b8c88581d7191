#pragma once
// Runners: the loops on either side of a connector, with the model's work plugged in as callbacks.
//  * FfnRunner drives an FFN rank: sync (control plane present): recv_step -> for each MoE layer, for
//    each stage: recv_attn_output, compute, send_ffn_output; async (no control plane): recv_work_item ->
//    compute that item's layer -> send_ffn_output, until every attention rank finished.
//  * AttentionRunner runs one decode step of an attention rank over S stages (micro-batches): it calls
//    the engine's `attend` (attention + router of a layer, or a whole dense layer) and `combine`
//    (moe_combine + residual on the expert outputs) and moves the data in between. A stage's layer-L
//    outputs are collected at the start of layer L+1 (per-stage FIFO), so stage s+1's attention overlaps
//    stage s's transfers and experts (ping-pong), with either connector.
// Both branch on control_plane() == nullptr only.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "afd/connector.h"
#include "afd/metrics.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::afd {

// The engine's expert computation for one work item: for every row r, write the output of expert
// topk_ids[row_token[r], row_slot[r]] of layer item.meta.layer applied to hidden[row_token[r]] into
// item.out[r]. Must not retain the views.
using ExpertComputeFn = std::function<Status(const FfnWorkItem& item)>;

class FfnRunner {
 public:
  // Does not own `connector` or `metrics` (may be nullptr); both must outlive run().
  FfnRunner(Connector& connector, ExpertComputeFn compute, Metrics* metrics = nullptr);
  // Serves work until every attention rank finished (OK) or something failed (the error names the rank,
  // peer, layer, stage and step). Blocks.
  Status run();
  int64_t items_served() const { return items_; }

 private:
  Status serve(FfnWorkItem& item);
  Connector& connector_;
  ExpertComputeFn compute_;
  Metrics* metrics_;
  int64_t items_ = 0;
};

// MoE input of one (layer, stage), produced by the engine's router: hidden bf16 [n, H] (unit stride
// along H; with a quantized dispatch its rows, uint8 [n, dispatch_row_bytes]), topk_ids i32 [n, k],
// topk_weights f32 [n, k].
struct MoeInput {
  TensorView hidden;
  TensorView topk_ids;
  TensorView topk_weights;
};

struct AttentionLayerFns {
  // Runs `layer` for the tokens of `stage`. Dense layer: the whole layer (`moe` is nullptr). MoE layer:
  // attention and router, filling *moe; its views must stay valid and unmodified until `combine` of the
  // same (layer, stage) returns.
  std::function<Status(int layer, int stage, MoeInput* moe)> attend;
  // Consumes the expert outputs of a MoE layer: expert_out bf16 [n, k, H], expert_out[t, j] = output of
  // expert topk_ids[t, j] for token t (valid during the call only); typically moe_combine + residual.
  std::function<Status(int layer, int stage, const MoeInput& moe, TensorView expert_out)> combine;
};

class AttentionRunner {
 public:
  // Does not own `connector` or `metrics` (may be nullptr). Allocates the per-stage expert-output
  // buffers once (S x max_tokens_per_stage x k x H bf16).
  AttentionRunner(Connector& connector, Metrics* metrics = nullptr);
  // One step: stage s has stage_tokens[s] tokens (size S; may be 0, an idle stage still sends
  // well-formed empty messages and its callbacks are not called). `step` must increase. A warm-up step is
  // not measured, here nor on the FFN ranks (its transfers carry the warm-up flag; the sync connector
  // also announces it on the control plane). `phase` says which metrics the step counts in. Blocks until
  // every layer of every stage is done.
  Status step(int64_t step, std::span<const int> stage_tokens, bool warmup, const AttentionLayerFns& fns,
              StepPhase phase = StepPhase::kDecode);
  // No more steps from this rank (tells the FFN ranks).
  Status finish();

 private:
  Status dispatch(int layer, int stage, int64_t step, int n, const AttentionLayerFns& fns);
  Status collect(int layer, int stage, int n, const AttentionLayerFns& fns);
  Connector& connector_;
  Metrics* metrics_;
  std::vector<int> moe_index_;                   // layer -> index among MoE layers, or -1
  std::vector<std::vector<bf16_t>> expert_out_;  // per stage
  std::vector<MoeInput> moe_;                    // per stage
  int64_t step_ = 0;
  bool warmup_ = false;
};

}  // namespace genbridge::afd
