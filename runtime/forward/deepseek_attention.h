#pragma once
// MlaAttention: DeepSeek-V3 / V3.2 attention for the model runner, built from stable operators and the
// DeviceOperator's MLA / DSA adapters. Prefill and decode both run the absorbed form: W_UK (kv_b_proj's
// key rows) is folded into each head's query, attention runs over the paged latent + rope rows
// (mla_attention, or index_topk + sparse_attention for V3.2), and W_UV (kv_b_proj's value rows) is applied
// to each head's latent output before o_proj. Never asks which generation it runs on.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::model {

// The KV cache dimensions of a model: GQA K/V rows (Qwen) or MLA latent rows plus, for V3.2, indexer keys.
runtime::KvModelShape kv_model_shape(const ModelConfig& c);

// kv_b_proj [heads * (nope + v), kv_lora_rank] as the absorbed form reads it, per head h:
// W_UK[h]^T [kv_lora_rank, qk_nope_head_dim] written into `out` (row-major), and W_UV[h] [v_head_dim,
// kv_lora_rank], a view of kv_b's value rows.
void mla_w_uk_t(const TensorView& kv_b, const DeepseekConfig& d, int64_t head, bf16_t* out);
TensorView mla_w_uv(const TensorView& kv_b, const DeepseekConfig& d, int64_t head);

class QuantizedWeights;

class MlaAttention {
 public:
  // Binds to a DeepSeek checkpoint (bf16 weights), the DeviceOperator and a pool sized by
  // dev.kv_page_geometry(kv_model_shape(config)). Checks the model's dimensions against the MLA / indexer
  // representations in force (dev.check_kv_shape). The references must outlive the object.
  // With `quantized` (optional, must outlive the object), layers whose MLA projections it holds run them
  // with quant_linear (and keep no bf16 W_UK^T copy).
  static Result<std::unique_ptr<MlaAttention>> create(const Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                                      const runtime::KvPagePool& pool,
                                                      const QuantizedWeights* quantized = nullptr);

  // Per-micro-batch workspace (planned for up to max_tokens tokens).
  struct Scratch;
  std::shared_ptr<Scratch> make_scratch(int64_t max_tokens) const;

  // Layer `layer`'s attention for the T tokens of a micro-batch: h bf16 [T, hidden] (after the input norm),
  // their positions and KV slots, the batch's block tables / context lengths / query starts; writes the new
  // tokens' MLA rows (and indexer keys), then out bf16 [T, hidden] = o_proj(attention).
  Status forward(Scratch& scratch, int64_t layer, const TensorView& h, std::span<const int32_t> positions,
                 std::span<const int64_t> slots, const runtime::AttentionBatch& batch, const TensorView& out) const;
  // V3.2: the indexer's selection of layer `layer` in the last forward with this scratch, int32
  // [num_tokens, index_topk] in the DeviceOperator's top-k index contract; empty for V3 models.
  TensorView index_selection(const Scratch& scratch, int64_t layer, int64_t num_tokens) const;

 private:
  bool quantized_mla(int64_t layer) const;  // the quantized weights hold this layer's MLA projections
  MlaAttention(const Checkpoint& c, const runtime::DeviceOperator& d) : config_(c.config()), w_(c.weights()), dev_(d) {}
  const ModelConfig& config_;
  const ModelWeights& w_;
  const runtime::DeviceOperator& dev_;
  const QuantizedWeights* quantized_ = nullptr;
  std::vector<ops::MlaKvCache> kv_;
  std::vector<ops::IndexerKeyCache> index_keys_;
  // Per layer and head: W_UK^T [kv_lora_rank, qk_nope_head_dim] (bf16, Linear layout) so that
  // q_latent = linear(q_nope, W_UK^T). Empty for a layer whose MLA projections are quantized.
  std::vector<std::vector<std::unique_ptr<bf16_t[]>>> w_uk_t_;
  std::vector<double> inv_freq_;
  float softmax_scale_ = 1.0f;
  float index_weight_scale_ = 1.0f;
};

}  // namespace genbridge::model
