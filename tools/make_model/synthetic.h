#pragma once
// Synthetic checkpoints: a real config.json + safetensors directory with weights drawn from a fixed-seed
// generator, so tests and the default run need no downloaded weights. The same preset (or config), seed,
// shard count and dtype give byte-identical files on every machine and thread count: values come from a
// counter-based integer generator and exact IEEE arithmetic (no libm, no std:: distributions).
//
// Weight scales (uniform distributions with the stated standard deviation) keep activations O(1) through
// many pre-norm layers and give non-degenerate attention, routing and logits:
//   projections (q/k/v/o, experts, dense MLP, shared expert, shared_expert_gate): std 1/sqrt(fan_in)
//   router (mlp.gate): std 2/sqrt(hidden) -- router logits of std ~2: peaked but spread routing (tiny: mean
//     top-1 probability ~0.6 of 8 experts; small: ~0.35 of 32). Scaling the router does not make near-ties
//     rarer relative to rounding error (both scale with it); compare routing using the reference's margins.
//   norms (input, post-attention, q/k, final): 1 + U(-0.1, 0.1) for rms; U(-0.1, 0.1) for gemma (1+w)
//   embed_tokens: std 1 when untied; std 1/sqrt(hidden) when tied (it is also the LM head)
//   lm_head: std 1/sqrt(hidden) -- logits of std ~1

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "runtime/checkpoint/config.h"

namespace genbridge::model {

// The preset names, in order: "tiny" (unit tests), "tiny-gemma" (gemma norm, tied embeddings, sparse step 2),
// "small" (benchmarks; ~0.84 GB in bf16), and the DeepSeek family: "tiny-dsa" (V3.2: MLA + DSA indexer with
// index_topk 64, q_lora, YaRN, grouped routing, a shared expert, a dense first layer), "tiny-dsv3" (the same
// without the indexer), "tiny-dsv3-noq" (V3 without q_lora and YaRN, ungrouped routing, every layer MoE),
// "small-dsa" (V3.2 at DeepSeek's MLA widths, for benchmarks), and Qwen3.5-MoE: "tiny-qwen35" (the Hub's
// layout: text_config, model.language_model.*, fused experts, plus model.visual.* and mtp.* tensors serving
// ignores), "tiny-qwen35-split" (Qwen3_5MoeForCausalLM, one tensor per expert), "small-qwen35" (sized like small),
// and DeepSeek-V4 as DeepSeek ships its bf16 parts: "tiny-dsv4" (compress_ratios [0, 4, 128, 4], heads of 512 over
// one KV head, indexer 4 x 128 top-16, a hash-routed first layer, 4 hyper-connection streams, an MTP layer the
// loader ignores) and "small-dsv4" (sized like small). Their scales and dtypes are explained at
// plan_deepseek_v4 in synthetic.cpp.
// Qwen3.5 weights: as above (norms are Gemma's), plus conv1d std 1/sqrt(K), dt_bias 1 +- 0.2, A_log
// U(-2.3, 0.7) (F32, as the Hub stores it), linear_attn.norm.weight 1 + U(-0.1, 0.1) (F32). A config nesting
// text_config gets fused experts; a top-level one gets one tensor per expert.
// DeepSeek weights: as above, plus e_score_correction_bias std 0.05 and the indexer's LayerNorm bias
// U(-0.1, 0.1); q_a_layernorm, kv_a_layernorm and the indexer's k_norm weight 1 + U(-0.1, 0.1).
std::vector<std::string> synthetic_preset_names();
// The config of a preset (InvalidArgument listing the presets for an unknown name).
Result<ModelConfig> synthetic_preset_config(std::string_view preset);

// Writes config.json and model.safetensors (shards == 1) or `shards` files
// model-0000x-of-0000y.safetensors plus model.safetensors.index.json into `out_dir` (created if needed).
// Checkpoint files already in out_dir (config.json, model*.safetensors, the index) are replaced; config.json
// is written last, each file through a temporary name and a rename. Blocking file I/O; uses num_threads().
// `router_skew` S in 0..kMaxRouterSkew (0: none) biases every MoE layer's routing: its experts ranked by a
// seeded hash, the expert of rank r gets about S / (r + 1) added to its router logit (Qwen: through a constant
// embedding feature; DeepSeek: in the router's selection bias), so a few experts take most tokens, as measured
// in served models. The metadata records it ("genbridge_router_skew").
inline constexpr double kMaxRouterSkew = 100.0;
Status write_synthetic_checkpoint(std::string_view preset, uint64_t seed, const std::filesystem::path& out_dir,
                                  int shards = 1, double router_skew = 0.0);
// The same for any valid config; `dtype` (BF16, F16 or F32) is the tensors' dtype and config.json's torch_dtype.
Status write_synthetic_checkpoint(const ModelConfig& config, uint64_t seed, const std::filesystem::path& out_dir,
                                  int shards = 1, DType dtype = DType::kBF16, double router_skew = 0.0);

// Bytes of weights a config has in `dtype` (what write_synthetic_checkpoint writes, without headers).
uint64_t model_weight_bytes(const ModelConfig& config, DType dtype = DType::kBF16);

}  // namespace genbridge::model
