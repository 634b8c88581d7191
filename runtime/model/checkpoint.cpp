#include "runtime/model/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "genbridge/core/threading.h"

namespace genbridge::model {

std::string layer_tensor_name(int64_t layer, std::string_view suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

std::string expert_tensor_name(int64_t layer, int64_t expert, std::string_view proj) {
  return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, proj);
}

// Binds tensors by name to typed views, checking shape and dtype; records every name it used.
class WeightBinder {
 public:
  WeightBinder(Checkpoint& ckpt, const LoadOptions& options) : ckpt_(ckpt), options_(options) {}

  // `shape_rule` spells the expected shape in config terms, e.g. "[num_experts, hidden_size]";
  // `why` says why the config needs the tensor.
  Result<TensorView> bind(const std::string& name, std::vector<int64_t> shape, std::string_view shape_rule,
                          std::string_view why) {
    const TensorStore& store = *ckpt_.store_;
    const TensorStore::Entry* e = store.find(name);
    if (!e) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' is missing ({} requires it: {})", store.source(), name, kConfigFileName, why));
    }
    used_.insert(name);
    GB_ASSIGN_OR_RETURN(TensorView v, e->file->view(*e->tensor));
    if (e->tensor->shape != shape) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' has shape {} but {} requires {} = {}", e->file->path(), name, v.shape_string(),
          kConfigFileName, TensorView(nullptr, v.dtype(), shape.data(), static_cast<int>(shape.size())).shape_string(),
          shape_rule));
    }
    if (options_.precision == WeightPrecision::kNative || v.dtype() == DType::kBF16) {
      ckpt_.mapped_weight_bytes_ += e->tensor->nbytes;
      return v;
    }
    // Convert F16 / F32 to bf16 into an owned buffer (one rounding, to nearest even), in parallel chunks
    // (element-wise: the result does not depend on the thread count).
    const int64_t n = v.numel();
    std::unique_ptr<bf16_t[]> out(new bf16_t[static_cast<size_t>(n)]);  // uninitialised: written once below
    constexpr int64_t kChunk = 1 << 14;
    const bool f32 = v.dtype() == DType::kF32;
    parallel_for((n + kChunk - 1) / kChunk, kChunk, [&](int64_t b, int64_t e) {
      float tmp[kChunk];
      for (int64_t c = b; c < e; ++c) {
        const int64_t i = c * kChunk, m = std::min(kChunk, n - i);
        if (f32) {
          float_to_bf16_n(v.data_as<const float>() + i, out.get() + i, static_cast<size_t>(m));
        } else {
          fp16_to_float_n(v.data_as<const fp16_t>() + i, tmp, static_cast<size_t>(m));
          float_to_bf16_n(tmp, out.get() + i, static_cast<size_t>(m));
        }
      }
    });
    ckpt_.converted_weight_bytes_ += static_cast<uint64_t>(n) * sizeof(bf16_t);
    TensorView bv(out.get(), DType::kBF16, shape.data(), static_cast<int>(shape.size()));
    ckpt_.converted_.push_back(std::move(out));
    return bv;
  }

  Result<MlpWeights> bind_mlp(const std::string& prefix, int64_t hidden, int64_t inter, std::string_view inter_key,
                              std::string_view why) {
    MlpWeights m;
    const std::string io = fmt::format("[{}, hidden_size]", inter_key);
    const std::string oi = fmt::format("[hidden_size, {}]", inter_key);
    GB_ASSIGN_OR_RETURN(m.gate_proj, bind(prefix + "gate_proj.weight", {inter, hidden}, io, why));
    GB_ASSIGN_OR_RETURN(m.up_proj, bind(prefix + "up_proj.weight", {inter, hidden}, io, why));
    GB_ASSIGN_OR_RETURN(m.down_proj, bind(prefix + "down_proj.weight", {hidden, inter}, oi, why));
    return m;
  }

  Status bind_all() {
    const ModelConfig& c = ckpt_.config_;
    ModelWeights& w = ckpt_.weights_;
    const int64_t h = c.hidden_size;
    GB_ASSIGN_OR_RETURN(w.embed_tokens, bind("model.embed_tokens.weight", {c.vocab_size, h},
                                             "[vocab_size, hidden_size]", "the token embedding"));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      LayerWeights lw;
      const std::string why_layer = fmt::format("num_hidden_layers = {}", c.num_hidden_layers);
      const auto name = [&](std::string_view s) { return layer_tensor_name(l, s); };
      GB_ASSIGN_OR_RETURN(lw.input_layernorm, bind(name("input_layernorm.weight"), {h}, "[hidden_size]", why_layer));
      GB_ASSIGN_OR_RETURN(lw.post_attention_layernorm,
                          bind(name("post_attention_layernorm.weight"), {h}, "[hidden_size]", why_layer));
      AttentionWeights& a = lw.attn;
      GB_ASSIGN_OR_RETURN(a.q_proj, bind(name("self_attn.q_proj.weight"), {c.q_size(), h},
                                         "[num_attention_heads * head_dim, hidden_size]", why_layer));
      GB_ASSIGN_OR_RETURN(a.k_proj, bind(name("self_attn.k_proj.weight"), {c.kv_size(), h},
                                         "[num_key_value_heads * head_dim, hidden_size]", why_layer));
      GB_ASSIGN_OR_RETURN(a.v_proj, bind(name("self_attn.v_proj.weight"), {c.kv_size(), h},
                                         "[num_key_value_heads * head_dim, hidden_size]", why_layer));
      GB_ASSIGN_OR_RETURN(a.o_proj, bind(name("self_attn.o_proj.weight"), {h, c.q_size()},
                                         "[hidden_size, num_attention_heads * head_dim]", why_layer));
      GB_ASSIGN_OR_RETURN(a.q_norm, bind(name("self_attn.q_norm.weight"), {c.head_dim}, "[head_dim]", why_layer));
      GB_ASSIGN_OR_RETURN(a.k_norm, bind(name("self_attn.k_norm.weight"), {c.head_dim}, "[head_dim]", why_layer));
      lw.is_moe = c.is_moe_layer(l);
      if (lw.is_moe) {
        const std::string why = fmt::format("layer {} is an MoE layer with num_experts = {}", l, c.num_experts);
        GB_ASSIGN_OR_RETURN(lw.moe.router,
                            bind(name("mlp.gate.weight"), {c.num_experts, h}, "[num_experts, hidden_size]", why));
        for (int64_t e = 0; e < c.num_experts; ++e) {
          GB_ASSIGN_OR_RETURN(MlpWeights m, bind_mlp(fmt::format("model.layers.{}.mlp.experts.{}.", l, e), h,
                                                     c.moe_intermediate_size, "moe_intermediate_size", why));
          lw.moe.experts.push_back(m);
        }
        if (c.has_shared_expert()) {
          const std::string why_shared =
              fmt::format("shared_expert_intermediate_size = {}", c.shared_expert_intermediate_size);
          GB_ASSIGN_OR_RETURN(lw.moe.shared_expert,
                              bind_mlp(name("mlp.shared_expert."), h, c.shared_expert_intermediate_size,
                                       "shared_expert_intermediate_size", why_shared));
          GB_ASSIGN_OR_RETURN(lw.moe.shared_expert_gate,
                              bind(name("mlp.shared_expert_gate.weight"), {1, h}, "[1, hidden_size]", why_shared));
        }
      } else {
        const std::string why = fmt::format("layer {} is dense (mlp_only_layers / decoder_sparse_step)", l);
        GB_ASSIGN_OR_RETURN(lw.dense, bind_mlp(name("mlp."), h, c.intermediate_size, "intermediate_size", why));
      }
      w.layers.push_back(std::move(lw));
    }
    GB_ASSIGN_OR_RETURN(w.final_norm, bind("model.norm.weight", {h}, "[hidden_size]", "the final norm"));
    if (c.tie_word_embeddings) {
      w.lm_head = w.embed_tokens;
      used_.insert("lm_head.weight");  // a tied checkpoint may still carry a copy; it is ignored
    } else {
      GB_ASSIGN_OR_RETURN(w.lm_head, bind("lm_head.weight", {c.vocab_size, h}, "[vocab_size, hidden_size]",
                                          "tie_word_embeddings is false"));
    }
    // A tensor the model does not use means config.json and the weights disagree (e.g. more experts).
    size_t unused = 0;
    std::string first;
    const TensorStore& store = *ckpt_.store_;
    for (const std::string& n : store.names()) {
      if (!used_.count(n)) {
        if (unused++ == 0) first = n;
      }
    }
    if (unused > 0) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' is not used by the model {} describes ({} unused tensor{}; config and weights disagree)",
          store.find(first)->file->path(), first, kConfigFileName, unused, unused == 1 ? "" : "s"));
    }
    return ok_status();
  }

 private:
  Checkpoint& ckpt_;
  const LoadOptions& options_;
  std::set<std::string> used_;
};

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& dir, const LoadOptions& options) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  ckpt.precision_ = options.precision;
  GB_ASSIGN_OR_RETURN(ckpt.config_, load_model_config(dir / kConfigFileName));
  MapOptions map_options;
  map_options.populate = options.populate;
  GB_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(dir, map_options));
  ckpt.store_ = std::make_unique<TensorStore>(std::move(store));
  WeightBinder binder(ckpt, options);
  GB_RETURN_IF_ERROR(binder.bind_all());
  return ckpt;
}

}  // namespace genbridge::model
