#pragma once
// Internal: binding a DeepSeek-V4 checkpoint's tensors (DeepSeek's names, no prefix: embed.weight,
// layers.L.attn.*, layers.L.ffn.*, hc_*, norm.weight, head.weight; docs/deepseek.md, "DeepSeek-V4 checkpoints").

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/checkpoint/checkpoint.h"

namespace genbridge::model::detail {

// How each kind of tensor is bound; every call checks presence and shape and names the file, the tensor and
// the rule. Arguments: the tensor's name, its shape, the shape in config terms, why the config needs it.
struct V4TensorBinder {
  // A weight converted to bf16 when bf16 weights are asked for (BF16 zero-copy, F16 / F32 converted); in the
  // FP8 + MXFP4 form, a quantized weight's exact bf16 dequantization (by deepseek_v4_weight_role, deepseek_v4_quant.h).
  std::function<Result<TensorView>(const std::string&, std::vector<int64_t>, std::string_view, std::string_view)> bind;
  // A tensor DeepSeek ships in F32 and genbridge keeps in F32 (never converted): the file must hold F32.
  std::function<Result<TensorView>(const std::string&, std::vector<int64_t>, std::string_view, std::string_view)>
      bind_f32;
  // An integer table (I64 or I32 in the file, bound as it is) whose every element must lie in [0, limit);
  // `limit_rule` names the limit in config terms ("n_routed_experts = 8").
  std::function<Result<TensorView>(const std::string&, std::vector<int64_t>, std::string_view, std::string_view,
                                   int64_t limit, std::string_view limit_rule)>
      bind_ids;
};

// Binds every DeepSeek-V4 weight into *w, in the order embed.weight, the layers, hc_head_*, norm.weight,
// head.weight (lm_head is embed_tokens when tie_word_embeddings).
Status bind_deepseek_v4_weights(const ModelConfig& c, const V4TensorBinder& b, ModelWeights* w);

// The tensors a DeepSeek-V4 checkpoint ships that genbridge does not use: the multi-token-prediction layers
// mtp.<i>.* for i < num_nextn_predict_layers. False for other models.
bool is_ignored_deepseek_v4_tensor(const ModelConfig& c, std::string_view name);

}  // namespace genbridge::model::detail
