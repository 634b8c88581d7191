#pragma once
// V4Attention: DeepSeek-V4's attention for the model runner (docs/deepseek.md, "DeepSeek-V4"), built from
// stable operators and the DeviceOperator's shared K = V adapters. Never asks which generation it runs on.
//
// Per layer and forward: queries (wq_a -> q_norm -> wq_b, then each head divided by its RMS), the one shared
// K = V head (wkv -> kv_norm), RoPE on the trailing qk_rope_head_dim dims of both (interleaved pairs; plain
// rope_theta on sliding-window layers, compress_rope_theta with YaRN on compressed ones). Every layer attends
// to the last sliding_window tokens: each sequence's ring in its state slot holds their rows; a forward copies
// the ring's rows before its first new token and its new rows into a scratch window, attends there, and copies
// the newest rows back into the ring. A compressed layer (ratio m) pools each window of m tokens as soon as
// it completes (attention/kv_compress over the compressor's unfinished rows kept in the state slot and the
// forward's new ones), normalizes and rotates the entry at the window's start and writes it to the pages;
// ratio-128 layers attend to every complete window, ratio-4 layers to the lightning indexer's top-k of its
// own compressed keys. One softmax over window and compressed rows with a per-head sink; the output's rope
// dims are rotated back at the query's position; grouped output projection (wo_a per group, then wo_b).
//
// Everything the result depends on is a function of the sequence's tokens alone: the rows a query attends to
// and their order do not depend on how its sequence was split into forwards or batched with others, so
// prefill, chunked prefill and decode give the same bits.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::model {

// The sequences of one forward, as the runner holds them. Sequence s contributes the tokens
// [query_start[s], query_start[s + 1]) at its last positions; the pool already holds it at its new length.
struct V4AttentionBatch {
  std::span<const int32_t> positions;     // [T]
  std::span<const int32_t> query_start;   // [S + 1]
  std::span<const int32_t> state_slots;   // [S]
  std::span<const int32_t> block_tables;  // [S * max_blocks], each row -1 padded
  int64_t max_blocks = 0;
};

class V4Attention {
 public:
  // Binds to a DeepSeek-V4 checkpoint (bf16 weights), the DeviceOperator and a pool sized by
  // dev.kv_page_geometry(kv_model_shape(config)) with state slots. With `quantized` (--weight-quant; optional),
  // the layers it quantized run wq_a, wq_b, wkv, wo_a and wo_b with linear/quant_linear (the compressors and the
  // indexer stay bf16). The references must outlive the object.
  static Result<std::unique_ptr<V4Attention>> create(const Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                                     const runtime::KvPagePool& pool,
                                                     const QuantizedWeights* quantized = nullptr);

  // Per-micro-batch workspace (planned for up to max_tokens tokens from up to max_seqs sequences; buffers
  // whose size depends on the context length grow on first use).
  struct Scratch;
  std::shared_ptr<Scratch> make_scratch(int64_t max_tokens, int64_t max_seqs) const;

  // Layer `layer`'s attention for the T tokens of a micro-batch: x bf16 [T, hidden] (after the attention
  // norm); writes the new tokens' window rows, the compressed entries and indexer keys of the windows they
  // complete and the compressors' state, then out bf16 [T, hidden].
  Status forward(Scratch& scratch, int64_t layer, const TensorView& x, const V4AttentionBatch& batch,
                 const TensorView& out) const;
  // A compressed-sparse layer's indexer selection in the last forward with this scratch: the compressed
  // entries each token attended to, int32 [num_tokens, index_topk] entry indices, increasing, -1 padded;
  // empty for other layers.
  TensorView index_selection(const Scratch& scratch, int64_t layer, int64_t num_tokens) const;

 private:
  V4Attention(const Checkpoint& c, const runtime::DeviceOperator& d, const QuantizedWeights* q)
      : config_(c.config()), w_(c.weights()), dev_(d), quantized_(q) {}
  // The compressor of `layer` (the attention's or, with `indexer`, the indexer's): pools the windows the
  // forward completes and writes them (entries through write_sharedkv, keys through write_indexer_keys), and
  // keeps the unfinished rows in the state slot.
  Status compress(Scratch& s, int64_t layer, bool indexer, const TensorView& x, const V4AttentionBatch& batch) const;

  const ModelConfig& config_;
  const ModelWeights& w_;
  const runtime::DeviceOperator& dev_;
  const QuantizedWeights* quantized_ = nullptr;
  runtime::KvModelShape shape_;
  // Per layer: the norms' weights as fp32 (the block's activations are fp32).
  struct LayerNorms {
    std::vector<float> q_norm, kv_norm, compressor, index_compressor;
  };
  std::vector<LayerNorms> norms_;
  std::vector<ops::MlaKvCache> window_;           // per layer: the sliding-window rings
  std::vector<ops::MlaKvCache> compressed_;       // per layer: compressed entries (empty view for ratio 0)
  std::vector<ops::IndexerKeyCache> index_keys_;  // per layer (ratio 4 only)
  std::vector<TensorView> compressor_state_, index_compressor_state_;  // per layer, or empty views
  std::vector<double> main_inv_freq_, compress_inv_freq_;
  std::vector<float> ones_;  // [head_dim]: the weight of the queries' unweighted per-head RMS norm
  int64_t page_size_ = 0;
  float softmax_scale_ = 1.0f;
};

}  // namespace genbridge::model
