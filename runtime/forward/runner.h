#pragma once
// ModelRunner: the Qwen3-MoE, Qwen3.5-MoE, DeepSeek-V3 / V3.2 and DeepSeek-V4 forward pass over a paged KV cache (and,
// for Qwen3.5's Gated DeltaNet layers, the pool's per-sequence state slots), built from stable operators and the
// DeviceOperator's adapters. It never asks which generation it runs on.
//
// A forward processes one micro-batch (ForwardBatch): sequences that each contribute q_len new tokens
// (q_len = prompt length for prefill, 1 for decode). The layer loop is exposed in phases so that a
// disaggregated (AFD) attention rank can send the MoE part of each layer to FFN ranks and overlap stages:
//   begin -> for each layer: attention_block -> [MoE layer: route -> expert outputs -> finish_moe] -> logits
// The monolithic forward() runs the same phases with local_experts() over every expert. Because every
// kernel is batch-invariant and moe_combine sums slots in a fixed order, both paths give the same bits.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/moe/expert_ffn.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/forward/deepseek_attention.h"
#include "runtime/forward/deepseek_v4_attention.h"
#include "runtime/forward/gated_deltanet.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::model {

// Sequences of one forward; sequence s contributes q_lens[s] tokens at the end of its cached context. The
// pool must already hold each sequence at its new length (KvPagePool::admit / append).
struct ForwardInput {
  std::span<const int32_t> tokens;          // [T], sequences' tokens back to back
  std::span<const runtime::SeqId> seq_ids;  // [S]
  std::span<const int32_t> q_lens;          // [S], each >= 1, summing to T
};

// Where a sequence's hidden state first left the range the forward pass computes in. The residual stream is
// checked after the embedding and after every attention and MLP / MoE block (and before the final norm):
// a non-finite element, or a row whose fp32 sum of squares overflows, which makes the next RMSNorm return
// 0 instead of failing (README, "A request whose logits turn non-finite"). A read-only scan: no bits change.
struct ActivationFault {
  enum class Where : uint8_t { kNone, kEmbedding, kAttention, kMlp, kMoe };
  Where where = Where::kNone;
  int64_t layer = -1;       // the block's layer; -1 for the embedding
  int64_t position = -1;    // sequence position of the first row found at fault
  bool non_finite = false;  // true: element `element` is NaN or +-Inf; false: the sum of squares overflows
  int64_t element = -1;     // the first non-finite element of the row (non_finite only)
  float value = 0;          // that element, or the row's largest magnitude
  bool found() const { return where != Where::kNone; }
};
// A sentence for messages: "the hidden state of position 4 is not finite after layer 2's attention (element
// 17 = inf)", or "... after the embedding overflows fp32 in the next RMSNorm (its sum of squares exceeds
// 3.4e+38; largest element 2e+30)".
std::string describe(const ActivationFault& fault);

// What the forward pass chose for one token at one layer, for debugging routing and sparse attention
// (ForwardBatch::set_choice_sink; docs/deepseek.md, "Dumping the choices"). The spans are valid during the
// call only.
struct TokenChoices {
  int64_t seq_index = 0;  // the token's sequence: its index in the forward's input
  int64_t position = 0;   // the token's position in its sequence
  int64_t layer = 0;
  std::span<const int32_t> expert_ids;       // MoE layers: the routed experts, in the router's order; else empty
  std::span<const float> expert_weights;     // their combine weights (normalised, times routed_scaling_factor)
  std::span<const int32_t> index_positions;  // DSA layers: the indexer's top-k, as sequence positions, increasing
};
// Told every (token, layer) with something to report (a MoE or DSA layer) in token order, then layer order.
using ChoiceSink = std::function<void(const TokenChoices& choices)>;

// Activations and metadata of one micro-batch. Planned once for (max_tokens, max_seqs); a forward never
// allocates. Owned by the caller; one per concurrently processed stage.
class ForwardBatch {
 public:
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_seqs() const { return num_seqs_; }
  // MoE layer inputs and outputs, valid between route() and finish_moe() of a layer:
  TensorView moe_input() const;     // bf16 [T, hidden], the post-attention-normed hidden states
  TensorView topk_ids() const;      // int32 [T, k]
  TensorView topk_weights() const;  // fp32 [T, k]
  TensorView expert_out() const;    // bf16 [T, k, hidden]; filled by local_experts() or by FFN ranks
  // With a quantized MoE dispatch in force (DeviceOperator::moe_dispatch()): moe_input() quantized by route(), the
  // rows the routed experts compute from (uint8 [T, row bytes], runtime/device/moe_dispatch.h); else an empty view.
  TensorView moe_dispatch_rows() const;
  // DeepSeek-V3.2: layer `layer`'s indexer selection in the last forward (int32 [T, index_topk], the
  // DeviceOperator's top-k index contract); DeepSeek-V4: a compressed-sparse layer's selected compressed
  // entries (int32 [T, index_topk] entry indices, -1 padded); empty otherwise. For tests and tracing.
  TensorView index_selection(int64_t layer) const;
  // Per sequence of the last forward (in input order): the first activation fault of its rows, or none.
  std::span<const ActivationFault> faults() const;
  // Hands every following forward's choices to `sink` (not owned; must outlive its use) once the forward
  // finished (in ModelRunner::logits); nullptr (the default) records nothing and costs nothing. Allocates
  // the per-layer record once, here. A batch that make_batch did not plan ignores it.
  void set_choice_sink(const ChoiceSink* sink);

 private:
  friend class ModelRunner;
  struct Buffers;
  const MlaAttention* mla_ = nullptr;
  const V4Attention* v4_ = nullptr;
  std::shared_ptr<Buffers> b_;
  int64_t num_tokens_ = 0;
  int64_t num_seqs_ = 0;
  int64_t max_tokens_ = 0;
  int64_t max_seqs_ = 0;
  int64_t num_layers_ = 0;
};

// The expert weights of every MoE layer, for whoever computes experts (monolithic runner or FFN rank).
class ExpertBank {
 public:
  // `quantized` (optional; must outlive the bank): routed experts quantized at load, used for
  // every MoE layer whose experts it holds. The model's SwiGLU clamp (DeepSeek-V4's swiglu_limit) applies.
  explicit ExpertBank(const Checkpoint& checkpoint, const QuantizedWeights* quantized = nullptr);
  // out[t, j] for every slot whose expert is in [begin, end) (see ops::expert_ffn). Blocks until done.
  Status compute(int64_t layer, const TensorView& x, const TensorView& topk_ids, int64_t begin, int64_t end,
                 const TensorView& out) const;
  // compute() on the input as a quantized MoE dispatch carries it: `rows` (uint8 [T, row bytes] in representation
  // `r`, runtime/device/moe_dispatch.h). W8A8 experts take int8-per-token codes as they are (the bits of compute()
  // on the activations the codes came from); otherwise the rows are decoded into `x32` (fp32 [T, hidden], the
  // caller's scratch) and computed from there.
  Status compute_dispatched(int64_t layer, const runtime::DispatchRepresentation& r, const TensorView& rows,
                            const TensorView& topk_ids, int64_t begin, int64_t end, const TensorView& out,
                            const TensorView& x32) const;
  int64_t num_experts() const { return num_experts_; }
  // Packs every MoE layer's experts [begin, end) now (compute() would on their first use): for a process that
  // knows it computes them, so that the first request does not wait for it.
  Status prepare(int64_t begin, int64_t end) const;

 private:
  // The argument checks compute() and compute_dispatched() share.
  Status check(int64_t layer, int64_t begin, int64_t end) const;
  // Packs the bf16 experts [begin, end) of `layer` that are not packed yet (ops::pack_expert_weights; in parallel,
  // once per expert): an expert's weights are packed on the first call that computes it, so a rank packs only the
  // experts it serves. Safe to call from several threads.
  Status ensure_packed(int64_t layer, int64_t begin, int64_t end) const;
  struct Packs;
  // Empty for dense layers; mutable: ensure_packed sets .packed (under Packs::mu, published by Packs::ready).
  mutable std::vector<std::vector<ops::ExpertWeights>> layers_;
  std::shared_ptr<Packs> packs_;  // null when the experts are not bf16 or GENBRIDGE_PACKED_WEIGHTS=0
  Status pack_error_;             // an invalid GENBRIDGE_PACKED_WEIGHTS, returned by compute()
  const QuantizedWeights* quantized_ = nullptr;
  int64_t num_experts_ = 0;
  int64_t hidden_ = 0;
  float swiglu_limit_;
};

// The SwiGLU clamp of a model's experts (DeepSeek-V4's swiglu_limit; none for the other models).
float model_swiglu_limit(const ModelConfig& c);

// The phases of a forward, for tracing: embedding lookup (begin), attention block, router, expert
// outputs, combine (moe_combine + residual), final norm and LM head (logits).
enum class ForwardPhase : uint8_t { kEmbed, kAttention, kRoute, kExperts, kCombine, kLogits };
inline constexpr int kNumForwardPhases = 6;
// "embed", "attention", "route", "experts", "combine", "logits".
const char* forward_phase_name(ForwardPhase phase);
// Told each phase of a forward once it finished: its layer (-1 for embed and logits) and steady-clock
// begin and end in nanoseconds.
using ForwardPhaseObserver = std::function<void(ForwardPhase phase, int64_t layer, int64_t begin_ns, int64_t end_ns)>;

class ModelRunner {
 public:
  // Binds the runner to a checkpoint (bf16 weights), the DeviceOperator in force and the KV pool sized
  // from it. The references must outlive the runner.
  // With --weight-quant in force (dev.weight_quant() set), `quantized` must hold the weights quantized into
  // that representation (QuantizedWeights::quantize); it must outlive the runner. Jobs get their runner from
  // engine::assemble_engine (runtime/engine/assembly.h), which owns it with its pool, executor and engine.
  static Result<std::unique_ptr<ModelRunner>> create(const Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                                     const runtime::KvPagePool& pool,
                                                     const QuantizedWeights* quantized = nullptr);

  const ModelConfig& config() const { return config_; }
  // Workspace for micro-batches of up to max_tokens tokens from up to max_seqs sequences.
  ForwardBatch make_batch(int64_t max_tokens, int64_t max_seqs) const;

  // Monolithic forward: writes the new tokens' K/V and the last position's logits of every sequence
  // (fp32 [S, vocab] row-major into `logits`). `observer` (optional) is told every phase (tracing).
  Status forward(ForwardBatch& batch, const ForwardInput& input, std::span<float> logits,
                 const ForwardPhaseObserver* observer = nullptr) const;

  // Phases (see the file comment). Layers are 0-based; calls must follow the order above.
  Status begin(ForwardBatch& batch, const ForwardInput& input) const;
  Status attention_block(ForwardBatch& batch, int64_t layer) const;
  Status route(ForwardBatch& batch, int64_t layer) const;
  Status local_experts(ForwardBatch& batch, int64_t layer, int64_t expert_begin, int64_t expert_end) const;
  // `expert_out` (bf16 [T, k, hidden]) defaults to batch.expert_out(); an AFD rank passes the received outputs.
  Status finish_moe(ForwardBatch& batch, int64_t layer, const TensorView* expert_out = nullptr) const;
  Status logits(ForwardBatch& batch, std::span<float> logits) const;

  const ExpertBank& experts() const { return experts_; }

 private:
  ModelRunner(const Checkpoint& c, const runtime::DeviceOperator& d, const runtime::KvPagePool& p,
              const QuantizedWeights* q);
  Status norm(const TensorView& x, const TensorView& w, const TensorView& y) const;
  Status add_norm(const TensorView& x, const TensorView& w, const TensorView& residual, const TensorView& y) const;
  // The post-attention norm, and the dense MLP on a dense layer (the tail of attention_block).
  Status post_attention(ForwardBatch& batch, int64_t layer) const;
  // Hands the batch's recorded choices to its sink (set_choice_sink).
  void emit_choices(ForwardBatch& batch) const;
  // Scans n rows of [n, hidden] bf16 `x` (row i: the batch's token row rows[i], or i when rows is null) and
  // records the first fault of each sequence that has none yet.
  void check_rows(ForwardBatch& batch, const bf16_t* x, int64_t n, const int32_t* rows, ActivationFault::Where where,
                  int64_t layer) const;
  // check_rows for fp32 rows (DeepSeek-V4's collapsed streams).
  void check_rows_f32(ForwardBatch& batch, const float* x, int64_t n, const int32_t* rows, ActivationFault::Where where,
                      int64_t layer) const;
  // The block that wrote `layer`'s MLP output: kMoe on MoE layers, else kMlp.
  ActivationFault::Where mlp_block(int64_t layer) const;
  // DeepSeek-V4's residual streams around each block (manifold-constrained hyper-connections).
  Status attention_block_v4(ForwardBatch& batch, int64_t layer) const;
  Status finish_moe_v4(ForwardBatch& batch, int64_t layer, const TensorView& expert_out) const;
  Status logits_v4(ForwardBatch& batch, std::span<float> logits) const;

  const Checkpoint& checkpoint_;
  const ModelWeights& w_;
  ModelConfig config_;
  const runtime::DeviceOperator& dev_;
  const runtime::KvPagePool& pool_;
  std::vector<ops::PagedKvCache> kv_;   // GQA models: one per layer with a KV cache
  std::vector<int64_t> kv_index_;       // per layer: its entry of kv_, or -1 (a linear-attention layer)
  std::unique_ptr<MlaAttention> mla_;   // DeepSeek models (MLA / DSA attention)
  std::unique_ptr<GatedDeltaNet> gdn_;  // Qwen3.5: the linear-attention layers
  std::unique_ptr<V4Attention> v4_;     // DeepSeek-V4
  struct V4Norms {
    std::vector<float> attn, ffn;  // attn_norm, ffn_norm as fp32 (the blocks' inputs are fp32)
  };
  std::vector<V4Norms> v4_norms_;
  std::vector<float> v4_final_norm_;
  const QuantizedWeights* quantized_ = nullptr;
  ExpertBank experts_;
  // Packed copies (ops::PackedWeights, one allocation) of the bf16 weights the dense projections read: the Qwen
  // attention projections that are not quantized and the LM head, keyed by their data; made by create().
  std::unordered_map<const void*, ops::PackedWeights> packed_;
  std::shared_ptr<void> packed_arena_;
  const ops::PackedWeights* packed(const TensorView& w) const;
  Status pack_projections();
  float saturation_floor_ = 0;  // a row whose largest |x| is below this cannot overflow fp32's sum of squares
};

}  // namespace genbridge::model
