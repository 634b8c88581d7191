#pragma once
// Internal: binding the DeepSeek-V3 / V3.2 tensors of one layer (MLA, indexer, DeepSeek MoE, dense MLP).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/checkpoint/checkpoint.h"

namespace genbridge::model::detail {

// Binds one tensor: (name, shape, shape rule in config terms, why the config needs it, keep the file dtype).
using TensorBindFn = std::function<Result<TensorView>(const std::string&, std::vector<int64_t>, std::string_view,
                                                      std::string_view, bool)>;

// Binds layer `layer`'s attention (MLA [+ indexer]) and MLP tensors into *lw (norms are bound by the caller).
Status bind_deepseek_layer(const ModelConfig& c, int64_t layer, const TensorBindFn& bind, LayerWeights* lw);

// Tensors a DeepSeek checkpoint may carry that the model does not use: the multi-token-prediction layers
// model.layers.[num_hidden_layers, num_hidden_layers + num_nextn_predict_layers).*. False for Qwen.
bool is_ignored_deepseek_tensor(const ModelConfig& c, std::string_view name);

}  // namespace genbridge::model::detail
