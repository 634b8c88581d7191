#pragma once
// Checkpoint: a model directory (config.json + safetensors) opened, validated and bound to typed weights.
// Every view is checked against the config for presence, shape and dtype once, at open; after that no
// code on the decode path touches files or looks names up.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "genbridge/core/formats.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/fp8_checkpoint.h"
#include "runtime/checkpoint/tensor_store.h"

namespace genbridge::model {

inline constexpr std::string_view kConfigFileName = "config.json";

// SwiGLU block weights, HF Linear layout [out, in]: y = (silu(x gate^T) * (x up^T)) down^T.
struct MlpWeights {
  TensorView gate_proj;  // [intermediate, hidden]
  TensorView up_proj;    // [intermediate, hidden]
  TensorView down_proj;  // [hidden, intermediate]
};

struct AttentionWeights {
  TensorView q_proj;  // [num_attention_heads * head_dim, hidden]; Qwen3.5: [heads * 2 * head_dim]: [q | gate] per head
  TensorView k_proj;  // [num_key_value_heads * head_dim, hidden]
  TensorView v_proj;  // [num_key_value_heads * head_dim, hidden]
  TensorView o_proj;  // [hidden, num_attention_heads * head_dim]
  TensorView q_norm;  // [head_dim], applied per head before RoPE
  TensorView k_norm;  // [head_dim]
};

// MLA (DeepSeek) attention weights, HF names under self_attn. Either q_lora (q_a_proj, q_a_layernorm,
// q_b_proj) or q_proj is bound, by config.deepseek.q_lora_rank. qk = qk_nope_head_dim + qk_rope_head_dim.
struct MlaWeights {
  TensorView q_a_proj;            // [q_lora_rank, hidden]
  TensorView q_a_layernorm;       // [q_lora_rank]
  TensorView q_b_proj;            // [heads * qk, q_lora_rank]
  TensorView q_proj;              // [heads * qk, hidden] when q_lora_rank == 0
  TensorView kv_a_proj_with_mqa;  // [kv_lora_rank + qk_rope_head_dim, hidden]: latent, then the shared rope key
  TensorView kv_a_layernorm;      // [kv_lora_rank]
  TensorView kv_b_proj;           // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]: per head k_nope, v
  TensorView o_proj;              // [hidden, heads * v_head_dim]
};

// DSA lightning indexer (DeepSeek-V3.2), HF names under self_attn.indexer.
struct IndexerWeights {
  TensorView wq_b;          // [index_n_heads * index_head_dim, q_lora_rank]
  TensorView wk;            // [index_head_dim, hidden]
  TensorView k_norm;        // [index_head_dim], LayerNorm weight
  TensorView k_norm_bias;   // [index_head_dim], LayerNorm bias
  TensorView weights_proj;  // [index_n_heads, hidden]
};

struct MoeWeights {
  TensorView router;                // mlp.gate.weight [num_experts, hidden]
  std::vector<MlpWeights> experts;  // num_experts entries, each [moe_intermediate, hidden] / [hidden, moe_intermediate]
  // Present iff config.has_shared_expert(): width shared_expert_intermediate_size, gated by
  // sigmoid(x shared_expert_gate^T) with shared_expert_gate [1, hidden].
  // DeepSeek: mlp.shared_experts.* (width n_shared_experts * moe_intermediate_size, ungated) is bound here
  // when n_shared_experts > 0, and shared_expert_gate stays empty.
  MlpWeights shared_expert;
  TensorView shared_expert_gate;
  // DeepSeek: mlp.gate.e_score_correction_bias [num_experts], added to the sigmoid scores for selection
  // only. Kept in its file dtype (not converted to bf16): it decides near-ties between experts.
  TensorView e_score_correction_bias;
};

// A Gated DeltaNet layer (Qwen3.5 linear attention), HF names under linear_attn. Kd = nk * dk, Vd = nv * dv.
struct LinearAttentionWeights {
  TensorView in_proj_qkv;  // [2 Kd + Vd, hidden]: q, k, v contiguous, head-major within each
  TensorView in_proj_z;    // [Vd, hidden]: the output gate
  TensorView in_proj_b;    // [nv, hidden]: beta = sigmoid(b)
  TensorView in_proj_a;    // [nv, hidden]: the decay's input
  TensorView conv1d;       // conv1d.weight [2 Kd + Vd, 1, K] viewed as [2 Kd + Vd, K]
  TensorView dt_bias;      // [nv]     } kept in the file's dtype when it is F32 (official checkpoints
  TensorView A_log;        // [nv]     } store A_log and norm.weight as F32): they shape every decay
  TensorView norm;         // [dv]: the gated RMSNorm's plain weight
  TensorView out_proj;     // [hidden, Vd]
};

// DeepSeek-V4 (DeepSeek's tensor names). D = head_dim (512), n = hc_mult.
// One site of manifold-constrained hyper-connections (layers.L.hc_attn_* / hc_ffn_*), fp32 in the file and
// kept fp32: fn [(2 + n) n, n hidden], base [(2 + n) n], scale [3] (pre, post, comb).
struct HyperConnectionWeights {
  TensorView fn;
  TensorView base;
  TensorView scale;
};

// A compressor (attn.compressor.* or attn.indexer.compressor.*): coff = 2 with overlap (ratio 4), else 1;
// W = D for the attention's, index_head_dim for the indexer's.
struct V4CompressorWeights {
  TensorView wkv;    // [coff W, hidden] bf16
  TensorView wgate;  // [coff W, hidden] bf16
  TensorView ape;    // [ratio, coff W], kept F32 (the learned position bias)
  TensorView norm;   // [W]
};

// DeepSeek-V4 attention, layers.L.attn.*.
struct V4AttentionWeights {
  TensorView wq_a;       // [q_lora_rank, hidden]
  TensorView q_norm;     // [q_lora_rank]
  TensorView wq_b;       // [heads * D, q_lora_rank]
  TensorView wkv;        // [D, hidden]: the one shared K = V head
  TensorView kv_norm;    // [D]
  TensorView wo_a;       // [o_groups * o_lora_rank, heads * D / o_groups]: group g's rows [g o_lora, (g+1) o_lora)
  TensorView wo_b;       // [hidden, o_groups * o_lora_rank]
  TensorView attn_sink;  // [heads], kept F32
  V4CompressorWeights compressor;  // compress ratio > 0
  // The lightning indexer (compress ratio 4).
  TensorView index_wq_b;          // attn.indexer.wq_b [index_n_heads * index_head_dim, q_lora_rank]
  TensorView index_weights_proj;  // attn.indexer.weights_proj [index_n_heads, hidden]
  V4CompressorWeights index_compressor;
};

struct LayerWeights {
  TensorView input_layernorm;           // [hidden]
  TensorView post_attention_layernorm;  // [hidden]
  AttentionWeights attn;  // Qwen (full-attention layers)
  bool linear = false;           // Qwen3.5: a Gated DeltaNet layer (linear_attn) instead of self_attn
  LinearAttentionWeights gdn;    // when linear
  MlaWeights mla;         // DeepSeek
  IndexerWeights indexer;  // DeepSeek-V3.2
  // DeepSeek-V4: attn_norm / ffn_norm are bound as input_layernorm / post_attention_layernorm, the routed
  // experts' w1 / w3 / w2 as gate_proj / up_proj / down_proj, ffn.gate.weight as moe.router, ffn.gate.bias
  // as moe.e_score_correction_bias (kept F32), ffn.shared_experts.* as moe.shared_expert.
  V4AttentionWeights v4;
  HyperConnectionWeights hc_attn, hc_ffn;
  // hash-routed layers (< num_hash_layers): ffn.gate.tid2eid [vocab, num_experts_per_tok], I64 or I32 as in the file
  // (DeepSeek ships I64), every id checked at open to lie in [0, n_routed_experts); the layer then has no
  // ffn.gate.bias (moe.e_score_correction_bias stays empty).
  TensorView tid2eid;
  bool is_moe = false;
  MoeWeights moe;    // when is_moe
  MlpWeights dense;  // when !is_moe: [intermediate_size, hidden] / [hidden, intermediate_size]
};

// Views of every weight, in the layout of the HF tensors. Read-only: views into mapped files must never
// be written through. Valid while the owning Checkpoint is alive.
struct ModelWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  TensorView final_norm;  // model.norm.weight [hidden]
  TensorView lm_head;     // [vocab, hidden]; the same view as embed_tokens when tie_word_embeddings
  // DeepSeek-V4: the head's stream collapse (hc_head_fn [n, n hidden], hc_head_base [n], hc_head_scale [1],
  // kept F32); embed.weight, norm.weight and head.weight are bound as embed_tokens, final_norm and lm_head.
  HyperConnectionWeights hc_head;
};

// What dtype the bound views have.
enum class WeightPrecision : uint8_t {
  // Every weight in bf16 (what the kernels take): BF16 tensors are zero-copy views into the mapped files;
  // F16 and F32 tensors are converted at open (round to nearest even) into buffers the Checkpoint owns.
  kBF16,
  // Each view keeps its file dtype (BF16, F16 or F32), all zero-copy: for exact-value readers such as
  // the fp64 reference forward pass.
  kNative,
};

struct LoadOptions {
  WeightPrecision precision = WeightPrecision::kBF16;
  bool populate = true;  // read every mapped page at open so the decode loop never waits on disk
  // false: read every file into memory the Checkpoint owns instead of mapping it (MapOptions::use_mmap).
  // For files that may change during the run: truncating a mapped file kills the process with SIGBUS.
  bool use_mmap = true;
};

// What Checkpoint::check_finite read.
struct WeightScan {
  uint64_t bytes = 0;   // weight bytes read
  int64_t tensors = 0;  // tensors read
  double seconds = 0;   // wall time of the scan
};

class Checkpoint {
 public:
  // Opens `dir`: parses dir/config.json, maps (or reads, LoadOptions::use_mmap) the safetensors (single or
  // sharded), binds every tensor the config requires and checks its shape and dtype. Every file must be a
  // regular file (after symbolic links); anything else is refused without blocking. Errors (InvalidArgument) name the
  // file, the tensor and the rule; a tensor the model does not use is also an error (it means config and weights
  // disagree), except lm_head.weight in a tied model, which is ignored. Blocking file I/O.
  static Result<Checkpoint> open(const std::filesystem::path& dir, const LoadOptions& options = {});
  // Tensors the checkpoint ships that text serving does not read (Qwen3.5's model.visual.* and mtp.*,
  // DeepSeek-V4's mtp.<i>.* for i < num_nextn_predict_layers), for the log to say once; 0 for other models.
  int64_t ignored_tensors() const { return ignored_tensors_; }

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const TensorStore& store() const { return *store_; }
  WeightPrecision precision() const { return precision_; }
  // Bytes of weights the model uses that live in the mapped files (zero-copy).
  uint64_t mapped_weight_bytes() const { return mapped_weight_bytes_; }
  // Bytes of bf16 buffers made at open: F16/F32 tensors converted (kBF16 only), FP8 / MXFP4 weights dequantized
  // (both precisions); 0 for a bf16 checkpoint.
  uint64_t converted_weight_bytes() const { return converted_weight_bytes_; }
  // Reads every weight the model uses, as bound (after any conversion to bf16), and returns InvalidArgument
  // naming the first NaN, +Inf or -Inf in binding order (embedding, layers in order, final norm, LM head):
  // file, tensor, flat index and value (float weights only: DeepSeek-V4's integer tid2eid tables are
  // range-checked at open instead). Fills `*scan` (when given) either way. Uses the kernel threads;
  // the result does not depend on their number. Blocks while it reads (pages of a lazily mapped file
  // are read from disk).
  Status check_finite(WeightScan* scan = nullptr) const;

  // An F8_E4M3 weight of an FP8 block-scaled checkpoint, as in the file (the bound view is its bf16
  // dequantization): --weight-quant converts from these codes and scales directly (quant_weights.h).
  struct Fp8Source {
    TensorView codes;  // fp8 e4m3fn [N, K], mapped
    // [ceil(N / bn), ceil(K / bk)], mapped: Hugging Face's "X_scale_inv", F32 or BF16, or (config.deepseek_v4_scales)
    // DeepSeek-V4's "X.scale", E8M0 (2^(byte - 127)) or F32, every one a power of two.
    TensorView scale_inv;
    Fp8BlockQuantConfig config;
    std::string file, name;
  };
  // The FP8 source of the bound weight view `w` (by its data pointer), or nullptr (a bf16/F16/F32 tensor).
  const Fp8Source* fp8_source(const TensorView& w) const;

  // A routed expert of DeepSeek-V4's MXFP4 form (expert_dtype "fp4"), as in the file; the bound view is its
  // exact bf16 dequantization. For running the generation's native MXFP4 kernels from the file's own codes.
  struct Mxfp4Source {
    TensorView codes;   // fp4 e2m1 x2 [N, K / 2], mapped: element 2j in the low nibble of byte j, 2j + 1 in the high
    TensorView scales;  // e8m0 [N, K / 32], mapped, in the file's row-major layout (no generation's pair layout)
    std::string file, name;
  };
  // The MXFP4 source of the bound weight view `w` (by its data pointer), or nullptr.
  const Mxfp4Source* mxfp4_source(const TensorView& w) const;

  // The weights bound as the bf16 dequantization of the checkpoint's quantized form (those with an Fp8Source or
  // an Mxfp4Source), for the log to say what ran in their place.
  struct QuantizedForm {
    int64_t fp8 = 0, mxfp4 = 0;  // weights
    uint64_t file_bytes = 0;     // their codes and scales in the file
    uint64_t bf16_bytes = 0;     // their bf16 dequantizations
    // Every dequantization is exact (DeepSeek-V4's power-of-two scales; Hugging Face's FP8 rounds once to bf16).
    bool exact = true;
  };
  QuantizedForm quantized_form() const;

 private:
  Checkpoint() = default;
  friend class WeightBinder;
  std::filesystem::path dir_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  std::vector<std::unique_ptr<bf16_t[]>> converted_;  // owned bf16 copies; heap buffers never move
  // Every bound view with its name, in binding order (for check_finite).
  struct BoundTensor {
    std::string name;
    std::string file;
    TensorView view;
    bool converted = false;  // an owned bf16 copy of an F16/F32 tensor
  };
  std::vector<BoundTensor> bound_;
  std::unordered_map<const void*, Fp8Source> fp8_sources_;  // by the bound bf16 view's data pointer
  std::unordered_map<const void*, Mxfp4Source> mxfp4_sources_;  // likewise
  ModelWeights weights_;
  WeightPrecision precision_ = WeightPrecision::kBF16;
  uint64_t mapped_weight_bytes_ = 0;
  uint64_t converted_weight_bytes_ = 0;
  int64_t ignored_tensors_ = 0;
};

// The HF names: "model.layers.3.mlp.experts.7.down_proj.weight" etc. (`prefix`: ModelConfig::tensor_prefix()).
std::string layer_tensor_name(int64_t layer, std::string_view suffix, std::string_view prefix = "model.");
std::string expert_tensor_name(int64_t layer, int64_t expert, std::string_view proj);

}  // namespace genbridge::model
