#pragma once
// QuantizedWeights: a checkpoint's weights quantized at load into the representation the DeviceOperator put
// in force (--weight-quant), for the roles its contract quantizes (attention projections, routed
// experts, shared experts -- Qwen's gated shared_expert and DeepSeek's shared_experts -- and dense MLPs;
// router, DSA indexer, Qwen3.5's Gated DeltaNet projections and LM head stay bf16). FP8 checkpoint weights
// convert from their codes and scales.
// Owns the quantized bytes; the ModelRunner and ExpertBank read them through ops::QuantWeight views.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/moe/quant_expert_ffn.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"

namespace genbridge::model {

// Told after each weight matrix is quantized: matrices done and in all.
using QuantizeProgressFn = std::function<void(int64_t done, int64_t total)>;

// Which share of the model to quantize (the roles the contract's layers name, intersected with this):
// everything (monolithic, in-process AFD), an AFD attention rank's side, or an FFN rank's experts.
struct QuantizeOptions {
  bool attention = true;  // the attention side: attention projections, shared experts, dense MLPs
  bool experts = true;    // routed experts, those in [expert_begin, expert_end)
  int64_t expert_begin = 0;
  int64_t expert_end = -1;  // -1: every expert
  const QuantizeProgressFn* progress = nullptr;
};

class QuantizedWeights {
 public:
  struct Layer {
    bool attention = false;  // GQA: q, k, v, o below are set
    ops::QuantWeight q_proj, k_proj, v_proj, o_proj;
    // MLA (DeepSeek): q_a + q_b (q_lora_rank > 0) or q_proj, kv_a (kv_a_proj_with_mqa), o_proj, and kv_b in
    // the absorbed form's layout, per head: w_uk_t[h] = W_UK[h]^T [kv_lora_rank, qk_nope_head_dim] (scales
    // along qk_nope_head_dim) and w_uv[h] = kv_b's value rows [v_head_dim, kv_lora_rank]. The indexer's
    // projections stay bf16 (QuantizedLayers::indexer_projections).
    bool mla = false;
    ops::QuantWeight q_a_proj, q_b_proj, kv_a_proj;
    std::vector<ops::QuantWeight> w_uk_t, w_uv;
    // Indexed by expert id; only [expert_begin(), expert_end()) are set. Empty: bf16 experts (or a dense layer).
    std::vector<ops::QuantExpertWeights> experts;
    bool shared = false;  // shared expert quantized
    ops::QuantExpertWeights shared_expert;
    bool dense = false;  // dense MLP quantized
    ops::QuantExpertWeights dense_mlp;
  };

  // Quantizes `checkpoint`'s bf16 weights into `repr` for the roles `layers` names (and `options` keeps).
  // Uses the kernel threads; the result does not depend on their number. Unimplemented when the build's
  // generation cannot run repr (quant_linear's message). Each matrix is quantized alone, so a share has
  // the bits of the same matrices quantized with the whole model. An expert range outside [0, experts)
  // is InvalidArgument.
  static Result<std::unique_ptr<QuantizedWeights>> quantize(const Checkpoint& checkpoint,
                                                            const runtime::WeightQuantRepresentation& repr,
                                                            const runtime::QuantizedLayers& layers,
                                                            const QuantizeOptions& options = {});

  const runtime::WeightQuantRepresentation& representation() const { return *repr_; }
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes of the quantized weights (data + scales), and of the bf16 weights they replace.
  uint64_t quantized_bytes() const { return quantized_bytes_; }
  uint64_t replaced_bf16_bytes() const { return replaced_bytes_; }
  int64_t num_matrices() const { return matrices_; }
  // Matrices converted from an FP8 block-scaled checkpoint's codes and scales (Checkpoint::fp8_source)
  // rather than from bf16 weights.
  int64_t num_from_fp8() const { return from_fp8_; }
  double seconds() const { return seconds_; }
  // The share held: the attention side (when the contract quantizes any of it), and the routed experts
  // [expert_begin, expert_end) of every MoE layer (an empty range when the contract keeps them bf16 or
  // the share left them out).
  bool holds_attention_side() const { return attention_side_; }
  bool experts_quantized() const { return experts_role_; }  // the contract quantizes routed experts
  int64_t expert_begin() const { return expert_begin_; }
  int64_t expert_end() const { return expert_end_; }
  // "mxfp8 for <what> (<n> matrices: <q> MiB from <b> MiB bf16, quantized at load in <t> s)".
  std::string describe() const;

 private:
  QuantizedWeights() = default;
  // Rows [row_begin, row_end) of an FP8 checkpoint weight as the values of one matrix, transposed when
  // `transposed` (W_UK^T of kv_b). No source: the bf16 view's values.
  struct Fp8Rows {
    const Checkpoint::Fp8Source* source = nullptr;
    int64_t row_begin = 0, row_end = 0;
    bool transposed = false;
  };
  // `w` quantized from its FP8 source when the checkpoint has one for it, else from its bf16 values.
  Result<ops::QuantWeight> quantize_one(const TensorView& w);
  // `w`'s shape ([N, K], and its dtype for the replaced bytes) quantized from `fp8`'s rows when it has a
  // source ([N, K] rows, or [K, N] when transposed), else from w's values.
  Result<ops::QuantWeight> quantize_one(const TensorView& w, const Fp8Rows& fp8);
  const runtime::WeightQuantRepresentation* repr_ = nullptr;
  const Checkpoint* checkpoint_ = nullptr;
  int64_t from_fp8_ = 0;
  bool attention_side_ = false, experts_role_ = false, share_ = false;
  int64_t expert_begin_ = 0, expert_end_ = 0, num_experts_ = 0;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  uint64_t quantized_bytes_ = 0, replaced_bytes_ = 0;
  int64_t matrices_ = 0;
  double seconds_ = 0;
};

}  // namespace genbridge::model
