#pragma once
// ModelConfig: the Qwen3-MoE family (Hugging Face architecture Qwen3MoeForCausalLM), Qwen3.5-MoE
// (Qwen3_5MoeForConditionalGeneration / Qwen3_5MoeForCausalLM: Gated DeltaNet and gated full-attention layers,
// Gemma norms) and the DeepSeek-V3 / V3.2 family (DeepseekV3ForCausalLM, DeepseekV32ForCausalLM: MLA attention,
// DeepSeek routing, and for V3.2 the DSA lightning indexer) and DeepSeek-V4 (DeepseekV4ForCausalLM, DeepSeek's own
// keys; loaded, not yet run) as described by a config.json, validated once at load. Sizes are element counts;
// layer and expert indices start at 0.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"

namespace genbridge::model {

// The architecture names accepted in config.json's "architectures".
inline constexpr std::string_view kQwen3MoeArchitecture = "Qwen3MoeForCausalLM";
inline constexpr std::string_view kDeepseekV3Architecture = "DeepseekV3ForCausalLM";
inline constexpr std::string_view kDeepseekV32Architecture = "DeepseekV32ForCausalLM";
// Qwen3.5-MoE as the Hub ships it (the language model's keys under text_config, tensors under
// model.language_model.), and its text-only class (keys at the top level, tensors under model.).
inline constexpr std::string_view kQwen35MoeArchitecture = "Qwen3_5MoeForConditionalGeneration";
inline constexpr std::string_view kQwen35MoeTextArchitecture = "Qwen3_5MoeForCausalLM";
// DeepSeek-V4 as DeepSeek ships it (its own config keys and tensor names: embed, layers.L.attn.*, ffn.*,
// hc_*, head; docs/deepseek.md).
inline constexpr std::string_view kDeepseekV4Architecture = "DeepseekV4ForCausalLM";

enum class Architecture : uint8_t { kQwen3Moe, kDeepseekV3, kDeepseekV32, kQwen35Moe, kDeepseekV4 };
// The HF architecture name ("Qwen3MoeForCausalLM", ...).
std::string_view architecture_name(Architecture arch);

// rope_scaling {"type": "yarn", ...} as DeepSeek-V3 configures it (defaults are HF's).
struct YarnRopeScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  friend bool operator==(const YarnRopeScaling&, const YarnRopeScaling&) = default;
};

// The DeepSeek-V3 / V3.2 keys (runtime/checkpoint/deepseek_config.cpp parses and validates them).
struct DeepseekConfig {
  int64_t q_lora_rank = 0;  // 0 (absent or null): queries come from self_attn.q_proj directly
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_shared_experts = 0;  // shared experts' SwiGLU width: n_shared_experts * moe_intermediate_size
  int64_t n_group = 1;           // expert groups of the group-limited top-k
  int64_t topk_group = 1;        // groups a token may pick experts from
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;  // layers [0, first_k_dense_replace) are dense
  int64_t moe_layer_freq = 1;
  int64_t num_nextn_predict_layers = 0;  // multi-token-prediction layers: their tensors are ignored
  bool yarn = false;                     // rope_scaling is yarn (else plain RoPE)
  YarnRopeScaling rope_scaling;
  // DSA lightning indexer (DeepseekV32ForCausalLM only).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  friend bool operator==(const DeepseekConfig&, const DeepseekConfig&) = default;
};
// The Qwen3.5-MoE keys (runtime/checkpoint/qwen35_config.cpp parses and validates them).
struct Qwen35Config {
  // Per layer: true for a Gated DeltaNet (linear-attention) layer, false for a full-attention layer
  // (layer_types, or full_attention_interval: layer i is full iff (i + 1) % interval == 0).
  std::vector<bool> linear_layers;
  int64_t linear_num_key_heads = 0;    // nk
  int64_t linear_num_value_heads = 0;  // nv, a multiple of nk (grouped values)
  int64_t linear_key_head_dim = 0;     // dk
  int64_t linear_value_head_dim = 0;   // dv
  int64_t linear_conv_kernel_dim = 0;  // the causal conv1d's kernel K
  double partial_rotary_factor = 1.0;  // RoPE rotates the first head_dim * factor dims of each head
  std::vector<int64_t> mrope_section;  // M-RoPE sections (empty: none); text positions reduce it to 1-D RoPE
  bool mrope_interleaved = false;
  bool text_config = false;          // the keys were read from text_config (tensors under model.language_model.)
  int64_t mtp_num_hidden_layers = 0;  // multi-token-prediction layers: their mtp.* tensors are ignored

  int64_t key_dim() const { return linear_num_key_heads * linear_key_head_dim; }      // q and k widths
  int64_t value_dim() const { return linear_num_value_heads * linear_value_head_dim; }  // v and z widths
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }                      // in_proj_qkv's width
  friend bool operator==(const Qwen35Config&, const Qwen35Config&) = default;
};

// What a DeepSeek-V4 layer attends to besides its sliding window (compress_ratios[layer]).
enum class V4AttentionKind : uint8_t {
  kSlidingWindow,         // ratio 0: the last sliding_window tokens only
  kCompressedSparse,      // ratio 4 (CSA): + the lightning indexer's top-k of overlapping 4-token windows
  kHeavilyCompressed,     // ratio 128 (HCA): + every complete 128-token window
};

// How a DeepSeek-V4 checkpoint stores its routed experts (config.json's expert_dtype; docs/deepseek.md,
// "DeepSeek-V4 checkpoints"). kBf16: the bf16 form, no quantization_config. Otherwise the FP8 form
// (quantization_config present): the attention's and the shared experts' linears are F8_E4M3 in 128 x 128
// blocks, and the routed experts are MXFP4 (kFp4: two e2m1 per I8 byte, an E8M0 scale per 32 along K) or FP8
// blocks like the linears (kFp8: expert_dtype "fp8", or absent as DeepSeek's reference code reads it).
enum class V4ExpertDtype : uint8_t { kBf16, kFp8, kFp4 };

// The DeepSeek-V4 keys (runtime/checkpoint/deepseek_v4_config.cpp parses and validates them). The shared
// ones live in ModelConfig: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (1),
// head_dim (512), rms_norm_eps, rope_theta (the sliding-window layers' plain RoPE), vocab_size,
// num_experts (n_routed_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
// max_position_embeddings, tie_word_embeddings.
struct DeepseekV4Config {
  // compress_ratios as the file gives it (longer than num_hidden_layers: the tail is the MTP layers').
  // Entry l < num_hidden_layers is layer l's ratio: 0, 4 or 128 (what DeepSeek's code implements: overlap and the
  // indexer at 4, neither at 128); the tail entries are kept as read.
  std::vector<int64_t> compress_ratios;
  int64_t q_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;  // the trailing rope dims of each 512-wide head (interleaved pairs)
  int64_t o_groups = 0;          // grouped output projection: groups of heads
  int64_t o_lora_rank = 0;       // per group
  int64_t sliding_window = 0;    // every layer attends to its last sliding_window tokens (the query's included)
  double compress_rope_theta = 0;  // the compressed layers' RoPE base (with rope_scaling)
  bool yarn = false;               // rope_scaling is yarn (applies to the compressed layers' RoPE only)
  YarnRopeScaling rope_scaling;    // mscale does not scale cos/sin (attention factor 1)
  int64_t index_n_heads = 0;       // the lightning indexer of the compressed-sparse layers
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t n_shared_experts = 0;    // ungated shared expert of width n_shared_experts * moe_intermediate_size
  double routed_scaling_factor = 1.0;
  int64_t num_hash_layers = 0;     // layers [0, num_hash_layers) route by ffn.gate.tid2eid[token id]
  double swiglu_limit = 0;         // SwiGLU clamp: gate <= limit, -limit <= up <= limit (0: none)
  int64_t hc_mult = 0;             // residual streams (manifold-constrained hyper-connections)
  int64_t hc_sinkhorn_iters = 0;
  double hc_eps = 0;
  int64_t num_nextn_predict_layers = 0;  // MTP layers: their mtp.* tensors are ignored
  V4ExpertDtype expert_dtype = V4ExpertDtype::kBf16;  // not kBf16 iff config.json has a quantization_config

  // Whether the checkpoint is in DeepSeek's FP8 (+ MXFP4) form rather than the bf16 one.
  bool quantized() const { return expert_dtype != V4ExpertDtype::kBf16; }
  // The attention kind of layer `layer` (< num_hidden_layers).
  V4AttentionKind attention_kind(int64_t layer) const;
  int64_t compress_ratio(int64_t layer) const { return compress_ratios[static_cast<size_t>(layer)]; }
  friend bool operator==(const DeepseekV4Config&, const DeepseekV4Config&) = default;
};

// genbridge's extension key selecting the norm type of a Qwen3-MoE checkpoint: "rms" (default) or "gemma". A
// test-only knob (docs/models.md): it lets the Qwen3-MoE tests run the Gemma norm providers on a Qwen3-MoE
// layout; Qwen3.5-MoE uses Gemma norms as its own and refuses the key.
inline constexpr std::string_view kNormTypeKey = "genbridge_norm_type";

// rms: y = x * rstd * w.  gemma: y = x * rstd * (1 + w) (weights stored as offsets from 1).
// The choice applies to every norm of the model: input, post-attention, q/k per-head and final.
enum class NormType : uint8_t { kRms, kGemma };
// "rms" or "gemma".
std::string_view norm_type_name(NormType type);

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // absent in config.json: hidden_size / num_attention_heads (HF rule)
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  int64_t max_position_embeddings = 32768;
  int64_t num_experts = 0;  // 0: every layer is dense
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t intermediate_size = 0;  // dense layers' SwiGLU width; required only when a dense layer exists
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool tie_word_embeddings = false;
  int64_t shared_expert_intermediate_size = 0;  // 0: no shared expert (Qwen2-MoE style when > 0)
  DType torch_dtype = DType::kBF16;             // informational: the dtype the checkpoint was saved in
  NormType norm_type = NormType::kRms;
  Architecture architecture = Architecture::kQwen3Moe;
  // DeepSeek keys; meaningful when is_deepseek(). For DeepSeek, num_experts = n_routed_experts and
  // head_dim = qk_nope_head_dim + qk_rope_head_dim (the query/key head width of the non-absorbed form).
  DeepseekConfig deepseek;
  // Qwen3.5 keys; meaningful when is_qwen35() (norm_type is then kGemma, every layer MoE).
  Qwen35Config qwen35;
  // DeepSeek-V4 keys; meaningful when is_deepseek_v4() (every layer MoE, no dense layers).
  DeepseekV4Config dsv4;

  bool is_deepseek() const {
    return architecture == Architecture::kDeepseekV3 || architecture == Architecture::kDeepseekV32;
  }
  bool is_qwen35() const { return architecture == Architecture::kQwen35Moe; }
  bool is_deepseek_v4() const { return architecture == Architecture::kDeepseekV4; }
  // Layer `layer` is a Gated DeltaNet (linear-attention) layer (Qwen3.5 only).
  bool is_linear_layer(int64_t layer) const {
    return is_qwen35() && layer >= 0 && layer < static_cast<int64_t>(qwen35.linear_layers.size()) &&
           qwen35.linear_layers[static_cast<size_t>(layer)];
  }
  // Layers with a KV cache (every layer but the linear-attention ones).
  int64_t num_kv_layers() const;
  // Layers with recurrent state (the linear-attention ones).
  int64_t num_linear_layers() const { return num_hidden_layers - num_kv_layers(); }
  // The name prefix of the language model's tensors: "model." (or "model.language_model." for a Qwen3.5
  // checkpoint whose config nests the keys under text_config).
  std::string tensor_prefix() const { return qwen35.text_config ? "model.language_model." : "model."; }
  // q_proj's output width: q_size(), twice that with Qwen3.5's output gate ([q | gate] per head).
  int64_t q_proj_size() const { return is_qwen35() ? 2 * q_size() : q_size(); }
  // The dims RoPE rotates in each head (head_dim unless partial_rotary_factor says fewer; DeepSeek-V4: the
  // trailing qk_rope_head_dim).
  int64_t rotary_dim() const;
  // MLA attention with the DSA lightning indexer (V3.2).
  bool has_indexer() const { return architecture == Architecture::kDeepseekV32; }

  // Qwen (HF rule): MoE iff layer not in mlp_only_layers, num_experts > 0 and (layer + 1) % decoder_sparse_step == 0.
  // DeepSeek (HF rule): MoE iff num_experts > 0, layer >= first_k_dense_replace and layer % moe_layer_freq == 0.
  bool is_moe_layer(int64_t layer) const;
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  int64_t num_moe_layers() const;
  // num_attention_heads * head_dim (q_proj's output width, o_proj's input width).
  int64_t q_size() const { return num_attention_heads * head_dim; }
  // num_key_value_heads * head_dim (k_proj's and v_proj's output width).
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  // Query heads per key/value head.
  int64_t gqa_group() const { return num_attention_heads / num_key_value_heads; }

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Parses and validates config.json text. `source` names the file in messages. Errors are InvalidArgument
// "<source>: <key> = <value>: <rule>" (or "<source>: missing required key '<key>'", "<source>: malformed JSON: ...").
Result<ModelConfig> parse_model_config(std::string_view json_text, std::string_view source);
// Reads and parses the file at `path` (blocking file read).
Result<ModelConfig> load_model_config(const std::filesystem::path& path);
// The cross-key rules parse_model_config enforces, for configs built in code; `source` names the origin.
Status validate_model_config(const ModelConfig& config, std::string_view source);
// config.json text for `config` (HF keys plus genbridge_norm_type for Qwen); parse_model_config() of it
// returns `config`.
std::string to_config_json(const ModelConfig& config);

// The model as the run and serve logs describe it: architecture, layers, experts and routing, attention
// shape (MLA ranks, YaRN, the DSA indexer for DeepSeek), vocabulary ("48 layers (48 MoE: 128 experts,
// top-8), hidden 2048, heads 32/4 x 128, vocab 151936, rms norm").
std::string describe(const ModelConfig& config);

}  // namespace genbridge::model
