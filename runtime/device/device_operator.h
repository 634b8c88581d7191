#pragma once
// DeviceOperator: the single place that knows the runtime-visible differences of a hardware generation
// (docs/design.md#ownership-rule, #deviceoperator-contract). It is a small immutable contract per generation plus thin
// adapters that turn the engine's semantic requests into calls of the stable operators for the KV representation in
// force. It does not enable features (whether KV is quantized is configuration), own memory (the KV page pool does) or
// choose algorithms (the stable operators do).
//
// How the engine uses it:
//   1. Once at start-up:
//        GB_ASSIGN_OR_RETURN(auto dev, DeviceOperator::create({.soc = flag_or_env, .kv_cache_dtype = "auto"}));
//        log(dev.log_line());                       // one line: the contract in force
//        const KvModelShape shape{num_layers, num_kv_heads, head_dim};
//        auto geometry = dev.kv_page_geometry(shape);
//        GB_ASSIGN_OR_RETURN(auto pool, KvPagePool::create_for_budget(geometry, kv_bytes));
//        for each layer l: views[l] = dev.kv_layer_view(pool, shape, l).value();  // stable for the pool's life
//   2. Per step, with the pool's flat slots and block tables:
//        ops::rope(positions, q, k, rope_theta);      // stable op, the same on every generation
//        dev.write_kv(views[l], k, v, slots);         // "write these K/V rows to these slots"
//        dev.attention(q, views[l], batch, scale, out);  // "attention for these sequences"
// Only runtime/device/ may name a generation; the engine never branches on one.

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/kv_format.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "runtime/device/soc.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::runtime {

enum class MxScaleLayout {
  kNone,  // the generation has no MX formats
  kPair,  // e8m0 scales as [..., ceil(ceil(K/32)/2), 2]
};

// ---- Quantized weights -------------------------------------------------------------------
// How a weight scheme represents a matrix [N, K]: data the runtime allocates at load, the matmuls
// (linear/quant_linear, moe/quant_expert_ffn) consume and the pool of weight bytes is sized from.
enum class WeightScaleGranularity {
  kPerOutputChannel,  // one scale per weight row (output channel)
  kPerBlockAlongK,    // one scale per `block_k` consecutive elements of a weight row
};
enum class ActivationQuant {
  kNone,          // activations enter the matmul as fp32 (widened from the model dtype)
  kPerTokenInt8,  // int8 per token, dynamically (quant/dynamic_quant_per_token)
  // fp8 e4m3fn with one e8m0 scale per 32 elements in the pair layout, dynamically (quant/dynamic_mx_quant,
  // MxScaleAlg::kCeil: no element saturates). The quantized MoE dispatch's only (no matmul takes it).
  kMxfp8,
};
struct WeightQuantRepresentation {
  ops::WeightQuantScheme scheme;
  DType weight_element;  // int8 / fp8 e4m3fn / fp4 e2m1 (two per byte)
  DType scale_dtype;     // fp32 / e8m0
  WeightScaleGranularity granularity;
  int64_t block_k;             // elements per scale along K (kPerBlockAlongK), else 0
  MxScaleLayout scale_layout;  // kNone: scale [N]; kPair: [N, ceil(ceil(K / block_k) / 2), 2]
  ActivationQuant activations;
};
// The roles a scheme quantizes; the others stay in the checkpoint's dtype (bf16).
struct QuantizedLayers {
  // GQA: q/k/v/o. MLA (DeepSeek): q_a/q_b (or q), kv_a_proj_with_mqa, kv_b (as the absorbed form reads it:
  // W_UK^T [kv_lora_rank, qk_nope_head_dim] and W_UV [v_head_dim, kv_lora_rank] per head) and o.
  bool attention_projections;
  bool experts;         // routed experts' gate/up/down
  bool shared_experts;  // shared experts and dense MLPs
  bool router;
  bool lm_head;
  bool indexer_projections;  // DSA lightning indexer: wq_b, wk, weights_proj
};
struct WeightQuantContract {
  ops::WeightQuantScheme preferred;                    // what --weight-quant=auto selects
  std::array<WeightQuantRepresentation, 3> offered{};  // the schemes this generation runs, first num_offered
  int num_offered = 0;
  QuantizedLayers layers;

  // The representation of `s`, or nullptr when the generation does not offer it.
  constexpr const WeightQuantRepresentation* find(ops::WeightQuantScheme s) const {
    for (int i = 0; i < num_offered; ++i) {
      if (offered[i].scheme == s) return &offered[i];
    }
    return nullptr;
  }
};
// Bytes of a [N, K] weight in representation `r` (data + scales).
int64_t quant_weight_bytes(const WeightQuantRepresentation& r, int64_t n, int64_t k);
// ---- end quantized weights ---------------------------------------------------------------------------

// ---- Quantized MoE dispatch (DeviceConfig::moe_dispatch = "quantized") --------------------------------
// How the routed experts' input (the MoE layer's normed hidden states, bf16 [T, H]) is represented when the
// MoE dispatch is quantized: what travels from the attention ranks to the FFN ranks under AFD, and what the
// monolithic engine's routed experts compute from, so that both see the same codes
// (docs/afd.md#quantized-dispatch). One row of bytes per token (runtime/device/moe_dispatch.h): the H codes,
// zero padding up to a multiple of 4 bytes, then the row's scales, zero padding up to a multiple of 4 bytes.
struct DispatchRepresentation {
  ActivationQuant activations;  // kPerTokenInt8 or kMxfp8; kNone: the generation has no quantized dispatch
  DType element;                // int8 / fp8 e4m3fn
  DType scale_dtype;            // fp32 / e8m0
  int64_t block;                // elements per scale: 0 = the whole row (one scale), else 32
  MxScaleLayout scale_layout;   // kNone: one scale; kPair: [ceil(ceil(H / block) / 2), 2]
};
// ---- end quantized MoE dispatch ---------------------------------------------------------------------

// ---- Linear-attention state (Qwen3.5 Gated DeltaNet) ----------------------------------------------------
// How a generation keeps a sequence's linear-attention state in a state slot (KvPagePool's state pool): one
// canonical layout, which linear_attention/causal_conv1d and gated_delta_rule assert at every call (they
// refuse any other shape, dtype or stride: a layout silently changed between prefill and decode kernels is
// this model family's known failure).
//   conv:      [slots, K - 1, channels] conv_dtype, time-major (oldest input row first), channels = 2 nk dk + nv dv
//   recurrent: [slots, nv, dk, dv] recurrent_dtype, key-major (S[i][c] at i * dv + c)
struct LinearStateFormat {
  DType conv_dtype;       // the pre-conv inputs are the bf16 in_proj_qkv outputs: bf16 keeps them exactly
  DType recurrent_dtype;  // fp32: the recurrence accumulates over the whole context
  friend constexpr bool operator==(const LinearStateFormat&, const LinearStateFormat&) = default;
};
// The state regions (KvPagePool's StateSlotGeometry) of a linear-attention layer.
inline constexpr int kConvRegion = 0;
inline constexpr int kRecurrentRegion = 1;
// One linear-attention layer's state in a pool, typed (views only: the pool owns the bytes).
struct LinearStateCache {
  TensorView conv;       // [slots, K - 1, channels]
  TensorView recurrent;  // [slots, nv, dk, dv]
};
// ---- end linear-attention state ---------------------------------------------------------------------------

// The runtime-visible contract of one generation (docs/design.md#deviceoperator-contract). Immutable data; compare two
// contracts' fields to see every difference the runtime has to know. Element types, scale types, scale placement and
// row bytes of each representation come from the one table in genbridge/ops/kv_cache/kv_format.h.
struct GenerationContract {
  Generation generation;
  ops::KvCacheFormat quantized_kv;  // the GQA representation kv_cache_dtype=quantized selects
  ops::SlotMapping slot_mapping;    // what the generation's KV writers take
  int64_t kv_page_size;             // tokens per KV page
  MxScaleLayout mx_scale_layout;

  // ---- MLA + DSA: MLA KV, indexer keys, top-k index contract ----
  ops::MlaKvFormat quantized_mla_kv;   // the MLA representation kv_cache_dtype=quantized selects
  ops::IndexerKeyFormat indexer_keys;  // the DSA indexer key cache (whatever kv_cache_dtype says)
  ops::TopkIndexFormat topk_indices;   // what the indexer hands sparse attention
  // ---- end MLA + DSA ----

  // ---- DeepSeek-V4: the shared K = V rows of the sliding window and the compressed entries ----
  ops::MlaKvFormat quantized_sharedkv;  // the representation kv_cache_dtype=quantized selects (bf16 otherwise)
  // ---- end DeepSeek-V4 ----

  WeightQuantContract weight_quant;           // quantized weight representations
  LinearStateFormat linear_state;             // linear-attention state slots
  DispatchRepresentation quantized_dispatch;  // the representation moe_dispatch=quantized selects
};

// The contract of generation `g`.
const GenerationContract& contract_for(Generation g);

// Bytes of one (token, kv head) row of K (or V) in representation `f` at head_dim `d`, scale packed in
// the row included: bf16 2d, int8 d, fp8 d + 4 (ops::gqa_kv_row_bytes(f, d).main).
int64_t kv_row_bytes(ops::KvCacheFormat f, int64_t head_dim);
// Bytes of one (token, kv head) entry of each separate scale cache: int8 2 (fp16), otherwise 0.
int64_t kv_side_bytes(ops::KvCacheFormat f);

// Resolves the configured kv_cache_dtype for a generation: "auto" and "bf16" keep bf16 KV (the model's
// dtype); "quantized" selects the generation's quantized representation; the explicit element names
// "int8" and "fp8" are accepted only by the generation whose quantized representation they name.
// InvalidArgument naming the generation, what it offers and the accepted values otherwise.
Result<ops::KvCacheFormat> resolve_kv_cache_dtype(const GenerationContract& contract, std::string_view kv_cache_dtype);

// Resolves --weight-quant for a generation: "none" gives nullptr (bf16 weights), "auto" the generation's
// preferred representation, "w8a8" / "mxfp8" / "mxfp4" that one when the generation offers it.
// InvalidArgument naming the generation and what it offers otherwise.
Result<const WeightQuantRepresentation*> resolve_weight_quant(const GenerationContract& contract,
                                                              std::string_view weight_quant);
// The representation a checkpoint's MXFP4 weights (DeepSeek-V4's routed experts, e2m1 codes with an E8M0 scale per
// 32 along K) take under --weight-quant `weight_quant`: with "auto", mxfp4 where the generation offers it (the
// file's codes run as they are, docs/quant_weights.md), else what resolve_weight_quant gives; with any other value,
// what resolve_weight_quant gives (the scheme asked for applies to every quantized weight). Its errors.
Result<const WeightQuantRepresentation*> resolve_mxfp4_weight_quant(const GenerationContract& contract,
                                                                    std::string_view weight_quant);

// Resolves the configured moe_dispatch for a generation: "bf16" gives nullptr (the routed experts' input stays
// bf16), "quantized" the generation's quantized_dispatch. InvalidArgument naming the generation and the
// accepted values otherwise, and for "quantized" on a generation without a quantized dispatch representation.
Result<const DispatchRepresentation*> resolve_moe_dispatch(const GenerationContract& contract,
                                                           std::string_view moe_dispatch);

// The start-up check (pure): the build's SoC against the configured selector (empty: none) and the
// SoC detected on the machine (nullopt: no npu-smi). InvalidArgument naming both sides on a mismatch.
Status check_soc(const SocInfo& build, std::string_view selector, const std::optional<SocInfo>& detected);

struct DeviceConfig {
  std::string soc;                      // SoC selector from --soc / GENBRIDGE_SOC; empty = not configured
  std::string kv_cache_dtype = "auto";  // auto | bf16 | quantized (or the generation's own int8 / fp8)
  std::optional<std::string> path_env;  // where to look for npu-smi; nullopt = $PATH
  std::string weight_quant = "none";    // none | auto | w8a8 | mxfp8 | mxfp4
  std::string moe_dispatch = "bf16";    // bf16 | quantized (the routed experts' input; AFD's dispatch)

  // The environment variable naming the SoC when no selector is given on the command line.
  static constexpr std::string_view kSocEnv = "GENBRIDGE_SOC";
  // The configuration of a command line: soc = `soc_flag` when non-empty, else GENBRIDGE_SOC (the one
  // place the process reads it; unset or empty = not configured).
  static DeviceConfig from_flags(std::string soc_flag, std::string kv_cache_dtype = "auto");
};

// Model dimensions the KV cache depends on.
struct KvModelShape {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;  // GQA models; 0 for MLA models
  int64_t head_dim = 0;      // GQA models; 0 for MLA models
  // MLA models (kv_lora_rank > 0): one latent + rope row per token and layer instead of GQA K/V rows.
  int64_t kv_lora_rank = 0;
  int64_t rope_dim = 0;  // qk_rope_head_dim
  // DSA models (index_head_dim > 0): also one indexer key per token and layer.
  int64_t index_head_dim = 0;
  // Models with linear-attention layers (state_layers > 0, Qwen3.5): per sequence and such layer, a conv
  // state of conv_kernel - 1 rows x conv_channels and a recurrent state of state_heads x key_dim x value_dim.
  // num_layers above counts the layers with a KV cache only.
  int64_t state_layers = 0;
  int64_t conv_kernel = 0;
  int64_t conv_channels = 0;
  int64_t state_heads = 0;
  int64_t state_key_dim = 0;
  int64_t state_value_dim = 0;
  // DeepSeek-V4 (sharedkv_dim > 0): every layer keeps, per sequence, a ring of the last sliding_window shared
  // K = V rows (sharedkv_dim no-rope + rope_dim rope elements) in its state slot; a layer with compress ratio
  // m > 0 also keeps one compressed entry per m tokens in the pages (page_size / m rows per page) and the
  // compressor's unfinished windows in the state slot (fp32 [(m == 4 ? 2 : 1) m, 2 coff head_dim] rows of
  // [kv | gate], coff = 2 for m = 4); a ratio-4 layer also keeps the indexer's keys (index_head_dim, paged)
  // and its compressor's unfinished windows (fp32 [8, 4 index_head_dim]). num_layers counts every layer.
  int64_t sharedkv_dim = 0;
  int64_t sliding_window = 0;
  std::vector<int64_t> compress_ratios;  // num_layers entries: 0, 4 or 128
};

// DeepSeek-V4's state regions (KvPagePool's StateSlotGeometry) of each layer.
inline constexpr int kV4WindowRegion = 0;             // the ring's main rows [sliding_window, row bytes]
inline constexpr int kV4WindowScaleRegion = 1;        // the ring's separate scales (split representations)
inline constexpr int kV4WindowRopeRegion = 2;         // the ring's separate rope rows (split representations)
inline constexpr int kV4CompressorRegion = 3;         // the compressor's unfinished windows (fp32 rows)
inline constexpr int kV4IndexerCompressorRegion = 4;  // the indexer compressor's (ratio-4 layers)
// Rows of the compressor state of a layer of compress ratio m: the previous complete window too with the
// overlap of the ratio-4 layers (its first half feeds the next entry), else the unfinished window only.
constexpr int64_t v4_compressor_state_rows(int64_t ratio) { return ratio == 4 ? 2 * ratio : ratio; }
constexpr int64_t v4_compressor_coff(int64_t ratio) { return ratio == 4 ? 2 : 1; }

// Batch description for attention(): int32 views as attention/paged_decode takes them.
struct AttentionBatch {
  TensorView block_tables;     // [num_seqs, max_blocks_per_seq], from KvPagePool::fill_block_tables
  TensorView context_lens;     // [num_seqs], tokens in the cache per sequence, this step's included
  TensorView query_start_loc;  // [num_seqs + 1], query rows of each sequence
};

class DeviceOperator {
 public:
  // Chooses the contract of this build's target (genbridge::ops::build_target()), validates it against
  // config.soc and, when npu-smi is on the path, the detected SoC, and resolves kv_cache_dtype. Runs
  // once at start-up (it may start npu-smi and blocks until it exits); the result is immutable.
  static Result<DeviceOperator> create(const DeviceConfig& config);

  const GenerationContract& contract() const { return *contract_; }
  // The KV representation in force.
  ops::KvCacheFormat kv_format() const { return kv_format_; }
  // The weight representation in force (--weight-quant), or nullptr for bf16 weights.
  const WeightQuantRepresentation* weight_quant() const { return weight_quant_; }
  // The representation of the checkpoint's MXFP4 weights (resolve_mxfp4_weight_quant): weight_quant(), or with
  // --weight-quant auto on a generation that runs MXFP4, mxfp4 (QuantizeOptions::mxfp4_repr).
  const WeightQuantRepresentation* mxfp4_weight_quant() const { return mxfp4_weight_quant_; }
  // The MoE dispatch representation in force (--moe-dispatch), or nullptr for bf16 (the default).
  const DispatchRepresentation* moe_dispatch() const { return moe_dispatch_; }
  // One line stating the contract in force, for the caller to print.
  const std::string& log_line() const { return log_line_; }

  // Page geometry of the KV cache in the representation in force (the pool sizes itself from it).
  KvPageGeometry kv_page_geometry(const KvModelShape& shape) const;
  // Typed views of layer `layer`'s memory in `pool` for a model of `shape`. InvalidArgument when the pool
  // was not sized by kv_page_geometry(shape) of this representation. Views stay valid for the pool's life.
  Result<ops::PagedKvCache> kv_layer_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;

  // Typed views of linear-attention layer `layer`'s state in `pool` (sized by kv_page_geometry(shape),
  // with state slots), in the generation's LinearStateFormat. InvalidArgument when the pool does not match
  // or the model has no linear-attention state.
  Result<LinearStateCache> state_layer_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;
  // One line stating what a state slot of `shape` holds in the representations in force (Qwen3.5's linear-attention
  // state; DeepSeek-V4's sliding-window rings and compressors' unfinished windows), with the bytes per sequence;
  // empty for a model without per-sequence state.
  std::string state_contract_line(const KvModelShape& shape) const;

  // Writes K/V rows of new tokens: key/value [num_tokens, num_kv_heads, head_dim] (fp32/fp16/bf16) into
  // the flat slots `slots` (KvPagePool::slots), quantizing as the representation says and passing the
  // slot mapping in the generation's format. Does not allocate; does not retain anything.
  Status write_kv(const ops::PagedKvCache& cache, const TensorView& key, const TensorView& value,
                  std::span<const int64_t> slots) const;
  // Attention for the sequences of `batch` (decode or causal chunked prefill; see attention/paged_decode).
  Status attention(const TensorView& query, const ops::PagedKvCache& cache, const AttentionBatch& batch,
                   float softmax_scale, const TensorView& out) const;

  // ---- MLA + DSA ----
  // The MLA KV representation in force: bf16, or the generation's quantized one (kv_cache_dtype).
  ops::MlaKvFormat mla_kv_format() const { return mla_kv_format_; }
  // The indexer key representation and the top-k index contract (the generation's).
  ops::IndexerKeyFormat indexer_key_format() const { return contract_->indexer_keys; }
  ops::TopkIndexFormat topk_index_format() const { return contract_->topk_indices; }
  // One line stating the MLA KV, indexer key and sparse-attention (top-k index) contracts in force, with
  // the bytes per token at DeepSeek's dimensions (kv_lora_rank 512, qk_rope_head_dim 64, index_head_dim 128).
  std::string mla_contract_line() const;
  // One line stating DeepSeek-V4's shared K = V row representation (window ring and compressed entries) and its
  // indexer keys in force and the quantized ones, with the bytes per row at V4's dimensions (448 + 64 rope,
  // index_head_dim 128), and the compressors' fp32 state.
  std::string sharedkv_contract_line() const;
  // The shared K = V row representation in force: bf16, or the generation's quantized one.
  ops::MlaKvFormat sharedkv_format() const;
  // DeepSeek-V4's indexer keys follow kv_cache_dtype too: bf16, or the generation's quantized indexer keys.
  ops::IndexerKeyFormat sharedkv_indexer_key_format() const;
  // Checks a model's MLA / indexer dimensions against the representations in force; call it at load time.
  // InvalidArgument naming the config key, the value and the rule (e.g. kv_lora_rank not a multiple of
  // 128 with a tile-scaled quantized MLA KV cache; index_head_dim not a power of two for Hadamard keys).
  Status check_kv_shape(const KvModelShape& shape) const;
  // Typed views of layer `layer`'s MLA cache / indexer keys in `pool` (sized by kv_page_geometry(shape)).
  // InvalidArgument when the pool does not match or the model has no MLA cache / no indexer.
  Result<ops::MlaKvCache> mla_layer_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;
  Result<ops::IndexerKeyCache> indexer_layer_view(const KvPagePool& pool, const KvModelShape& shape,
                                                  int64_t layer) const;
  // Writes new tokens' MLA rows: latent [num_tokens, kv_lora_rank], rope [num_tokens, rope_dim] (RoPE
  // applied), fp32/fp16/bf16, into the flat slots `slots`, with the representation's writer and the
  // generation's slot mapping. Does not allocate; does not retain anything.
  Status write_mla_kv(const ops::MlaKvCache& cache, const TensorView& latent, const TensorView& rope,
                      std::span<const int64_t> slots) const;
  // Writes new tokens' indexer keys: key [num_tokens, index_head_dim] (k_norm and RoPE applied).
  Status write_indexer_keys(const ops::IndexerKeyCache& cache, const TensorView& key,
                            std::span<const int64_t> slots) const;
  // Dense MLA in the absorbed form (attention/mla_decode): out [num_query_tokens, num_heads, kv_lora_rank].
  Status mla_attention(const TensorView& q_latent, const TensorView& q_rope, const ops::MlaKvCache& cache,
                       const AttentionBatch& batch, float softmax_scale, const TensorView& out) const;
  // The indexer's top-k (attention/lightning_indexer): topk_indices int32 [num_query_tokens, index_topk]
  // receives the selection in the generation's top-k index contract, to be handed to sparse_attention()
  // unchanged. q [num_query_tokens, index_n_heads, index_head_dim], weights [num_query_tokens, index_n_heads].
  Status index_topk(const TensorView& q, const TensorView& weights, const ops::IndexerKeyCache& keys,
                    const AttentionBatch& batch, const TensorView& topk_indices) const;
  // Sparse MLA over index_topk()'s selection (attention/sparse_mla_decode).
  Status sparse_attention(const TensorView& q_latent, const TensorView& q_rope, const ops::MlaKvCache& cache,
                          const TensorView& topk_indices, const AttentionBatch& batch, float softmax_scale,
                          const TensorView& out) const;
  // ---- end MLA + DSA ----

  // ---- DeepSeek-V4 (KvModelShape::sharedkv_dim > 0) ----
  // Typed views of layer `layer`'s memory in `pool` (sized by kv_page_geometry(shape) with state slots):
  // the sliding-window ring (an MLA cache in sharedkv_format() whose blocks are state slots: block_size =
  // sliding_window, slot = state_slot * sliding_window + position % sliding_window), the compressed entries
  // (an MLA cache whose blocks are pages of page_size / ratio entries: entry w of a sequence is at block
  // table[w / rows] * rows + w % rows), the indexer's keys (the same slots as the compressed entries of a
  // ratio-4 layer), and the compressors' unfinished windows (fp32 [slots, rows, 2 coff width] rows of
  // [kv | gate], indexed by position % rows). InvalidArgument when the pool does not match, the layer has no
  // such memory or the model is not DeepSeek-V4.
  Result<ops::MlaKvCache> v4_window_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;
  Result<ops::MlaKvCache> v4_compressed_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;
  Result<ops::IndexerKeyCache> v4_indexer_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer) const;
  Result<TensorView> v4_compressor_state_view(const KvPagePool& pool, const KvModelShape& shape, int64_t layer,
                                              bool indexer) const;
  // Bytes of one shared K = V row of `shape` in sharedkv_format() (main row, separate scale, separate rope).
  ops::KvRowBytes sharedkv_row_bytes(const KvModelShape& shape) const;
  // An MLA cache in sharedkv_format() over caller-owned memory of `rows` rows in one block (main [rows,
  // row.main], scale [rows, row.scale], rope [rows, row.rope]; pointers of empty parts may be null): a forward's
  // scratch rows. Does not own or check the memory.
  ops::MlaKvCache sharedkv_view(std::byte* main, std::byte* scale, std::byte* rope, int64_t rows,
                                const KvModelShape& shape) const;
  // Writes shared K = V rows (nope [n, sharedkv_dim], rope [n, rope_dim] with RoPE applied; fp32/fp16/bf16)
  // into the flat slots of a cache in sharedkv_format() (a window ring or compressed entries).
  Status write_sharedkv(const ops::MlaKvCache& cache, const TensorView& nope, const TensorView& rope,
                        std::span<const int64_t> slots) const;
  // Attention over each query's window rows then compressed entries with sinks
  // (attention/sharedkv_sparse_attention; the slots are flat slots of the two caches, -1 skipped).
  Status sharedkv_attention(const TensorView& q_nope, const TensorView& q_rope, const ops::MlaKvCache& window_cache,
                            const TensorView& window_slots, const ops::MlaKvCache& compressed_cache,
                            const TensorView& compressed_slots, const TensorView& sinks, float softmax_scale,
                            const TensorView& out) const;
  // ---- end DeepSeek-V4 ----

 private:
  DeviceOperator() = default;
  // write_mla_kv / write_sharedkv once the cache's representation is checked.
  Status write_mla_rows(const char* what, const ops::MlaKvCache& cache, const TensorView& latent,
                        const TensorView& rope, std::span<const int64_t> slots) const;
  const GenerationContract* contract_ = nullptr;
  ops::KvCacheFormat kv_format_ = ops::KvCacheFormat::kBf16;
  ops::MlaKvFormat mla_kv_format_ = ops::MlaKvFormat::kBf16;
  const WeightQuantRepresentation* weight_quant_ = nullptr;
  const WeightQuantRepresentation* mxfp4_weight_quant_ = nullptr;
  const DispatchRepresentation* moe_dispatch_ = nullptr;
  std::string log_line_;
};

}  // namespace genbridge::runtime
