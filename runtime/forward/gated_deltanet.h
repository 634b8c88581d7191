#pragma once
// GatedDeltaNet: a Qwen3.5 linear-attention layer for the model runner, built from the stable
// linear_attention/* operators over the sequences' state slots, which the DeviceOperator types
// (state_layer_view: one canonical layout per generation). Never asks which generation it runs on.
//
// Per layer, for the T new tokens of a micro-batch (h: the input-normed hidden states):
//   mixed = in_proj_qkv(h) [T, 2 Kd + Vd],  z = in_proj_z(h) [T, Vd],  b = in_proj_b(h), a = in_proj_a(h) [T, nv]
//   x = causal_conv1d(mixed) (silu; continues the conv state)  ->  q, k [T, nk, dk] and v [T, nv, dv] views
//   g, beta = gdn_gating(a, b, A_log, dt_bias);  o = gated_delta_rule(q, k, v, g, beta) (continues the state)
//   out = out_proj(gated_rms_norm(o, z, norm.weight))

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::model {

class GatedDeltaNet {
 public:
  // Binds to a Qwen3.5 checkpoint (bf16 weights), the DeviceOperator and a pool sized by
  // dev.kv_page_geometry(kv_model_shape(config)) with state slots. The references must outlive the object.
  static Result<std::unique_ptr<GatedDeltaNet>> create(const Checkpoint& checkpoint,
                                                       const runtime::DeviceOperator& dev,
                                                       const runtime::KvPagePool& pool);

  struct Scratch;
  std::shared_ptr<Scratch> make_scratch(int64_t max_tokens) const;

  // Layer `layer`'s (a linear-attention layer) mixer for the tokens of a micro-batch: h bf16 [T, hidden];
  // state_slots int32 [S] (each sequence's KvPagePool::state_slot) and query_start_loc int32 [S + 1]; out
  // bf16 [T, hidden]. Advances each sequence's conv and recurrent state by its new tokens.
  Status forward(Scratch& scratch, int64_t layer, const TensorView& h, const TensorView& state_slots,
                 const TensorView& query_start_loc, const TensorView& out) const;

 private:
  GatedDeltaNet(const Checkpoint& c) : config_(c.config()), w_(c.weights()) {}
  const ModelConfig& config_;
  const ModelWeights& w_;
  std::vector<int64_t> state_index_;               // per model layer: its state layer, or -1
  std::vector<runtime::LinearStateCache> state_;  // per state layer
};

}  // namespace genbridge::model
