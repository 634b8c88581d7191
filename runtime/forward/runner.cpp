#include "runtime/forward/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>

#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "genbridge/ops/activation/sigmoid_mul.h"
#include "genbridge/ops/attention/rope.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/moe/grouped_topk_router.h"
#include "genbridge/ops/moe/moe_combine.h"
#include "genbridge/ops/moe/quant_expert_ffn.h"
#include "genbridge/ops/moe/sqrt_softplus_router.h"
#include "genbridge/ops/moe/topk_router.h"
#include "genbridge/ops/norm/add_gemma_rms_norm.h"
#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "genbridge/ops/residual/hyper_connection.h"
#include "runtime/device/moe_dispatch.h"

namespace genbridge::model {

struct ForwardBatch::Buffers {
  // bf16 activations
  std::vector<bf16_t> residual, delta, h, q, k, v, qn, kn, attn, mlp_in, expert_out, shared_out, last_hidden;
  // fp32
  std::vector<float> router_logits, topk_weights, shared_gate, rstd;
  std::vector<float> attn32;  // Qwen3.5: the attention output, gated in fp32 before o_proj
  // int32 / int64 metadata
  std::vector<int32_t> topk_ids, zero_ids, positions, context_lens, query_start, block_tables, last_rows, state_slots;
  std::vector<int64_t> slots;
  std::vector<runtime::SeqId> seq_ids;
  std::vector<int32_t> row_seq;         // [T]: the sequence of each token row
  std::vector<ActivationFault> faults;  // [S]
  // set_choice_sink: every layer's routing of the last forward, [layer][T][topk].
  const ChoiceSink* choice_sink = nullptr;
  std::vector<int32_t> choice_ids;
  std::vector<float> choice_weights;
  std::vector<int32_t> choice_positions;        // scratch: one token's indexer positions
  std::shared_ptr<MlaAttention::Scratch> mla;   // DeepSeek models
  std::shared_ptr<GatedDeltaNet::Scratch> gdn;  // Qwen3.5
  // DeepSeek-V4: the residual streams [T, hc_mult, hidden] (fp32), each block's collapsed input [T, hidden],
  // the attention site's and the MoE site's post [T, n] and comb [T, n, n] weights (the MoE site's live from
  // attention_block to finish_moe), the tokens (hash routing reads them), hash-routed ids [T, k], the
  // last positions' streams, and the attention's scratch.
  std::vector<float> streams, post_attn, comb_attn, post_ffn, comb_ffn, last_streams, collapsed, normed, out32,
      shared32;
  std::vector<int32_t> tokens, hash_ids;
  std::shared_ptr<V4Attention::Scratch> v4;
  // A quantized MoE dispatch: the routed experts' input as rows [T, dispatch_row_bytes], and their fp32 decoding.
  std::vector<uint8_t> dispatch_rows;
  std::vector<float> dispatch_x32;
  int64_t dispatch_row_bytes = 0;  // 0: no quantized dispatch
  int64_t hc = 0;
  int64_t max_blocks = 0;
  int64_t hidden = 0, q_size = 0, q_proj = 0, kv_size = 0, heads = 0, kv_heads = 0, head_dim = 0, topk = 0, experts = 0;
};

namespace {

TensorView bf16_view(std::vector<bf16_t>& v, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), DType::kBF16, shape);
}
TensorView f32_view(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), DType::kF32, shape);
}
TensorView v4_norm(const std::vector<float>& w) {
  return TensorView(const_cast<float*>(w.data()), DType::kF32, {static_cast<int64_t>(w.size())});
}
TensorView i32_view(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return TensorView(v.data(), DType::kI32, shape);
}
// [rows, cols] view of a 2-D weight as a [1, rows, cols] stack of one.
ops::ExpertWeights as_expert(const MlpWeights& m) { return {m.gate_proj, m.up_proj, m.down_proj}; }

// A projection: quant_linear with the layer's quantized weight when there is one, else linear (bf16).
Status project(const TensorView& x, const TensorView& w, const ops::QuantWeight* q, const TensorView& y,
               const ops::PackedWeights* packed = nullptr) {
  return q ? ops::quant_linear(x, *q, y) : ops::linear(x, w, y, nullptr, packed);
}

Status with_context(Status s, const char* what, int64_t layer) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{} of layer {}: {}", what, layer, s.message()));
}

const char* fault_block(ActivationFault::Where w) {
  switch (w) {
    case ActivationFault::Where::kAttention:
      return "attention";
    case ActivationFault::Where::kMlp:
      return "MLP";
    case ActivationFault::Where::kMoe:
      return "MoE block";
    default:
      return "?";
  }
}

}  // namespace

std::string describe(const ActivationFault& f) {
  const std::string after = f.where == ActivationFault::Where::kEmbedding
                                ? std::string("the embedding")
                                : fmt::format("layer {}'s {}", f.layer, fault_block(f.where));
  if (f.non_finite) {
    return fmt::format("the hidden state of position {} is not finite after {} (element {} = {})", f.position, after,
                       f.element, f.value);
  }
  return fmt::format(
      "the hidden state of position {} after {} overflows fp32 in the next RMSNorm (its sum of squares exceeds "
      "3.4e+38; largest element {:g}), which would make the norm return 0",
      f.position, after, f.value);
}

std::span<const ActivationFault> ForwardBatch::faults() const {
  if (!b_) return {};
  return {b_->faults.data(), static_cast<size_t>(num_seqs_)};
}

void ForwardBatch::set_choice_sink(const ChoiceSink* sink) {
  if (!b_) return;  // not planned yet (make_batch): nothing to record into
  b_->choice_sink = sink;
  if (!sink) return;
  const auto n = static_cast<size_t>(num_layers_ * max_tokens_ * b_->topk);
  b_->choice_ids.resize(n);
  b_->choice_weights.resize(n);
}

TensorView ForwardBatch::moe_input() const {
  return TensorView(b_->mlp_in.data(), DType::kBF16, {num_tokens_, b_->hidden});
}
TensorView ForwardBatch::topk_ids() const {
  return TensorView(b_->topk_ids.data(), DType::kI32, {num_tokens_, b_->topk});
}
TensorView ForwardBatch::topk_weights() const {
  return TensorView(b_->topk_weights.data(), DType::kF32, {num_tokens_, b_->topk});
}
TensorView ForwardBatch::expert_out() const {
  return TensorView(b_->expert_out.data(), DType::kBF16, {num_tokens_, b_->topk, b_->hidden});
}

TensorView ForwardBatch::moe_dispatch_rows() const {
  if (!b_ || b_->dispatch_row_bytes == 0) return TensorView();
  return TensorView(b_->dispatch_rows.data(), DType::kU8, {num_tokens_, b_->dispatch_row_bytes});
}

TensorView ForwardBatch::index_selection(int64_t layer) const {
  if (v4_ && b_->v4) return v4_->index_selection(*b_->v4, layer, num_tokens_);
  if (!mla_ || !b_->mla) return TensorView();
  return mla_->index_selection(*b_->mla, layer, num_tokens_);
}

float model_swiglu_limit(const ModelConfig& c) {
  return c.is_deepseek_v4() && c.dsv4.swiglu_limit > 0 ? static_cast<float>(c.dsv4.swiglu_limit) : ops::kNoSwigluLimit;
}

// GENBRIDGE_PACKED_WEIGHTS: 1 (the default) packs the bf16 projections and experts at load (ops::PackedWeights);
// 0 reads the checkpoint's layout (same bits; for comparison, and where a second copy of the weights does not fit).
namespace {
Result<bool> packed_weights_enabled() {
  const char* v = std::getenv("GENBRIDGE_PACKED_WEIGHTS");
  if (!v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  return invalid_argument(fmt::format("GENBRIDGE_PACKED_WEIGHTS is '{}'; it must be 0 or 1", v));
}
}  // namespace

struct ExpertBank::Packs {
  explicit Packs(const std::vector<std::vector<ops::ExpertWeights>>& layers) {
    for (const auto& l : layers) {
      ready.emplace_back(std::make_unique<std::atomic<bool>[]>(l.size()));
      packed.emplace_back(l.size());
      arena.emplace_back();
    }
  }
  std::mutex mu;
  std::vector<std::unique_ptr<std::atomic<bool>[]>> ready;                     // [layer][expert]
  std::vector<std::vector<std::unique_ptr<ops::PackedExpertWeights>>> packed;  // [layer][expert]
  // Per layer, one allocation for every expert's packed weights (in huge pages: ops::allocate_packed), made on
  // the layer's first use; an expert's part is written when it is packed.
  std::vector<std::shared_ptr<void>> arena;
};

ExpertBank::ExpertBank(const Checkpoint& checkpoint, const QuantizedWeights* quantized)
    : quantized_(quantized),
      num_experts_(checkpoint.config().num_experts),
      hidden_(checkpoint.config().hidden_size),
      swiglu_limit_(model_swiglu_limit(checkpoint.config())) {
  for (const LayerWeights& l : checkpoint.weights().layers) {
    std::vector<ops::ExpertWeights> e;
    if (l.is_moe) {
      for (const MlpWeights& m : l.moe.experts) e.push_back(as_expert(m));
    }
    layers_.push_back(std::move(e));
  }
  bool bf16 = false;
  for (const auto& l : layers_) bf16 = bf16 || (!l.empty() && l[0].w_gate.dtype() == DType::kBF16);
  const Result<bool> pack = packed_weights_enabled();
  if (!pack.ok()) {
    pack_error_ = pack.status();
  } else if (bf16 && *pack) {
    packs_ = std::make_shared<Packs>(layers_);
  }
}

Status ExpertBank::prepare(int64_t begin, int64_t end) const {
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
    if (layers_[l].empty() || (quantized_ && l < quantized_->num_layers() && !quantized_->layer(l).experts.empty())) {
      continue;
    }
    GB_RETURN_IF_ERROR(check(l, begin, end));
    GB_RETURN_IF_ERROR(ensure_packed(l, begin, end));
  }
  return ok_status();
}

Status ExpertBank::ensure_packed(int64_t layer, int64_t begin, int64_t end) const {
  GB_RETURN_IF_ERROR(pack_error_);
  if (!packs_ || layers_[layer].empty() || layers_[layer][0].w_gate.dtype() != DType::kBF16) return ok_status();
  Packs& p = *packs_;
  auto all_ready = [&] {
    for (int64_t e = begin; e < end; ++e)
      if (!p.ready[layer][e].load(std::memory_order_acquire)) return false;
    return true;
  };
  if (all_ready()) return ok_status();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<int64_t> missing;
  for (int64_t e = begin; e < end; ++e)
    if (!p.ready[layer][e].load(std::memory_order_relaxed)) missing.push_back(e);
  std::vector<Status> status(missing.size());
  std::vector<ops::ExpertWeights>& experts = layers_[layer];
  const size_t per_expert = ops::packed_expert_bytes(experts[0]);
  if (!p.arena[layer]) {
    p.arena[layer] = ops::allocate_packed(per_expert * experts.size());
    if (!p.arena[layer]) {
      return resource_exhausted(fmt::format("experts: cannot allocate {} bytes for layer {}'s packed experts",
                                            per_expert * experts.size(), layer));
    }
  }
  parallel_for_dynamic(static_cast<int64_t>(missing.size()), [&](int64_t i) {
    const int64_t e = missing[i];
    auto packed = ops::pack_expert_weights(experts[e], static_cast<char*>(p.arena[layer].get()) + e * per_expert);
    if (!packed.ok()) {
      status[i] = packed.status();
      return;
    }
    p.packed[layer][e] = std::make_unique<ops::PackedExpertWeights>(std::move(*packed));
    experts[e].packed = p.packed[layer][e].get();
  });
  for (size_t i = 0; i < missing.size(); ++i) {
    GB_RETURN_IF_ERROR(status[i]);
    p.ready[layer][missing[i]].store(true, std::memory_order_release);
  }
  return ok_status();
}

Status ExpertBank::check(int64_t layer, int64_t begin, int64_t end) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()) || layers_[layer].empty()) {
    return invalid_argument(fmt::format("experts: layer {} is not a MoE layer of this model", layer));
  }
  if (begin < 0 || begin > end || end > num_experts_) {
    return invalid_argument(fmt::format("experts: range [{}, {}) is not inside [0, {})", begin, end, num_experts_));
  }
  if (quantized_ && quantized_->experts_quantized() &&
      (begin < quantized_->expert_begin() || end > quantized_->expert_end()) && begin < end) {
    return invalid_argument(fmt::format(
        "experts: layer {}'s experts [{}, {}) are not among the quantized experts [{}, {}) these weights hold", layer,
        begin, end, quantized_->expert_begin(), quantized_->expert_end()));
  }
  return ok_status();
}

Status ExpertBank::compute(int64_t layer, const TensorView& x, const TensorView& topk_ids, int64_t begin, int64_t end,
                           const TensorView& out) const {
  GB_RETURN_IF_ERROR(check(layer, begin, end));
  if (quantized_ && layer < quantized_->num_layers() && !quantized_->layer(layer).experts.empty()) {
    std::span<const ops::QuantExpertWeights> q(quantized_->layer(layer).experts);
    return ops::quant_expert_ffn(x, topk_ids, q.subspan(begin, end - begin), begin, end, out, swiglu_limit_);
  }
  GB_RETURN_IF_ERROR(ensure_packed(layer, begin, end));
  std::span<const ops::ExpertWeights> all(layers_[layer]);
  return ops::expert_ffn(x, topk_ids, all.subspan(begin, end - begin), begin, end, out, swiglu_limit_);
}

Status ExpertBank::compute_dispatched(int64_t layer, const runtime::DispatchRepresentation& r, const TensorView& rows,
                                      const TensorView& topk_ids, int64_t begin, int64_t end, const TensorView& out,
                                      const TensorView& x32) const {
  GB_RETURN_IF_ERROR(check(layer, begin, end));
  if (r.activations == runtime::ActivationQuant::kPerTokenInt8 && quantized_ && layer < quantized_->num_layers() &&
      !quantized_->layer(layer).experts.empty() &&
      quantized_->representation().scheme == ops::WeightQuantScheme::kW8A8) {
    // W8A8's own activations: the codes go in as they are, so the dispatch changes no bit.
    GB_ASSIGN_OR_RETURN(const runtime::DispatchViews v, runtime::dispatch_views(r, rows, hidden_));
    std::span<const ops::QuantExpertWeights> q(quantized_->layer(layer).experts);
    return ops::quant_expert_ffn_prequantized(v.codes, v.scales, topk_ids, q.subspan(begin, end - begin), begin, end,
                                              out, swiglu_limit_);
  }
  GB_RETURN_IF_ERROR(runtime::dequantize_dispatch(r, rows, x32));
  return compute(layer, x32, topk_ids, begin, end, out);
}

ModelRunner::ModelRunner(const Checkpoint& c, const runtime::DeviceOperator& d, const runtime::KvPagePool& p,
                         const QuantizedWeights* q)
    : checkpoint_(c), w_(c.weights()), config_(c.config()), dev_(d), pool_(p), quantized_(q), experts_(c, q) {
  // hidden * floor^2 is just below fp32's maximum: a row whose elements are all below the floor cannot
  // overflow the norm's fp32 sum of squares, so only rows above it pay for the exact sum.
  saturation_floor_ =
      static_cast<float>(0.99 * std::sqrt(std::numeric_limits<float>::max() /
                                          static_cast<double>(std::max<int64_t>(1, config_.hidden_size))));
}

const ops::PackedWeights* ModelRunner::packed(const TensorView& w) const {
  const auto it = packed_.find(w.data());
  return it == packed_.end() ? nullptr : &it->second;
}

Status ModelRunner::pack_projections() {
  GB_ASSIGN_OR_RETURN(const bool pack, packed_weights_enabled());
  if (!pack) return ok_status();
  std::vector<TensorView> ws;
  auto add = [&](const TensorView& w) {
    if (w.data() && w.rank() == 2 && w.dtype() == DType::kBF16 && w.stride(1) == 1) ws.push_back(w);
  };
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& lw = w_.layers[l];
    if (lw.linear || (quantized_ && quantized_->layer(static_cast<int64_t>(l)).attention)) continue;
    for (const TensorView* w : {&lw.attn.q_proj, &lw.attn.k_proj, &lw.attn.v_proj, &lw.attn.o_proj}) add(*w);
  }
  add(w_.lm_head);
  std::vector<size_t> at(ws.size() + 1, 0);
  for (size_t i = 0; i < ws.size(); ++i)
    at[i + 1] = at[i] + ops::PackedWeights::packed_bytes(ws[i].dim(0), ws[i].dim(1));
  if (ws.empty()) return ok_status();
  packed_arena_ = ops::allocate_packed(at.back());
  if (!packed_arena_) {
    return resource_exhausted(
        fmt::format("model runner: cannot allocate {} bytes for the packed projections", at.back()));
  }
  std::vector<Result<ops::PackedWeights>> out(ws.size(), Result<ops::PackedWeights>(ops::PackedWeights()));
  parallel_for_dynamic(static_cast<int64_t>(ws.size()), [&](int64_t i) {
    out[i] = ops::PackedWeights::pack(ws[i], static_cast<char*>(packed_arena_.get()) + at[i]);
  });
  for (size_t i = 0; i < ws.size(); ++i) {
    GB_RETURN_IF_ERROR(out[i].status());
    packed_.emplace(ws[i].data(), std::move(*out[i]));
  }
  return ok_status();
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const Checkpoint& checkpoint,
                                                         const runtime::DeviceOperator& dev,
                                                         const runtime::KvPagePool& pool,
                                                         const QuantizedWeights* quantized) {
  if (checkpoint.precision() != WeightPrecision::kBF16) {
    return invalid_argument("model runner: the checkpoint must be opened with bf16 weights (LoadOptions::precision)");
  }
  const runtime::WeightQuantRepresentation* wq = dev.weight_quant();
  if (wq && !quantized) {
    return invalid_argument(fmt::format("model runner: weight_quant {} is in force but no quantized weights were given",
                                        ops::weight_quant_scheme_name(wq->scheme)));
  }
  if (quantized && (!wq || quantized->representation().scheme != wq->scheme ||
                    quantized->num_layers() != checkpoint.config().num_hidden_layers)) {
    return invalid_argument(fmt::format(
        "model runner: the quantized weights are {} for {} layers but the device's weight_quant is {} for {} layers",
        ops::weight_quant_scheme_name(quantized->representation().scheme), quantized->num_layers(),
        wq ? ops::weight_quant_scheme_name(wq->scheme) : "none", checkpoint.config().num_hidden_layers));
  }
  const runtime::QuantizedLayers& roles = dev.contract().weight_quant.layers;
  if (quantized && !quantized->holds_attention_side() && (roles.attention_projections || roles.shared_experts)) {
    return invalid_argument(fmt::format(
        "model runner: the quantized weights hold only routed experts [{}, {}) (an FFN rank's share), not the "
        "attention side the runner computes",
        quantized->expert_begin(), quantized->expert_end()));
  }
  std::unique_ptr<ModelRunner> r(new ModelRunner(checkpoint, dev, pool, quantized));
  GB_RETURN_IF_ERROR(r->pack_projections());
  const ModelConfig& c = r->config_;
  if (c.is_deepseek_v4()) {  // shared K = V attention over windows and compressed entries, hyper-connections
    GB_ASSIGN_OR_RETURN(r->v4_, V4Attention::create(checkpoint, dev, pool, quantized));
    // The blocks' norms act on fp32 activations: fp32 copies of their weights.
    const auto f32 = [](const TensorView& w) {
      std::vector<float> v(static_cast<size_t>(w.numel()));
      for (int64_t i = 0; i < w.numel(); ++i) {
        v[i] = w.dtype() == DType::kF32 ? w.data_as<const float>()[i] : bf16_to_float(w.data_as<const bf16_t>()[i]);
      }
      return v;
    };
    for (const LayerWeights& lw : r->w_.layers) {
      r->v4_norms_.push_back({f32(lw.input_layernorm), f32(lw.post_attention_layernorm)});
    }
    r->v4_final_norm_ = f32(r->w_.final_norm);
    return r;
  }
  if (c.is_deepseek()) {  // MLA (+ DSA) attention: latent rows instead of GQA K/V (deepseek_attention.h)
    if (pool.geometry().num_layers != c.num_hidden_layers) {
      return invalid_argument(fmt::format("model runner: the KV pool holds {} layers but the model has {}",
                                          pool.geometry().num_layers, c.num_hidden_layers));
    }
    GB_ASSIGN_OR_RETURN(r->mla_, MlaAttention::create(checkpoint, dev, pool, quantized));
    return r;
  }
  if (pool.geometry().num_layers != c.num_kv_layers() || pool.geometry().num_kv_heads != c.num_key_value_heads) {
    return invalid_argument(fmt::format(
        "model runner: the KV pool holds {} layers x {} kv heads but the model has {} layers with a KV cache x {} kv "
        "heads",
        pool.geometry().num_layers, pool.geometry().num_kv_heads, c.num_kv_layers(), c.num_key_value_heads));
  }
  const runtime::KvModelShape shape = kv_model_shape(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.is_linear_layer(l)) {
      r->kv_index_.push_back(-1);
      continue;
    }
    GB_ASSIGN_OR_RETURN(ops::PagedKvCache view, dev.kv_layer_view(pool, shape, static_cast<int64_t>(r->kv_.size())));
    r->kv_index_.push_back(static_cast<int64_t>(r->kv_.size()));
    r->kv_.push_back(view);
  }
  // Qwen3.5's Gated DeltaNet layers run on bf16 weights also under --weight-quant (QuantizedWeights keeps
  // them: docs/quant_weights.md); its full-attention projections and experts take the quantized path above.
  if (c.num_linear_layers() > 0) {
    GB_ASSIGN_OR_RETURN(r->gdn_, GatedDeltaNet::create(checkpoint, dev, pool));
  }
  return r;
}

ForwardBatch ModelRunner::make_batch(int64_t max_tokens, int64_t max_seqs) const {
  const ModelConfig& c = config_;
  ForwardBatch fb;
  fb.max_tokens_ = max_tokens;
  fb.max_seqs_ = max_seqs;
  fb.num_layers_ = c.num_hidden_layers;
  fb.b_ = std::make_shared<ForwardBatch::Buffers>();
  ForwardBatch::Buffers& b = *fb.b_;
  b.hidden = c.hidden_size;
  b.q_size = c.q_size();
  b.q_proj = c.q_proj_size();
  b.kv_size = c.kv_size();
  b.heads = c.num_attention_heads;
  b.kv_heads = c.num_key_value_heads;
  b.head_dim = c.head_dim;
  b.topk = std::max<int64_t>(1, c.num_experts_per_tok);
  b.experts = c.num_experts;
  const auto T = static_cast<size_t>(max_tokens), H = static_cast<size_t>(c.hidden_size);
  for (auto* v : {&b.residual, &b.delta, &b.h, &b.mlp_in, &b.shared_out}) v->resize(T * H);
  b.q.resize(T * b.q_proj);
  b.qn.resize(T * b.q_size);
  b.attn.resize(T * b.q_size);
  if (c.is_qwen35()) b.attn32.resize(T * b.q_size);
  if (c.has_shared_expert()) b.shared32.resize(T * H);
  b.k.resize(T * b.kv_size);
  b.kn.resize(T * b.kv_size);
  b.v.resize(T * b.kv_size);
  b.expert_out.resize(T * b.topk * H);
  b.router_logits.resize(T * std::max<int64_t>(1, c.num_experts));
  b.topk_weights.resize(T * b.topk);
  b.topk_ids.resize(T * b.topk);
  b.zero_ids.assign(T, 0);
  b.shared_gate.resize(T);
  if (mla_) b.mla = mla_->make_scratch(max_tokens);
  if (gdn_) b.gdn = gdn_->make_scratch(max_tokens);
  b.tokens.resize(T);
  if (v4_) {
    const int64_t n = c.dsv4.hc_mult;
    b.hc = n;
    b.v4 = v4_->make_scratch(max_tokens, max_seqs);
    b.streams.resize(T * n * H);
    b.collapsed.resize(T * H);
    b.normed.resize(T * H);
    b.out32.resize(T * H);
    b.shared32.resize(T * H);
    for (auto* v : {&b.post_attn, &b.post_ffn}) v->resize(T * n);
    for (auto* v : {&b.comb_attn, &b.comb_ffn}) v->resize(T * n * n);
    b.hash_ids.resize(T * b.topk);
    b.last_streams.resize(max_seqs * n * H);
  }
  if (const runtime::DispatchRepresentation* r = dev_.moe_dispatch()) {
    b.dispatch_row_bytes = runtime::dispatch_row_bytes(*r, c.hidden_size);
    b.dispatch_rows.resize(T * static_cast<size_t>(b.dispatch_row_bytes));
    b.dispatch_x32.resize(T * H);
  }
  b.state_slots.resize(max_seqs);
  fb.mla_ = mla_.get();
  fb.v4_ = v4_.get();
  b.positions.resize(T);
  b.slots.resize(T);
  b.context_lens.resize(max_seqs);
  b.query_start.resize(max_seqs + 1);
  b.last_rows.resize(max_seqs);
  b.last_hidden.resize(max_seqs * H);
  b.rstd.resize(std::max<size_t>(T * b.heads, max_seqs));
  b.seq_ids.resize(max_seqs);
  b.row_seq.resize(T);
  b.faults.resize(max_seqs);
  return fb;
}

Status ModelRunner::norm(const TensorView& x, const TensorView& w, const TensorView& y) const {
  // rstd is required by the op's contract but unused here; a scratch view of the right shape.
  thread_local std::vector<float> rstd;
  std::vector<int64_t> shape(x.shape(), x.shape() + x.rank());
  shape.back() = 1;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (static_cast<int64_t>(rstd.size()) < n) rstd.resize(n);
  const TensorView r(rstd.data(), DType::kF32, shape.data(), static_cast<int>(shape.size()));
  const float eps = static_cast<float>(config_.rms_norm_eps);
  return config_.norm_type == NormType::kGemma ? ops::gemma_rms_norm(x, w, eps, y, r) : ops::rms_norm(x, w, eps, y, r);
}

Status ModelRunner::add_norm(const TensorView& x, const TensorView& w, const TensorView& residual,
                             const TensorView& y) const {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  return config_.norm_type == NormType::kGemma ? ops::add_gemma_rms_norm(x, w, residual, eps, y, residual)
                                               : ops::add_rms_norm(x, w, residual, eps, y, residual);
}

Status ModelRunner::begin(ForwardBatch& fb, const ForwardInput& in) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t T = static_cast<int64_t>(in.tokens.size()), S = static_cast<int64_t>(in.seq_ids.size());
  if (S == 0 || T == 0) return invalid_argument("forward: the batch has no sequences or no tokens");
  if (T > fb.max_tokens_ || S > fb.max_seqs_) {
    return invalid_argument(
        fmt::format("forward: {} tokens from {} sequences exceed the planned batch of {} tokens "
                    "from {} sequences",
                    T, S, fb.max_tokens_, fb.max_seqs_));
  }
  if (static_cast<int64_t>(in.q_lens.size()) != S) {
    return invalid_argument(fmt::format("forward: {} q_lens for {} sequences", in.q_lens.size(), S));
  }
  fb.num_tokens_ = T;
  fb.num_seqs_ = S;
  int64_t row = 0, max_blocks = 1;
  b.query_start[0] = 0;
  for (int64_t s = 0; s < S; ++s) {
    const runtime::SeqId id = in.seq_ids[s];
    const int64_t L = pool_.length(id), q = in.q_lens[s];
    if (q < 1 || q > L) {
      return invalid_argument(
          fmt::format("forward: sequence {} has {} new tokens but {} tokens in the KV pool", id, q, L));
    }
    if (row + q > T) return invalid_argument("forward: q_lens sum to more than the number of tokens");
    GB_RETURN_IF_ERROR(pool_.slots(id, L - q, L, std::span<int64_t>(b.slots).subspan(row, q)));
    for (int64_t i = 0; i < q; ++i) b.positions[row + i] = static_cast<int32_t>(L - q + i);
    for (int64_t i = 0; i < q; ++i) b.row_seq[row + i] = static_cast<int32_t>(s);
    b.seq_ids[s] = id;
    b.state_slots[s] = pool_.state_slot(id);
    b.faults[s] = ActivationFault{};
    b.context_lens[s] = static_cast<int32_t>(L);
    row += q;
    b.query_start[s + 1] = static_cast<int32_t>(row);
    b.last_rows[s] = static_cast<int32_t>(row - 1);
    // Rows hold every page the sequence owns: admission reserves pages for the whole request (prompt + every
    // token it may generate), so a sequence can own more pages than its current length needs.
    max_blocks = std::max(max_blocks, static_cast<int64_t>(pool_.block_table(id).size()));
  }
  if (row != T) return invalid_argument(fmt::format("forward: q_lens sum to {} but there are {} tokens", row, T));
  b.max_blocks = max_blocks;
  b.block_tables.resize(static_cast<size_t>(S * max_blocks));
  GB_RETURN_IF_ERROR(
      pool_.fill_block_tables(std::span<const runtime::SeqId>(b.seq_ids).first(S), max_blocks, b.block_tables));
  // Embeddings: rows of embed_tokens (bf16) copied into the residual stream.
  const int64_t H = b.hidden, V = config_.vocab_size;
  const auto* emb = w_.embed_tokens.data_as<const bf16_t>();
  const int64_t emb_stride = w_.embed_tokens.stride(0);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t tok = in.tokens[t];
    if (tok < 0 || tok >= V) {
      return invalid_argument(fmt::format("forward: token id {} is outside the vocabulary [0, {})", tok, V));
    }
    std::memcpy(b.residual.data() + t * H, emb + tok * emb_stride, static_cast<size_t>(H) * sizeof(bf16_t));
    b.tokens[t] = tok;
  }
  check_rows(fb, b.residual.data(), T, nullptr, ActivationFault::Where::kEmbedding, -1);
  if (v4_) {  // every stream starts as the embedding
    for (int64_t t = 0; t < T; ++t) {
      float* x = b.streams.data() + t * b.hc * H;
      for (int64_t i = 0; i < H; ++i) x[i] = bf16_to_float(b.residual[t * H + i]);
      for (int64_t j = 1; j < b.hc; ++j) std::memcpy(x + j * H, x, static_cast<size_t>(H) * sizeof(float));
    }
  }
  return ok_status();
}

ActivationFault::Where ModelRunner::mlp_block(int64_t layer) const {
  return w_.layers[layer].is_moe ? ActivationFault::Where::kMoe : ActivationFault::Where::kMlp;
}

void ModelRunner::check_rows(ForwardBatch& fb, const bf16_t* x, int64_t n, const int32_t* rows,
                             ActivationFault::Where where, int64_t layer) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t H = b.hidden;
  for (int64_t i = 0; i < n; ++i) {
    const bf16_t* r = x + i * H;
    // The largest magnitude as bf16 bits (order-preserving for magnitudes; NaN and Inf are >= 0x7f80): an
    // integer max that vectorizes.
    uint16_t top = 0;
    for (int64_t j = 0; j < H; ++j) top = std::max<uint16_t>(top, r[j].bits & 0x7fffu);
    const float largest = bf16_to_float(bf16_t{top});
    if (top < 0x7f80u && !(largest >= saturation_floor_)) continue;  // the common case: nothing to record
    const int64_t row = rows ? rows[i] : i;
    ActivationFault& f = b.faults[b.row_seq[row]];
    if (f.found()) continue;
    if (top >= 0x7f80u) {
      int64_t j = 0;
      while ((r[j].bits & 0x7fffu) < 0x7f80u) ++j;
      f = ActivationFault{.where = where,
                          .layer = layer,
                          .position = b.positions[row],
                          .non_finite = true,
                          .element = j,
                          .value = bf16_to_float(r[j])};
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < H; ++j) {
      const double v = bf16_to_float(r[j]);
      sum += v * v;
    }
    if (sum > static_cast<double>(std::numeric_limits<float>::max())) {
      f = ActivationFault{.where = where, .layer = layer, .position = b.positions[row], .value = largest};
    }
  }
}

void ModelRunner::check_rows_f32(ForwardBatch& fb, const float* x, int64_t n, const int32_t* rows,
                                 ActivationFault::Where where, int64_t layer) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t H = b.hidden;
  for (int64_t i = 0; i < n; ++i) {
    const float* r = x + i * H;
    float top = 0;
    bool finite = true;
    for (int64_t j = 0; j < H; ++j) {
      finite = finite && std::isfinite(r[j]);
      top = std::max(top, std::fabs(r[j]));
    }
    if (finite && !(top >= saturation_floor_)) continue;  // the common case: nothing to record
    const int64_t row = rows ? rows[i] : i;
    ActivationFault& f = b.faults[b.row_seq[row]];
    if (f.found()) continue;
    if (!finite) {
      int64_t j = 0;
      while (std::isfinite(r[j])) ++j;
      f = ActivationFault{.where = where,
                          .layer = layer,
                          .position = b.positions[row],
                          .non_finite = true,
                          .element = j,
                          .value = r[j]};
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < H; ++j) sum += static_cast<double>(r[j]) * r[j];
    if (sum > static_cast<double>(std::numeric_limits<float>::max())) {
      f = ActivationFault{.where = where, .layer = layer, .position = b.positions[row], .value = top};
    }
  }
}

Status ModelRunner::attention_block(ForwardBatch& fb, int64_t layer) const {
  if (v4_) return attention_block_v4(fb, layer);
  ForwardBatch::Buffers& b = *fb.b_;
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_, H = b.hidden, D = b.head_dim;
  const TensorView residual = bf16_view(b.residual, {T, H}), h = bf16_view(b.h, {T, H});
  if (layer == 0) {
    GB_RETURN_IF_ERROR(with_context(norm(residual, lw.input_layernorm, h), "input norm", layer));
  } else {
    GB_RETURN_IF_ERROR(
        with_context(add_norm(bf16_view(b.delta, {T, H}), lw.input_layernorm, residual, h), "input norm", layer));
    check_rows(fb, b.residual.data(), T, nullptr, mlp_block(layer - 1), layer - 1);
  }
  if (mla_) {
    const int64_t S = fb.num_seqs_;
    const runtime::AttentionBatch ab{
        .block_tables = i32_view(b.block_tables, {S, b.max_blocks}),
        .context_lens = i32_view(b.context_lens, {S}),
        .query_start_loc = i32_view(b.query_start, {S + 1}),
    };
    GB_RETURN_IF_ERROR(
        with_context(mla_->forward(*b.mla, layer, h, std::span<const int32_t>(b.positions).first(T),
                                   std::span<const int64_t>(b.slots).first(T), ab, bf16_view(b.delta, {T, H})),
                     "attention", layer));
    return post_attention(fb, layer);
  }
  if (lw.linear) {  // Qwen3.5 Gated DeltaNet
    const int64_t S = fb.num_seqs_;
    GB_RETURN_IF_ERROR(with_context(gdn_->forward(*b.gdn, layer, h, i32_view(b.state_slots, {S}),
                                                  i32_view(b.query_start, {S + 1}), bf16_view(b.delta, {T, H})),
                                    "linear attention", layer));
    return post_attention(fb, layer);
  }
  const ops::PagedKvCache& kv_cache = kv_[kv_index_[layer]];
  const TensorView q = bf16_view(b.q, {T, b.q_proj}), k = bf16_view(b.k, {T, b.kv_size}),
                   v = bf16_view(b.v, {T, b.kv_size});
  const QuantizedWeights::Layer* ql =
      quantized_ && quantized_->layer(layer).attention ? &quantized_->layer(layer) : nullptr;
  GB_RETURN_IF_ERROR(
      with_context(project(h, lw.attn.q_proj, ql ? &ql->q_proj : nullptr, q, packed(lw.attn.q_proj)), "q_proj", layer));
  GB_RETURN_IF_ERROR(
      with_context(project(h, lw.attn.k_proj, ql ? &ql->k_proj : nullptr, k, packed(lw.attn.k_proj)), "k_proj", layer));
  GB_RETURN_IF_ERROR(
      with_context(project(h, lw.attn.v_proj, ql ? &ql->v_proj : nullptr, v, packed(lw.attn.v_proj)), "v_proj", layer));
  const TensorView qn = bf16_view(b.qn, {T, b.heads, D}), kn = bf16_view(b.kn, {T, b.kv_heads, D});
  // Qwen3.5's q_proj rows hold [q | gate] per head: the query is the first head_dim of each 2 * head_dim.
  const int64_t qh = b.q_proj / b.heads;
  const TensorView q3 = TensorView::strided(b.q.data(), DType::kBF16, {T, b.heads, D}, {b.q_proj, qh, 1});
  GB_RETURN_IF_ERROR(with_context(norm(q3, lw.attn.q_norm, qn), "q_norm", layer));
  GB_RETURN_IF_ERROR(with_context(norm(bf16_view(b.k, {T, b.kv_heads, D}), lw.attn.k_norm, kn), "k_norm", layer));
  // Partial rotary (Qwen3.5): RoPE on the first rotary_dim dims of each head, the rest pass through.
  const int64_t rot = config_.rotary_dim();
  const TensorView qr =
      rot == D ? qn : TensorView::strided(b.qn.data(), DType::kBF16, {T, b.heads, rot}, {b.heads * D, D, 1});
  const TensorView kr =
      rot == D ? kn : TensorView::strided(b.kn.data(), DType::kBF16, {T, b.kv_heads, rot}, {b.kv_heads * D, D, 1});
  GB_RETURN_IF_ERROR(with_context(ops::rope(i32_view(b.positions, {T}), qr, kr, static_cast<float>(config_.rope_theta)),
                                  "rope", layer));
  const TensorView v3 = bf16_view(b.v, {T, b.kv_heads, D});
  GB_RETURN_IF_ERROR(
      with_context(dev_.write_kv(kv_cache, kn, v3, std::span<const int64_t>(b.slots).first(T)), "kv write", layer));
  const int64_t S = fb.num_seqs_;
  const runtime::AttentionBatch ab{
      .block_tables = i32_view(b.block_tables, {S, b.max_blocks}),
      .context_lens = i32_view(b.context_lens, {S}),
      .query_start_loc = i32_view(b.query_start, {S + 1}),
  };
  const TensorView delta = bf16_view(b.delta, {T, H});
  if (config_.is_qwen35()) {
    // The output gate, attn * sigmoid(gate) (gate = the second head_dim of each q_proj head), on the fp32
    // attention output: one rounding less before o_proj (docs/models.md, "Accuracy").
    const TensorView attn = f32_view(b.attn32, {T, b.heads, D});
    GB_RETURN_IF_ERROR(with_context(dev_.attention(qn, kv_cache, ab, 1.0f / std::sqrt(static_cast<float>(D)), attn),
                                    "attention", layer));
    const TensorView gate = TensorView::strided(b.q.data() + D, DType::kBF16, {T, b.heads, D}, {b.q_proj, qh, 1});
    GB_RETURN_IF_ERROR(with_context(ops::sigmoid_mul(attn, gate, attn), "output gate", layer));
    GB_RETURN_IF_ERROR(with_context(project(f32_view(b.attn32, {T, b.q_size}), lw.attn.o_proj,
                                            ql ? &ql->o_proj : nullptr, delta, packed(lw.attn.o_proj)),
                                    "o_proj", layer));
    return post_attention(fb, layer);
  }
  const TensorView attn = bf16_view(b.attn, {T, b.heads, D});
  GB_RETURN_IF_ERROR(with_context(dev_.attention(qn, kv_cache, ab, 1.0f / std::sqrt(static_cast<float>(D)), attn),
                                  "attention", layer));
  GB_RETURN_IF_ERROR(with_context(project(bf16_view(b.attn, {T, b.q_size}), lw.attn.o_proj, ql ? &ql->o_proj : nullptr,
                                          delta, packed(lw.attn.o_proj)),
                                  "o_proj", layer));
  return post_attention(fb, layer);
}

Status ModelRunner::post_attention(ForwardBatch& fb, int64_t layer) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_, H = b.hidden;
  const TensorView residual = bf16_view(b.residual, {T, H}), delta = bf16_view(b.delta, {T, H});
  const TensorView mlp_in = bf16_view(b.mlp_in, {T, H});
  GB_RETURN_IF_ERROR(
      with_context(add_norm(delta, lw.post_attention_layernorm, residual, mlp_in), "post-attention norm", layer));
  check_rows(fb, b.residual.data(), T, nullptr, ActivationFault::Where::kAttention, layer);
  if (!lw.is_moe && quantized_ && quantized_->layer(layer).dense) {
    GB_RETURN_IF_ERROR(with_context(
        ops::quant_expert_ffn(mlp_in, i32_view(b.zero_ids, {T, 1}), std::span(&quantized_->layer(layer).dense_mlp, 1),
                              0, 1, bf16_view(b.delta, {T, 1, H})),
        "dense mlp", layer));
  } else if (!lw.is_moe) {
    const ops::ExpertWeights dense = as_expert(lw.dense);
    GB_RETURN_IF_ERROR(with_context(ops::expert_ffn(mlp_in, i32_view(b.zero_ids, {T, 1}), std::span(&dense, 1), 0, 1,
                                                    bf16_view(b.delta, {T, 1, H})),
                                    "dense mlp", layer));
  }
  return ok_status();
}

Status ModelRunner::route(ForwardBatch& fb, int64_t layer) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_;
  const TensorView logits = f32_view(b.router_logits, {T, b.experts});
  GB_RETURN_IF_ERROR(with_context(ops::linear(fb.moe_input(), lw.moe.router, logits), "router", layer));
  if (config_.is_deepseek_v4()) {
    const DeepseekV4Config& d = config_.dsv4;
    TensorView hash;
    if (layer < d.num_hash_layers) {  // the experts are the token's row of tid2eid
      const TensorView& table = lw.tid2eid;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < b.topk; ++j) {
          const int64_t at = b.tokens[t] * table.stride(0) + j * table.stride(1);
          b.hash_ids[t * b.topk + j] = table.dtype() == DType::kI64
                                           ? static_cast<int32_t>(table.data_as<const int64_t>()[at])
                                           : table.data_as<const int32_t>()[at];
        }
      }
      hash = i32_view(b.hash_ids, {T, b.topk});
    }
    GB_RETURN_IF_ERROR(with_context(
        ops::sqrt_softplus_router(logits, hash.data() ? TensorView() : lw.moe.e_score_correction_bias, hash,
                                  config_.norm_topk_prob, static_cast<float>(d.routed_scaling_factor), fb.topk_ids(),
                                  fb.topk_weights()),
        "sqrt-softplus routing", layer));
  } else if (config_.is_deepseek()) {
    const DeepseekConfig& d = config_.deepseek;
    const ops::GroupedTopkParams p{d.n_group, d.topk_group, config_.norm_topk_prob,
                                   static_cast<float>(d.routed_scaling_factor)};
    GB_RETURN_IF_ERROR(with_context(
        ops::grouped_topk_router(logits, lw.moe.e_score_correction_bias, p, fb.topk_ids(), fb.topk_weights()),
        "grouped top-k", layer));
  } else {
    GB_RETURN_IF_ERROR(with_context(ops::topk_router(logits, config_.norm_topk_prob, fb.topk_ids(), fb.topk_weights()),
                                    "top-k", layer));
  }
  if (b.choice_sink) {  // kept until the forward ends: the next layer's routing overwrites topk_ids
    const size_t n = static_cast<size_t>(T * b.topk), at = static_cast<size_t>(layer * fb.max_tokens_ * b.topk);
    std::memcpy(b.choice_ids.data() + at, b.topk_ids.data(), n * sizeof(int32_t));
    std::memcpy(b.choice_weights.data() + at, b.topk_weights.data(), n * sizeof(float));
  }
  // The quantize-at-dispatch point, the same for the monolithic engine and an AFD attention rank: the routed
  // experts compute from these rows wherever they run (the shared experts keep moe_input()).
  if (const runtime::DispatchRepresentation* r = dev_.moe_dispatch()) {
    return with_context(runtime::quantize_dispatch(*r, fb.moe_input(), fb.moe_dispatch_rows()), "MoE dispatch", layer);
  }
  return ok_status();
}

void ModelRunner::emit_choices(ForwardBatch& fb) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t T = fb.num_tokens_, k = b.topk, page = pool_.geometry().page_size;
  // V4's selection is compressed-entry indices already; V3.2's is in the DeviceOperator's top-k contract.
  const bool slots = !v4_ && dev_.topk_index_format() != ops::TopkIndexFormat::kSequencePositions;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = b.row_seq[t];
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      TokenChoices c{.seq_index = s, .position = b.positions[t], .layer = l};
      if (w_.layers[l].is_moe) {
        const size_t at = static_cast<size_t>((l * fb.max_tokens_ + t) * k);
        c.expert_ids = std::span<const int32_t>(b.choice_ids).subspan(at, k);
        c.expert_weights = std::span<const float>(b.choice_weights).subspan(at, k);
      }
      if (const TensorView sel = fb.index_selection(l); sel.data() != nullptr) {
        // The DeviceOperator's top-k index contract (sequence positions or flat KV slots, -1 padded) as
        // sequence positions: a slot's block is found in the sequence's block table.
        b.choice_positions.clear();
        const int32_t* row = sel.data_as<const int32_t>() + t * sel.stride(0);
        for (int64_t j = 0; j < sel.dim(1); ++j) {
          const int32_t v = row[j * sel.stride(1)];
          if (v < 0) continue;
          if (!slots) {
            b.choice_positions.push_back(v);
            continue;
          }
          const int32_t* table = b.block_tables.data() + s * b.max_blocks;
          for (int64_t blk = 0; blk < b.max_blocks; ++blk) {
            if (table[blk] == v / page) {
              b.choice_positions.push_back(static_cast<int32_t>(blk * page + v % page));
              break;
            }
          }
        }
        std::sort(b.choice_positions.begin(), b.choice_positions.end());
        c.index_positions = b.choice_positions;
      }
      if (!c.expert_ids.empty() || !c.index_positions.empty()) (*b.choice_sink)(c);
    }
  }
}

Status ModelRunner::local_experts(ForwardBatch& fb, int64_t layer, int64_t expert_begin, int64_t expert_end) const {
  if (const runtime::DispatchRepresentation* r = dev_.moe_dispatch()) {
    ForwardBatch::Buffers& b = *fb.b_;
    return with_context(
        experts_.compute_dispatched(layer, *r, fb.moe_dispatch_rows(), fb.topk_ids(), expert_begin, expert_end,
                                    fb.expert_out(), f32_view(b.dispatch_x32, {fb.num_tokens_, b.hidden})),
        "experts", layer);
  }
  return with_context(experts_.compute(layer, fb.moe_input(), fb.topk_ids(), expert_begin, expert_end, fb.expert_out()),
                      "experts", layer);
}

Status ModelRunner::finish_moe(ForwardBatch& fb, int64_t layer, const TensorView* expert_out) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const TensorView outs = expert_out ? *expert_out : fb.expert_out();
  if (v4_) return finish_moe_v4(fb, layer, outs);
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_, H = b.hidden;
  const TensorView delta = bf16_view(b.delta, {T, H});
  if (config_.is_deepseek() && config_.deepseek.n_shared_experts > 0) {  // ungated shared experts
    const TensorView shared_out = bf16_view(b.shared_out, {T, H});
    if (quantized_ && quantized_->layer(layer).shared) {
      GB_RETURN_IF_ERROR(with_context(ops::quant_expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}),
                                                            std::span(&quantized_->layer(layer).shared_expert, 1), 0, 1,
                                                            bf16_view(b.shared_out, {T, 1, H})),
                                      "shared experts", layer));
    } else {
      const ops::ExpertWeights shared = as_expert(lw.moe.shared_expert);
      GB_RETURN_IF_ERROR(with_context(ops::expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}),
                                                      std::span(&shared, 1), 0, 1, bf16_view(b.shared_out, {T, 1, H})),
                                      "shared experts", layer));
    }
    return with_context(ops::moe_combine(outs, fb.topk_weights(), delta, &shared_out, nullptr), "combine", layer);
  }
  if (!config_.has_shared_expert()) {
    return with_context(ops::moe_combine(outs, fb.topk_weights(), delta), "combine", layer);
  }
  // The gated shared expert's output stays fp32 into the combine (one rounding less; docs/models.md, "Accuracy").
  const ops::ExpertWeights shared = as_expert(lw.moe.shared_expert);
  const TensorView shared_out = f32_view(b.shared32, {T, H});
  if (quantized_ && quantized_->layer(layer).shared) {
    GB_RETURN_IF_ERROR(with_context(ops::quant_expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}),
                                                          std::span(&quantized_->layer(layer).shared_expert, 1), 0, 1,
                                                          f32_view(b.shared32, {T, 1, H})),
                                    "shared expert", layer));
  } else {
    GB_RETURN_IF_ERROR(with_context(ops::expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}), std::span(&shared, 1),
                                                    0, 1, f32_view(b.shared32, {T, 1, H})),
                                    "shared expert", layer));
  }
  const TensorView gate = f32_view(b.shared_gate, {T, 1});
  GB_RETURN_IF_ERROR(with_context(ops::linear(fb.moe_input(), lw.moe.shared_expert_gate, gate), "shared gate", layer));
  return with_context(ops::moe_combine(outs, fb.topk_weights(), delta, &shared_out, &gate), "combine", layer);
}

Status ModelRunner::logits(ForwardBatch& fb, std::span<float> out) const {
  if (v4_) return logits_v4(fb, out);
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t S = fb.num_seqs_, H = b.hidden, V = config_.vocab_size;
  if (static_cast<int64_t>(out.size()) < S * V) {
    return invalid_argument(
        fmt::format("forward: logits buffer holds {} values but {} x {} are needed", out.size(), S, V));
  }
  // Only the last position of each sequence is needed: gather its delta and residual rows, then the final
  // add+norm (row-wise, so identical to normalising every row) and the LM head.
  std::vector<bf16_t>& last_delta = b.shared_out;  // free at this point
  for (int64_t s = 0; s < S; ++s) {
    const int64_t r = b.last_rows[s];
    std::memcpy(last_delta.data() + s * H, b.delta.data() + r * H, H * sizeof(bf16_t));
    std::memcpy(b.last_hidden.data() + s * H, b.residual.data() + r * H, H * sizeof(bf16_t));
  }
  const TensorView d = bf16_view(last_delta, {S, H}), res = bf16_view(b.last_hidden, {S, H}),
                   y = bf16_view(b.h, {S, H});
  GB_RETURN_IF_ERROR(with_context(add_norm(d, w_.final_norm, res, y), "final norm", config_.num_hidden_layers));
  const int64_t last = config_.num_hidden_layers - 1;
  check_rows(fb, b.last_hidden.data(), S, b.last_rows.data(), mlp_block(last), last);
  if (b.choice_sink) emit_choices(fb);
  return ops::linear(y, w_.lm_head, TensorView(out.data(), DType::kF32, {S, V}), nullptr, packed(w_.lm_head));
}

Status ModelRunner::attention_block_v4(ForwardBatch& fb, int64_t layer) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_, S = fb.num_seqs_, H = b.hidden, n = b.hc;
  const ops::HyperConnectionParams hp{static_cast<float>(config_.rms_norm_eps), static_cast<float>(config_.dsv4.hc_eps),
                                      config_.dsv4.hc_sinkhorn_iters};
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // The blocks' inputs stay fp32 up to the attention's projections; the MoE's input is rounded to bf16 once.
  const TensorView streams = f32_view(b.streams, {T, n, H}), collapsed = f32_view(b.collapsed, {T, H});
  // The attention's output (and the MoE's, finish_moe_v4) enter the streams in fp32.
  const TensorView normed = f32_view(b.normed, {T, H}), delta = f32_view(b.out32, {T, H});
  const TensorView rstd = f32_view(b.rstd, {T, 1});
  GB_RETURN_IF_ERROR(with_context(ops::hc_pre(streams, lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale, hp, collapsed,
                                              f32_view(b.post_attn, {T, n}), f32_view(b.comb_attn, {T, n, n})),
                                  "attention hyper-connection", layer));
  check_rows_f32(fb, b.collapsed.data(), T, nullptr,
                 layer == 0 ? ActivationFault::Where::kEmbedding : mlp_block(layer - 1), layer - 1);
  GB_RETURN_IF_ERROR(with_context(ops::rms_norm(collapsed, v4_norm(v4_norms_[layer].attn), eps, normed, rstd),
                                  "attention norm", layer));
  const V4AttentionBatch ab{.positions = std::span<const int32_t>(b.positions).first(T),
                            .query_start = std::span<const int32_t>(b.query_start).first(S + 1),
                            .state_slots = std::span<const int32_t>(b.state_slots).first(S),
                            .block_tables = std::span<const int32_t>(b.block_tables).first(S * b.max_blocks),
                            .max_blocks = b.max_blocks};
  GB_RETURN_IF_ERROR(with_context(v4_->forward(*b.v4, layer, normed, ab, delta), "attention", layer));
  GB_RETURN_IF_ERROR(with_context(
      ops::hc_post(delta, f32_view(b.post_attn, {T, n}), f32_view(b.comb_attn, {T, n, n}), streams, streams),
      "attention hyper-connection", layer));
  GB_RETURN_IF_ERROR(with_context(ops::hc_pre(streams, lw.hc_ffn.fn, lw.hc_ffn.base, lw.hc_ffn.scale, hp, collapsed,
                                              f32_view(b.post_ffn, {T, n}), f32_view(b.comb_ffn, {T, n, n})),
                                  "MoE hyper-connection", layer));
  check_rows_f32(fb, b.collapsed.data(), T, nullptr, ActivationFault::Where::kAttention, layer);
  GB_RETURN_IF_ERROR(
      with_context(ops::rms_norm(collapsed, v4_norm(v4_norms_[layer].ffn), eps, normed, rstd), "MoE norm", layer));
  float_to_bf16_n(b.normed.data(), b.mlp_in.data(), static_cast<size_t>(T * H));
  return ok_status();
}

Status ModelRunner::finish_moe_v4(ForwardBatch& fb, int64_t layer, const TensorView& outs) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const LayerWeights& lw = w_.layers[layer];
  const int64_t T = fb.num_tokens_, H = b.hidden, n = b.hc;
  const TensorView y = f32_view(b.out32, {T, H}), shared_out = f32_view(b.shared32, {T, H});
  // The shared expert (ungated, the routed experts' SwiGLU clamp), quantized when --weight-quant quantized it.
  if (quantized_ && quantized_->layer(layer).shared) {
    GB_RETURN_IF_ERROR(with_context(ops::quant_expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}),
                                                          std::span(&quantized_->layer(layer).shared_expert, 1), 0, 1,
                                                          f32_view(b.shared32, {T, 1, H}), model_swiglu_limit(config_)),
                                    "shared experts", layer));
  } else {
    const ops::ExpertWeights shared = as_expert(lw.moe.shared_expert);
    GB_RETURN_IF_ERROR(with_context(ops::expert_ffn(fb.moe_input(), i32_view(b.zero_ids, {T, 1}), std::span(&shared, 1),
                                                    0, 1, f32_view(b.shared32, {T, 1, H}), model_swiglu_limit(config_)),
                                    "shared experts", layer));
  }
  GB_RETURN_IF_ERROR(
      with_context(ops::moe_combine(outs, fb.topk_weights(), y, &shared_out, nullptr), "combine", layer));
  const TensorView streams = f32_view(b.streams, {T, n, H});
  return with_context(ops::hc_post(y, f32_view(b.post_ffn, {T, n}), f32_view(b.comb_ffn, {T, n, n}), streams, streams),
                      "MoE hyper-connection", layer);
}

Status ModelRunner::logits_v4(ForwardBatch& fb, std::span<float> out) const {
  ForwardBatch::Buffers& b = *fb.b_;
  const int64_t S = fb.num_seqs_, H = b.hidden, V = config_.vocab_size, n = b.hc;
  if (static_cast<int64_t>(out.size()) < S * V) {
    return invalid_argument(
        fmt::format("forward: logits buffer holds {} values but {} x {} are needed", out.size(), S, V));
  }
  // Only the last position of each sequence is needed: its streams, collapsed by the head, the final norm, the
  // LM head.
  for (int64_t s = 0; s < S; ++s) {
    std::memcpy(b.last_streams.data() + s * n * H, b.streams.data() + b.last_rows[s] * n * H,
                static_cast<size_t>(n * H) * sizeof(float));
  }
  const ops::HyperConnectionParams hp{static_cast<float>(config_.rms_norm_eps), static_cast<float>(config_.dsv4.hc_eps),
                                      config_.dsv4.hc_sinkhorn_iters};
  const TensorView collapsed = f32_view(b.collapsed, {S, H}), y = f32_view(b.normed, {S, H});
  GB_RETURN_IF_ERROR(with_context(ops::hc_head(f32_view(b.last_streams, {S, n, H}), w_.hc_head.fn, w_.hc_head.base,
                                               w_.hc_head.scale, hp, collapsed),
                                  "head hyper-connection", config_.num_hidden_layers));
  const int64_t last = config_.num_hidden_layers - 1;
  check_rows_f32(fb, b.collapsed.data(), S, b.last_rows.data(), mlp_block(last), last);
  GB_RETURN_IF_ERROR(with_context(ops::rms_norm(collapsed, v4_norm(v4_final_norm_),
                                                static_cast<float>(config_.rms_norm_eps), y, f32_view(b.rstd, {S, 1})),
                                  "final norm", config_.num_hidden_layers));
  if (b.choice_sink) emit_choices(fb);
  return ops::linear(y, w_.lm_head, TensorView(out.data(), DType::kF32, {S, V}), nullptr, packed(w_.lm_head));
}

const char* forward_phase_name(ForwardPhase phase) {
  static constexpr const char* kNames[kNumForwardPhases] = {"embed",   "attention", "route",
                                                            "experts", "combine",   "logits"};
  return kNames[static_cast<int>(phase)];
}

Status ModelRunner::forward(ForwardBatch& fb, const ForwardInput& in, std::span<float> out,
                            const ForwardPhaseObserver* observer) const {
  // Runs one phase, telling the observer (when there is one) how long it took.
  auto phase = [observer](ForwardPhase p, int64_t layer, auto&& run) -> Status {
    if (!observer) return run();
    const auto now = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    const int64_t t0 = now();
    Status s = run();
    (*observer)(p, layer, t0, now());
    return s;
  };
  GB_RETURN_IF_ERROR(phase(ForwardPhase::kEmbed, -1, [&] { return begin(fb, in); }));
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    GB_RETURN_IF_ERROR(phase(ForwardPhase::kAttention, l, [&] { return attention_block(fb, l); }));
    if (config_.is_moe_layer(l)) {
      GB_RETURN_IF_ERROR(phase(ForwardPhase::kRoute, l, [&] { return route(fb, l); }));
      GB_RETURN_IF_ERROR(
          phase(ForwardPhase::kExperts, l, [&] { return local_experts(fb, l, 0, config_.num_experts); }));
      GB_RETURN_IF_ERROR(phase(ForwardPhase::kCombine, l, [&] { return finish_moe(fb, l); }));
    }
  }
  return phase(ForwardPhase::kLogits, -1, [&] { return logits(fb, out); });
}

}  // namespace genbridge::model
