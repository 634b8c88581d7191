#pragma once
// QuantizedWeights: a checkpoint's weights quantized at load into the representation the DeviceOperator put
// in force (--weight-quant), for the roles its contract quantizes (attention projections, routed
// experts, shared experts -- Qwen's gated shared_expert and DeepSeek's shared_experts -- and dense MLPs;
// router, DSA indexer, Qwen3.5's Gated DeltaNet projections, DeepSeek-V4's compressors and LM head stay bf16).
// Weights the checkpoint holds quantized convert from their codes and scales: FP8 blocks (Hugging Face's and
// DeepSeek-V4's) and DeepSeek-V4's MXFP4 routed experts, whose codes an MXFP4 representation keeps as they are
// (docs/quant_weights.md).
// Owns the quantized bytes (kept MXFP4 codes are read in place from the checkpoint's files); the ModelRunner,
// V4Attention and ExpertBank read them through ops::QuantWeight views.

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
  // The representation of the weights the checkpoint holds as MXFP4 (Checkpoint::mxfp4_source: DeepSeek-V4's
  // routed experts); nullptr: the one every other weight takes. DeviceOperator::mxfp4_weight_quant() gives it
  // (--weight-quant auto on a generation that runs MXFP4: mxfp4, the file's codes kept).
  const runtime::WeightQuantRepresentation* mxfp4_repr = nullptr;
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
    // DeepSeek-V4: wq_a, wq_b, wkv, wo_b, and wo_a per output group (o_groups entries, group g = wo_a's rows
    // [g o_lora_rank, (g + 1) o_lora_rank)). The compressors and the indexer's projections stay bf16.
    bool v4 = false;
    ops::QuantWeight wq_a, wq_b, wkv, wo_b;
    std::vector<ops::QuantWeight> wo_a;
    // Indexed by expert id; only [expert_begin(), expert_end()) are set. Empty: bf16 experts (or a dense layer).
    std::vector<ops::QuantExpertWeights> experts;
    bool shared = false;  // shared expert quantized
    ops::QuantExpertWeights shared_expert;
    bool dense = false;  // dense MLP quantized
    ops::QuantExpertWeights dense_mlp;
  };

  // What the checkpoint's own quantized weights of one format (FP8 blocks, or MXFP4) became.
  struct SourceConversion {
    const runtime::WeightQuantRepresentation* repr = nullptr;  // their representation
    int64_t matrices = 0;       // quantized matrices made from them (row ranges of one weight: one each)
    uint64_t source_bytes = 0;  // their codes and scales in the file (a row range: its share)
    uint64_t bytes = 0;         // in the representation
    int64_t kept = 0;           // matrices holding the file's codes as they are (scales re-laid out)
    int64_t reencoded = 0;      // matrices re-encoded exactly (each e2m1 code as the e4m3 code of its value)
    // Matrices requantized from the fp32 values decoded from the codes, and over their elements the sums of
    // (q - v)^2 and v^2 (q: the representation's value, v: the file's): the measured error.
    int64_t requantized = 0;
    double err2 = 0, ref2 = 0;
    double rel_rms_error() const;  // sqrt(err2 / ref2), 0 without requantized elements
  };

  // Quantizes `checkpoint`'s weights into `repr` for the roles `layers` names (and `options` keeps): bf16
  // weights with ops::quantize_weight; FP8 block weights (Checkpoint::fp8_source) from their codes: into MXFP8
  // with the same codes when every block scale is a power of two (each scale repeated per 32 along K, exact),
  // else requantized from the decoded fp32 values; MXFP4 weights (Checkpoint::mxfp4_source) into
  // options.mxfp4_repr (else repr): MXFP4 keeps the file's codes (read in place) with the scales in the pair
  // layout, MXFP8 re-encodes each code exactly, W8A8 requantizes the decoded values.
  // Uses the kernel threads; the result does not depend on their number. Unimplemented when the build's
  // generation cannot run repr (quant_linear's message). Each matrix is quantized alone, so a share has
  // the bits of the same matrices quantized with the whole model. An expert range outside [0, experts)
  // is InvalidArgument. Kept MXFP4 codes are views into `checkpoint`, which must outlive the result.
  static Result<std::unique_ptr<QuantizedWeights>> quantize(const Checkpoint& checkpoint,
                                                            const runtime::WeightQuantRepresentation& repr,
                                                            const runtime::QuantizedLayers& layers,
                                                            const QuantizeOptions& options = {});

  const runtime::WeightQuantRepresentation& representation() const { return *repr_; }
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes of the quantized weights (data + scales; kept MXFP4 codes included, read in place), and of the bf16
  // weights they replace.
  uint64_t quantized_bytes() const { return quantized_bytes_; }
  uint64_t replaced_bf16_bytes() const { return replaced_bytes_; }
  int64_t num_matrices() const { return matrices_; }
  // Matrices converted from an FP8 block-scaled checkpoint's codes and scales (Checkpoint::fp8_source)
  // rather than from bf16 weights.
  int64_t num_from_fp8() const { return from_fp8_.matrices; }
  const SourceConversion& from_fp8() const { return from_fp8_; }
  // Matrices from the checkpoint's MXFP4 weights (Checkpoint::mxfp4_source).
  const SourceConversion& from_mxfp4() const { return from_mxfp4_; }
  double seconds() const { return seconds_; }
  // The share held: the attention side (when the contract quantizes any of it), and the routed experts
  // [expert_begin, expert_end) of every MoE layer (an empty range when the contract keeps them bf16 or
  // the share left them out).
  bool holds_attention_side() const { return attention_side_; }
  bool experts_quantized() const { return experts_role_; }  // the contract quantizes routed experts
  int64_t expert_begin() const { return expert_begin_; }
  int64_t expert_end() const { return expert_end_; }
  // "mxfp8 for <what> (<n> matrices: <q> MiB from <b> MiB bf16, quantized at load in <t> s)", then, when the
  // checkpoint held quantized weights, what they became: "; the checkpoint's FP8 blocks (<n> matrices, <s> MiB
  // in the file) -> mxfp8, <q> MiB: <n> exactly (the file's codes)" (or "<n> requantized from the decoded
  // values, relative RMS error <e>%"), likewise its MXFP4 blocks.
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
  // `w` from its MXFP4 source, into mxfp4_repr_.
  Result<ops::QuantWeight> from_mxfp4_source(const TensorView& w, const Checkpoint::Mxfp4Source& src);
  // An [N, K] weight of `r` in buffers this object owns; without `with_data` only its scales (kept codes).
  ops::QuantWeight allocate(const runtime::WeightQuantRepresentation& r, int64_t N, int64_t K, bool with_data = true);
  const runtime::WeightQuantRepresentation* repr_ = nullptr;
  const runtime::WeightQuantRepresentation* mxfp4_repr_ = nullptr;
  const Checkpoint* checkpoint_ = nullptr;
  SourceConversion from_fp8_, from_mxfp4_;
  bool attention_side_ = false, experts_role_ = false, share_ = false;
  int64_t expert_begin_ = 0, expert_end_ = 0, num_experts_ = 0;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
  uint64_t quantized_bytes_ = 0, replaced_bytes_ = 0;
  int64_t matrices_ = 0;
  double seconds_ = 0;
};

}  // namespace genbridge::model
