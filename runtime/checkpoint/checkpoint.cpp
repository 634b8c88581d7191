#include "runtime/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <set>

#include "genbridge/core/threading.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/checkpoint/deepseek_v4_weights.h"
#include "runtime/checkpoint/deepseek_weights.h"
#include "runtime/checkpoint/file_access.h"
#include "runtime/checkpoint/fp8_checkpoint.h"
#include "runtime/checkpoint/qwen35_config.h"

namespace genbridge::model {

std::string layer_tensor_name(int64_t layer, std::string_view suffix, std::string_view prefix) {
  return fmt::format("{}layers.{}.{}", prefix, layer, suffix);
}

std::string expert_tensor_name(int64_t layer, int64_t expert, std::string_view proj) {
  return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", layer, expert, proj);
}

// Binds tensors by name to typed views, checking shape and dtype; records every name it used.
class WeightBinder {
 public:
  WeightBinder(Checkpoint& ckpt, const LoadOptions& options, std::optional<Fp8QuantizationConfig> fp8 = std::nullopt)
      : ckpt_(ckpt), options_(options) {
    if (fp8) {
      fp8_ = fp8->block;
      not_converted_.insert(fp8->modules_not_converted.begin(), fp8->modules_not_converted.end());
    }
  }

  // `shape_rule` spells the expected shape in config terms, e.g. "[num_experts, hidden_size]";
  // `why` says why the config needs the tensor.
  // `keep_dtype`: bind the file's tensor as it is even when bf16 weights are asked for.
  // `keep_f32`: bind an F32 tensor as it is (other dtypes convert to bf16 as usual).
  Result<TensorView> bind(const std::string& name, std::vector<int64_t> shape, std::string_view shape_rule,
                          std::string_view why, bool keep_dtype = false, bool keep_f32 = false) {
    const TensorStore& store = *ckpt_.store_;
    const TensorStore::Entry* e = store.find(name);
    if (!e) return missing(name, why);
    used_.insert(name);
    if (e->tensor->dtype.rfind("F8_", 0) == 0) {
      if (!fp8_) {
        return invalid_argument(fmt::format(
            "{}: tensor '{}' has dtype {} but {} has no quantization_config; an FP8 checkpoint's config says how "
            "its codes are scaled (quantization_config: {{\"quant_method\": \"fp8\", \"weight_block_size\": [128, "
            "128]}} with a '<name>_scale_inv' per weight, docs/quant_weights.md)",
            e->file->path(), name, e->tensor->dtype, kConfigFileName));
      }
      if (e->tensor->dtype != "F8_E4M3") {
        return invalid_argument(
            fmt::format("{}: tensor '{}' has dtype {} but quantization_config.fmt is e4m3: genbridge reads F8_E4M3 "
                        "codes (and BF16, F16 and F32 tensors)",
                        e->file->path(), name, e->tensor->dtype));
      }
      return bind_fp8(name, *e, shape, shape_rule);
    }
    GB_ASSIGN_OR_RETURN(TensorView v, e->file->view(*e->tensor));
    if (e->tensor->shape != shape) return wrong_shape(*e, name, shape, shape_rule);
    if (keep_dtype || options_.precision == WeightPrecision::kNative || v.dtype() == DType::kBF16 ||
        (keep_f32 && v.dtype() == DType::kF32)) {
      ckpt_.mapped_weight_bytes_ += e->tensor->nbytes;
      ckpt_.bound_.push_back({name, e->file->path(), v, false});
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
    ckpt_.bound_.push_back({name, e->file->path(), bv, true});
    return bv;
  }

  Status missing(const std::string& name, std::string_view why) const {
    return invalid_argument(fmt::format("{}: tensor '{}' is missing ({} requires it: {})", ckpt_.store_->source(), name,
                                        kConfigFileName, why));
  }

  Status wrong_shape(const TensorStore::Entry& e, const std::string& name, const std::vector<int64_t>& shape,
                     std::string_view shape_rule) const {
    const auto text = [](const std::vector<int64_t>& v) {
      return TensorView(nullptr, DType::kBF16, v.data(), static_cast<int>(v.size())).shape_string();
    };
    return invalid_argument(fmt::format("{}: tensor '{}' has shape {} but {} requires {} = {}", e.file->path(), name,
                                        text(e.tensor->shape), kConfigFileName, text(shape), shape_rule));
  }

  // A tensor the model keeps in F32 whatever the precision asked for (DeepSeek-V4's hyper-connection weights,
  // attention sinks, compressor position biases and gate biases, which DeepSeek ships in F32): the file must
  // hold F32.
  Result<TensorView> bind_f32(const std::string& name, std::vector<int64_t> shape, std::string_view shape_rule,
                              std::string_view why) {
    if (const TensorStore::Entry* e = ckpt_.store_->find(name); e && e->tensor->dtype != "F32") {
      used_.insert(name);
      return invalid_argument(fmt::format(
          "{}: tensor '{}' has dtype {} but must be F32 (DeepSeek-V4 ships it in F32 and genbridge binds it as it is)",
          e->file->path(), name, e->tensor->dtype));
    }
    return bind(name, std::move(shape), shape_rule, why, /*keep_dtype=*/true);
  }

  // An integer table (I64 or I32, bound as in the file, zero-copy) whose elements must lie in [0, limit):
  // DeepSeek-V4's ffn.gate.tid2eid [vocab, k] expert ids, checked here once so that the forward never reads an
  // expert that does not exist. Not in bound_ (check_finite scans float weights).
  Result<TensorView> bind_ids(const std::string& name, std::vector<int64_t> shape, std::string_view shape_rule,
                              std::string_view why, int64_t limit, std::string_view limit_rule) {
    const TensorStore::Entry* e = ckpt_.store_->find(name);
    if (!e) return missing(name, why);
    used_.insert(name);
    const std::string& dt = e->tensor->dtype;
    if (dt != "I64" && dt != "I32") {
      return invalid_argument(fmt::format("{}: tensor '{}' has dtype {} but must be I64 or I32 (expert ids; {})",
                                          e->file->path(), name, dt, why));
    }
    if (e->tensor->shape != shape) return wrong_shape(*e, name, shape, shape_rule);
    const DType type = dt == "I64" ? DType::kI64 : DType::kI32;
    const size_t es = dtype_size(type);
    if (e->tensor->offset % es != 0) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' starts at file offset {}, not aligned to its {}-byte elements", e->file->path(),
                      name, e->tensor->offset, es));
    }
    const std::byte* p = e->file->mapping().data() + e->tensor->offset;
    const int64_t cols = shape.empty() ? 1 : shape.back(), count = e->tensor->numel();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t id =
          type == DType::kI64 ? reinterpret_cast<const int64_t*>(p)[i] : reinterpret_cast<const int32_t*>(p)[i];
      if (id < 0 || id >= limit) {
        return invalid_argument(fmt::format("{}: tensor '{}' row {} holds {} in column {}, outside [0, {}) ({})",
                                            e->file->path(), name, i / cols, id, i % cols, limit, limit_rule));
      }
    }
    ckpt_.mapped_weight_bytes_ += e->tensor->nbytes;
    return TensorView(const_cast<std::byte*>(p), type, shape.data(), static_cast<int>(shape.size()));
  }

  // An F8_E4M3 weight of an FP8 block-scaled checkpoint (fp8_checkpoint.h): dequantized into an owned bf16
  // buffer with its "<name>_scale_inv" tensor.
  Result<TensorView> bind_fp8(const std::string& name, const TensorStore::Entry& e, const std::vector<int64_t>& shape,
                              std::string_view shape_rule) {
    const TensorView q(const_cast<std::byte*>(e.file->mapping().data() + e.tensor->offset), DType::kFp8E4M3FN,
                       e.tensor->shape.data(), static_cast<int>(e.tensor->shape.size()));
    if (e.tensor->shape != shape) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' has shape {} but {} requires {} = {}", e.file->path(), name, q.shape_string(),
          kConfigFileName, TensorView(nullptr, q.dtype(), shape.data(), static_cast<int>(shape.size())).shape_string(),
          shape_rule));
    }
    if (shape.size() != 2) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' is F8_E4M3 but only 2-D Linear weights may be FP8", e.file->path(), name));
    }
    if (const std::string module = name.substr(0, name.rfind('.')); not_converted_.count(module)) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' is F8_E4M3 but {}'s quantization_config lists '{}' among the modules left "
                      "unquantized (modules_to_not_convert / ignored_layers)",
                      e.file->path(), name, kConfigFileName, module));
    }
    const std::string scale_name = fp8_scale_tensor_name(name, *fp8_);
    const TensorStore::Entry* se = ckpt_.store_->find(scale_name);
    if (!se) {
      return invalid_argument(
          fmt::format("{}: tensor '{}' is missing ('{}' is F8_E4M3 and {}'s quantization_config is fp8 block-scaled)",
                      ckpt_.store_->source(), scale_name, name, kConfigFileName));
    }
    used_.insert(scale_name);
    GB_ASSIGN_OR_RETURN(TensorView s, se->file->view(*se->tensor));
    const int64_t n = q.numel();
    std::unique_ptr<bf16_t[]> out(new bf16_t[static_cast<size_t>(n)]);
    GB_RETURN_IF_ERROR(dequantize_fp8_block(q, s, *fp8_, se->file->path(), name, out.get()));
    ckpt_.converted_weight_bytes_ += static_cast<uint64_t>(n) * sizeof(bf16_t);
    TensorView bv(out.get(), DType::kBF16, shape.data(), static_cast<int>(shape.size()));
    ckpt_.converted_.push_back(std::move(out));
    ckpt_.bound_.push_back({name, e.file->path(), bv, true});
    ckpt_.fp8_sources_[bv.data()] = Checkpoint::Fp8Source{q, s, *fp8_, se->file->path(), name};
    return bv;
  }

  // A DeepSeek-V4 weight, bound by its role in DeepSeek's FP8 form (deepseek_v4_weight_role) and the form
  // config.json declares: BF16 / F16 / F32 as any weight, or F8_E4M3 / MXFP4 with its ".scale", dequantized
  // exactly into an owned bf16 buffer (deepseek_v4_quant.h). A tensor in the other form is refused.
  Result<TensorView> bind_v4(const std::string& name, std::vector<int64_t> shape, std::string_view rule,
                             std::string_view why) {
    const DeepseekV4Config& d = ckpt_.config_.dsv4;
    const TensorStore::Entry* e = ckpt_.store_->find(name);
    if (!e) return missing(name, why);
    const std::string& dtype = e->tensor->dtype;
    const V4WeightRole role = deepseek_v4_weight_role(name);
    const std::string module = name.substr(0, name.rfind('.'));
    const bool quantized = d.quantized() && role != V4WeightRole::kPlain && !not_converted_.count(module);
    const std::string scale = module + ".scale";
    if (!quantized) {
      if (dtype == "BF16" || dtype == "F16" || dtype == "F32") return bind(name, std::move(shape), rule, why);
      used_.insert(name);
      const std::string head = fmt::format("{}: tensor '{}' has dtype {} but ", e->file->path(), name, dtype);
      if (role == V4WeightRole::kPlain) {
        return invalid_argument(head +
                                "DeepSeek-V4 keeps it unquantized (BF16; F16 and F32 are converted), in its FP8 form "
                                "too: only the attention's wq_a, wq_b, wkv, wo_a and wo_b, the indexer's wq_b and the "
                                "experts are quantized (docs/deepseek.md)");
      }
      if (!d.quantized()) {
        return invalid_argument(head + fmt::format("{} has no quantization_config, so the checkpoint is in the bf16 "
                                                   "form (BF16, F16 or F32 weights); DeepSeek's FP8 form needs its "
                                                   "quantization_config and expert_dtype (docs/deepseek.md)",
                                                   kConfigFileName));
      }
      return invalid_argument(head + fmt::format("{}'s quantization_config lists '{}' among the modules left "
                                                 "unquantized (modules_to_not_convert / ignored_layers)",
                                                 kConfigFileName, module));
    }
    if (role == V4WeightRole::kRoutedExpert && d.expert_dtype == V4ExpertDtype::kFp4) {
      if (dtype != "I8") {
        used_.insert(name);
        return invalid_argument(fmt::format(
            "{}: tensor '{}' has dtype {} but {}'s expert_dtype is \"fp4\": a routed expert is MXFP4, I8 [N, K / 2] "
            "holding two e2m1 values per byte, with an F8_E8M0 '{}' [N, K / {}]",
            e->file->path(), name, dtype, kConfigFileName, scale, kMxfp4BlockK));
      }
      return bind_v4_mxfp4(name, *e, shape, rule);
    }
    if (dtype != "F8_E4M3") {
      used_.insert(name);
      return invalid_argument(fmt::format(
          "{}: tensor '{}' has dtype {} but {}: it must be F8_E4M3 with a '{}' per 128 x 128 block", e->file->path(),
          name, dtype,
          role == V4WeightRole::kRoutedExpert
              ? fmt::format("{}'s expert_dtype is \"fp8\" (or absent) with a quantization_config, so the routed "
                            "experts are FP8 blocks",
                            kConfigFileName)
              : fmt::format("{}'s quantization_config makes it an FP8 linear", kConfigFileName),
          scale));
    }
    return bind_v4_fp8(name, *e, shape, rule);
  }

  // The bf16 dequantization of a DeepSeek-V4 FP8 weight and its ".scale", with the codes and scales kept as the
  // weight's Fp8Source.
  Result<TensorView> bind_v4_fp8(const std::string& name, const TensorStore::Entry& e,
                                 const std::vector<int64_t>& shape, std::string_view rule) {
    used_.insert(name);
    if (e.tensor->shape != shape) return wrong_shape(e, name, shape, rule);
    const TensorView q(const_cast<std::byte*>(e.file->mapping().data() + e.tensor->offset), DType::kFp8E4M3FN,
                       shape.data(), static_cast<int>(shape.size()));
    Fp8BlockQuantConfig config = *fp8_;
    config.deepseek_v4_scales = true;
    const std::string scale_name = fp8_scale_tensor_name(name, config);
    const TensorStore::Entry* se = ckpt_.store_->find(scale_name);
    if (!se) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' is missing ('{}' is F8_E4M3, and {}'s quantization_config gives it one power-of-two scale "
          "per 128 x 128 block)",
          ckpt_.store_->source(), scale_name, name, kConfigFileName));
    }
    used_.insert(scale_name);
    GB_ASSIGN_OR_RETURN(TensorView s, view_scale(*se));
    std::unique_ptr<bf16_t[]> out(new bf16_t[static_cast<size_t>(q.numel())]);
    GB_RETURN_IF_ERROR(dequantize_v4_fp8(q, s, config, e.file->path(), name, out.get()));
    TensorView bv = own_exact_bf16(name, e, shape, std::move(out));
    ckpt_.fp8_sources_[bv.data()] = Checkpoint::Fp8Source{q, s, config, e.file->path(), name};
    return bv;
  }

  // The bf16 dequantization of a DeepSeek-V4 MXFP4 routed expert (I8 [N, K / 2]) and its ".scale", with the codes
  // and scales kept as the weight's Mxfp4Source.
  Result<TensorView> bind_v4_mxfp4(const std::string& name, const TensorStore::Entry& e,
                                   const std::vector<int64_t>& shape, std::string_view rule) {
    used_.insert(name);
    const std::vector<int64_t> packed = {shape[0], shape[1] / 2};
    if (e.tensor->shape != packed || shape[1] % 2 != 0) {
      return wrong_shape(
          e, name, packed,
          fmt::format("{} / 2]: expert_dtype \"fp4\" packs two e2m1 values per byte", rule.substr(0, rule.size() - 1)));
    }
    const TensorView q(const_cast<std::byte*>(e.file->mapping().data() + e.tensor->offset), DType::kFp4E2M1x2,
                       packed.data(), static_cast<int>(packed.size()));
    const std::string scale_name = name.substr(0, name.rfind('.')) + ".scale";
    const TensorStore::Entry* se = ckpt_.store_->find(scale_name);
    if (!se) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' is missing ('{}' is MXFP4, {}'s expert_dtype \"fp4\": it needs one F8_E8M0 scale per {} "
          "along K)",
          ckpt_.store_->source(), scale_name, name, kConfigFileName, kMxfp4BlockK));
    }
    used_.insert(scale_name);
    GB_ASSIGN_OR_RETURN(TensorView s, view_scale(*se));
    std::unique_ptr<bf16_t[]> out(new bf16_t[static_cast<size_t>(shape[0] * shape[1])]);
    GB_RETURN_IF_ERROR(dequantize_v4_mxfp4(q, s, e.file->path(), name, out.get()));
    TensorView bv = own_exact_bf16(name, e, shape, std::move(out));
    ckpt_.mxfp4_sources_[bv.data()] = Checkpoint::Mxfp4Source{q, s, e.file->path(), name};
    return bv;
  }

  // A scale tensor as stored, mapped: F8_E8M0 bytes (viewed as e8m0, never converted) or a float dtype.
  static Result<TensorView> view_scale(const TensorStore::Entry& se) {
    if (se.tensor->dtype != "F8_E8M0") return se.file->view(*se.tensor);
    return TensorView(const_cast<std::byte*>(se.file->mapping().data() + se.tensor->offset), DType::kE8M0,
                      se.tensor->shape.data(), static_cast<int>(se.tensor->shape.size()));
  }

  // Keeps `out`, a weight's exact bf16 dequantization, and binds it.
  TensorView own_exact_bf16(const std::string& name, const TensorStore::Entry& e, const std::vector<int64_t>& shape,
                            std::unique_ptr<bf16_t[]> out) {
    TensorView bv(out.get(), DType::kBF16, shape.data(), static_cast<int>(shape.size()));
    ckpt_.converted_weight_bytes_ += static_cast<uint64_t>(bv.numel()) * sizeof(bf16_t);
    ckpt_.converted_.push_back(std::move(out));
    ckpt_.bound_.push_back({name, e.file->path(), bv, false});
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

  // Qwen3.5's Gated DeltaNet weights (linear_attn.*).
  Status bind_linear_attention(int64_t l, const std::string& why, LinearAttentionWeights* g) {
    const ModelConfig& c = ckpt_.config_;
    const Qwen35Config& q = c.qwen35;
    const int64_t h = c.hidden_size, C = q.conv_dim(), nv = q.linear_num_value_heads, K = q.linear_conv_kernel_dim;
    const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, c.tensor_prefix()); };
    const std::string conv_rule = "[2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * "
                                  "linear_value_head_dim";
    GB_ASSIGN_OR_RETURN(g->in_proj_qkv,
                        bind(name("linear_attn.in_proj_qkv.weight"), {C, h}, conv_rule + ", hidden_size]", why));
    GB_ASSIGN_OR_RETURN(g->in_proj_z, bind(name("linear_attn.in_proj_z.weight"), {q.value_dim(), h},
                                           "[linear_num_value_heads * linear_value_head_dim, hidden_size]", why));
    GB_ASSIGN_OR_RETURN(g->in_proj_b, bind(name("linear_attn.in_proj_b.weight"), {nv, h},
                                           "[linear_num_value_heads, hidden_size]", why));
    GB_ASSIGN_OR_RETURN(g->in_proj_a, bind(name("linear_attn.in_proj_a.weight"), {nv, h},
                                           "[linear_num_value_heads, hidden_size]", why));
    GB_ASSIGN_OR_RETURN(TensorView conv, bind(name("linear_attn.conv1d.weight"), {C, 1, K},
                                              conv_rule + ", 1, linear_conv_kernel_dim]", why));
    g->conv1d = TensorView(conv.data(), conv.dtype(), {C, K});
    GB_ASSIGN_OR_RETURN(g->dt_bias,
                        bind(name("linear_attn.dt_bias"), {nv}, "[linear_num_value_heads]", why, false, true));
    GB_ASSIGN_OR_RETURN(g->A_log, bind(name("linear_attn.A_log"), {nv}, "[linear_num_value_heads]", why, false, true));
    GB_ASSIGN_OR_RETURN(g->norm, bind(name("linear_attn.norm.weight"), {q.linear_value_head_dim},
                                      "[linear_value_head_dim]", why, false, true));
    GB_ASSIGN_OR_RETURN(g->out_proj, bind(name("linear_attn.out_proj.weight"), {h, q.value_dim()},
                                          "[hidden_size, linear_num_value_heads * linear_value_head_dim]", why));
    return ok_status();
  }

  // Routed experts, one tensor per expert or (Qwen3.5) fused: mlp.experts.gate_up_proj [E, 2I, H] (gate rows
  // first) and mlp.experts.down_proj [E, H, I], each expert a view into them.
  Status bind_experts(int64_t l, const std::string& why, std::vector<MlpWeights>* experts) {
    const ModelConfig& c = ckpt_.config_;
    const int64_t h = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
    const std::string fused = layer_tensor_name(l, "mlp.experts.gate_up_proj", c.tensor_prefix());
    if (c.is_qwen35() && ckpt_.store_->find(fused)) {
      GB_ASSIGN_OR_RETURN(TensorView gu,
                          bind(fused, {E, 2 * I, h}, "[num_experts, 2 * moe_intermediate_size, hidden_size]", why));
      GB_ASSIGN_OR_RETURN(TensorView dn, bind(layer_tensor_name(l, "mlp.experts.down_proj", c.tensor_prefix()),
                                              {E, h, I}, "[num_experts, hidden_size, moe_intermediate_size]", why));
      const size_t es = dtype_size(gu.dtype());
      for (int64_t e = 0; e < E; ++e) {
        std::byte* g0 = static_cast<std::byte*>(gu.data()) + static_cast<size_t>(e * 2 * I * h) * es;
        std::byte* d0 = static_cast<std::byte*>(dn.data()) + static_cast<size_t>(e * h * I) * dtype_size(dn.dtype());
        experts->push_back(MlpWeights{TensorView(g0, gu.dtype(), {I, h}),
                                      TensorView(g0 + static_cast<size_t>(I * h) * es, gu.dtype(), {I, h}),
                                      TensorView(d0, dn.dtype(), {h, I})});
      }
      return ok_status();
    }
    for (int64_t e = 0; e < E; ++e) {
      GB_ASSIGN_OR_RETURN(MlpWeights m, bind_mlp(layer_tensor_name(l, fmt::format("mlp.experts.{}.", e), c.tensor_prefix()),
                                                 h, I, "moe_intermediate_size", why));
      experts->push_back(m);
    }
    return ok_status();
  }

  Status bind_all() {
    const ModelConfig& c = ckpt_.config_;
    if (c.is_deepseek_v4()) {  // DeepSeek's names and layout: runtime/checkpoint/deepseek_v4_weights.cpp
      const detail::V4TensorBinder b{
          .bind = [&](const std::string& n, std::vector<int64_t> shape, std::string_view rule,
                      std::string_view why) { return bind_v4(n, std::move(shape), rule, why); },
          .bind_f32 = [&](const std::string& n, std::vector<int64_t> shape, std::string_view rule,
                          std::string_view why) { return bind_f32(n, std::move(shape), rule, why); },
          .bind_ids =
              [&](const std::string& n, std::vector<int64_t> shape, std::string_view rule, std::string_view why,
                  int64_t limit,
                  std::string_view limit_rule) { return bind_ids(n, std::move(shape), rule, why, limit, limit_rule); }};
      GB_RETURN_IF_ERROR(detail::bind_deepseek_v4_weights(c, b, &ckpt_.weights_));
      if (c.tie_word_embeddings) used_.insert("head.weight");  // a tied checkpoint may still carry a copy
    } else {
      GB_RETURN_IF_ERROR(bind_hf_model());
    }
    return check_every_tensor_used();
  }

  // The Hugging Face layouts (Qwen3-MoE, Qwen3.5-MoE, DeepSeek-V3 / V3.2).
  Status bind_hf_model() {
    const ModelConfig& c = ckpt_.config_;
    ModelWeights& w = ckpt_.weights_;
    const int64_t h = c.hidden_size;
    const std::string prefix = c.tensor_prefix();
    GB_ASSIGN_OR_RETURN(w.embed_tokens, bind(prefix + "embed_tokens.weight", {c.vocab_size, h},
                                             "[vocab_size, hidden_size]", "the token embedding"));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      LayerWeights lw;
      const std::string why_layer = fmt::format("num_hidden_layers = {}", c.num_hidden_layers);
      const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, prefix); };
      GB_ASSIGN_OR_RETURN(lw.input_layernorm, bind(name("input_layernorm.weight"), {h}, "[hidden_size]", why_layer));
      GB_ASSIGN_OR_RETURN(lw.post_attention_layernorm,
                          bind(name("post_attention_layernorm.weight"), {h}, "[hidden_size]", why_layer));
      if (c.is_deepseek()) {  // MLA, indexer and DeepSeek MoE: runtime/checkpoint/deepseek_weights.cpp
        GB_RETURN_IF_ERROR(detail::bind_deepseek_layer(
            c, l,
            [&](const std::string& n, std::vector<int64_t> shape, std::string_view rule, std::string_view why,
                bool keep_dtype) { return bind(n, std::move(shape), rule, why, keep_dtype); },
            &lw));
        w.layers.push_back(std::move(lw));
        continue;
      }
      lw.linear = c.is_linear_layer(l);
      if (lw.linear) {
        GB_RETURN_IF_ERROR(bind_linear_attention(
            l, fmt::format("layer_types[{}] is \"linear_attention\"", l), &lw.gdn));
      } else {
        const std::string why_attn =
            c.is_qwen35() ? fmt::format("layer_types[{}] is \"full_attention\"", l) : why_layer;
        AttentionWeights& a = lw.attn;
        GB_ASSIGN_OR_RETURN(a.q_proj, bind(name("self_attn.q_proj.weight"), {c.q_proj_size(), h},
                                           c.is_qwen35() ? "[num_attention_heads * head_dim * 2 (query and gate), hidden_size]"
                                                         : "[num_attention_heads * head_dim, hidden_size]",
                                           why_attn));
        GB_ASSIGN_OR_RETURN(a.k_proj, bind(name("self_attn.k_proj.weight"), {c.kv_size(), h},
                                           "[num_key_value_heads * head_dim, hidden_size]", why_attn));
        GB_ASSIGN_OR_RETURN(a.v_proj, bind(name("self_attn.v_proj.weight"), {c.kv_size(), h},
                                           "[num_key_value_heads * head_dim, hidden_size]", why_attn));
        GB_ASSIGN_OR_RETURN(a.o_proj, bind(name("self_attn.o_proj.weight"), {h, c.q_size()},
                                           "[hidden_size, num_attention_heads * head_dim]", why_attn));
        GB_ASSIGN_OR_RETURN(a.q_norm, bind(name("self_attn.q_norm.weight"), {c.head_dim}, "[head_dim]", why_attn));
        GB_ASSIGN_OR_RETURN(a.k_norm, bind(name("self_attn.k_norm.weight"), {c.head_dim}, "[head_dim]", why_attn));
      }
      lw.is_moe = c.is_moe_layer(l);
      if (lw.is_moe) {
        const std::string why = fmt::format("layer {} is an MoE layer with num_experts = {}", l, c.num_experts);
        GB_ASSIGN_OR_RETURN(lw.moe.router,
                            bind(name("mlp.gate.weight"), {c.num_experts, h}, "[num_experts, hidden_size]", why));
        GB_RETURN_IF_ERROR(bind_experts(l, why, &lw.moe.experts));
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
    GB_ASSIGN_OR_RETURN(w.final_norm, bind(prefix + "norm.weight", {h}, "[hidden_size]", "the final norm"));
    if (c.tie_word_embeddings) {
      w.lm_head = w.embed_tokens;
      used_.insert("lm_head.weight");  // a tied checkpoint may still carry a copy; it is ignored
    } else {
      GB_ASSIGN_OR_RETURN(w.lm_head, bind("lm_head.weight", {c.vocab_size, h}, "[vocab_size, hidden_size]",
                                          "tie_word_embeddings is false"));
    }
    return ok_status();
  }

  // A tensor the model does not use means config.json and the weights disagree (e.g. more experts); the ones a
  // model's checkpoints ship for what genbridge does not run (vision towers, MTP layers) are counted instead.
  Status check_every_tensor_used() {
    const ModelConfig& c = ckpt_.config_;
    size_t unused = 0;
    std::string first;
    const TensorStore& store = *ckpt_.store_;
    for (const std::string& n : store.names()) {
      if (used_.count(n) || detail::is_ignored_deepseek_tensor(c, n)) continue;
      if (detail::is_ignored_qwen35_tensor(c, n) || detail::is_ignored_deepseek_v4_tensor(c, n)) {
        ++ckpt_.ignored_tensors_;
        continue;
      }
      if (unused++ == 0) first = n;
    }
    if (unused > 0) {
      return invalid_argument(fmt::format(
          "{}: tensor '{}' is not used by the model {} describes ({} unused tensor{}; config and weights disagree)",
          store.find(first)->file->path(), first, kConfigFileName, unused, unused == 1 ? "" : "s"));
    }
    if (fp8_ && ckpt_.fp8_sources_.empty()) {
      return invalid_argument(
          fmt::format("{}: {}'s quantization_config says the weights are FP8 (quant_method \"fp8\") but no weight is "
                      "F8_E4M3; remove quantization_config from a checkpoint that is not quantized",
                      store.source(), kConfigFileName));
    }
    return ok_status();
  }

 private:
  Checkpoint& ckpt_;
  const LoadOptions& options_;
  std::optional<Fp8BlockQuantConfig> fp8_;
  std::set<std::string> not_converted_;  // modules the quantization_config says are not FP8
  std::set<std::string> used_;
};

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& dir, const LoadOptions& options) {
  GB_ASSIGN_OR_RETURN(const bool dir_exists, detail::entry_exists(dir));
  if (!dir_exists) return invalid_argument(fmt::format("{}: the model directory does not exist", dir.string()));
  if (std::error_code ec; !std::filesystem::is_directory(dir, ec)) {
    return invalid_argument(
        fmt::format("{}: is not a directory (a model is a directory holding {} and safetensors files)", dir.string(),
                    kConfigFileName));
  }
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  ckpt.precision_ = options.precision;
  GB_ASSIGN_OR_RETURN(ckpt.config_, load_model_config(dir / kConfigFileName));
  // An FP8 block-scaled checkpoint (quantization_config, fp8_checkpoint.h): its F8_E4M3 weights load as bf16.
  GB_ASSIGN_OR_RETURN(const std::string config_text, detail::read_regular_file(dir / kConfigFileName));
  GB_ASSIGN_OR_RETURN(std::optional<Fp8QuantizationConfig> fp8,
                      read_fp8_quantization_config(config_text, (dir / kConfigFileName).string()));
  MapOptions map_options;
  map_options.use_mmap = options.use_mmap;
  map_options.populate = options.populate;
  GB_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(dir, map_options));
  ckpt.store_ = std::make_unique<TensorStore>(std::move(store));
  WeightBinder binder(ckpt, options, std::move(fp8));
  GB_RETURN_IF_ERROR(binder.bind_all());
  return ckpt;
}

namespace {

// The largest magnitude bit pattern in bits[0, n) (sign cleared). An element is NaN or infinite iff its
// magnitude bits are >= the all-ones exponent, so one max-reduction answers "any non-finite?" and
// vectorises (no branch, no early exit).
template <typename U>
U max_magnitude_bits(const U* bits, int64_t n) {
  constexpr U kMagnitude = static_cast<U>(static_cast<U>(~U{0}) >> 1);  // ~ promotes to int
  U m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max<U>(m, static_cast<U>(bits[i] & kMagnitude));
  return m;
}

struct FloatBits {
  int width;          // bytes per element
  uint32_t exp_mask;  // the all-ones exponent
  uint32_t sign_mask;
};

FloatBits float_bits(DType t) {
  switch (t) {
    case DType::kF32:
      return {4, 0x7f800000u, 0x80000000u};
    case DType::kF16:
      return {2, 0x7c00u, 0x8000u};
    default:  // bf16
      return {2, 0x7f80u, 0x8000u};
  }
}

// Whether any element of `v`'s [begin, end) is non-finite.
bool any_non_finite(const TensorView& v, int64_t begin, int64_t end) {
  const FloatBits fb = float_bits(v.dtype());
  if (fb.width == 4) return max_magnitude_bits(v.data_as<const uint32_t>() + begin, end - begin) >= fb.exp_mask;
  return max_magnitude_bits(v.data_as<const uint16_t>() + begin, end - begin) >= fb.exp_mask;
}

uint32_t element_bits(const TensorView& v, int64_t i) {
  return v.dtype() == DType::kF32 ? v.data_as<const uint32_t>()[i] : v.data_as<const uint16_t>()[i];
}

// "NaN", "+Inf" or "-Inf" for a non-finite element's bits.
std::string_view non_finite_name(DType t, uint32_t bits) {
  const FloatBits fb = float_bits(t);
  const uint32_t magnitude = bits & ~fb.sign_mask;
  if (magnitude > fb.exp_mask) return "NaN";
  return bits & fb.sign_mask ? "-Inf" : "+Inf";
}

// "[546, 112]": the multi-index of flat index `i` in a row-major tensor.
std::string multi_index(const TensorView& v, int64_t i) {
  std::vector<int64_t> idx(static_cast<size_t>(v.rank()));
  for (int d = v.rank() - 1; d >= 0; --d) {
    idx[static_cast<size_t>(d)] = i % v.dim(d);
    i /= v.dim(d);
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

}  // namespace

Status Checkpoint::check_finite(WeightScan* scan) const {
  const auto start = std::chrono::steady_clock::now();
  // Fixed chunks over every bound tensor, scanned in parallel; the first flagged chunk in order is then
  // searched element by element, so the answer does not depend on the thread count.
  constexpr int64_t kChunkElems = int64_t{1} << 15;
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  uint64_t bytes = 0;
  for (size_t t = 0; t < bound_.size(); ++t) {
    const int64_t n = bound_[t].view.numel();
    bytes += static_cast<uint64_t>(n) * dtype_size(bound_[t].view.dtype());
    for (int64_t b = 0; b < n; b += kChunkElems) chunks.push_back({t, b, std::min(n, b + kChunkElems)});
  }
  std::vector<uint8_t> flagged(chunks.size(), 0);
  parallel_for(static_cast<int64_t>(chunks.size()), kChunkElems * 2, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const Chunk& k = chunks[static_cast<size_t>(c)];
      flagged[static_cast<size_t>(c)] = any_non_finite(bound_[k.tensor].view, k.begin, k.end) ? 1 : 0;
    }
  });
  if (scan) {
    scan->bytes = bytes;
    scan->tensors = static_cast<int64_t>(bound_.size());
    scan->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const auto hit = std::find(flagged.begin(), flagged.end(), uint8_t{1});
  if (hit == flagged.end()) return ok_status();
  const Chunk& k = chunks[static_cast<size_t>(hit - flagged.begin())];
  const BoundTensor& bt = bound_[k.tensor];
  const FloatBits fb = float_bits(bt.view.dtype());
  int64_t i = k.begin;
  while (i < k.end && (element_bits(bt.view, i) & ~fb.sign_mask) < fb.exp_mask) ++i;
  GB_CHECK(i < k.end, "check_finite: a flagged chunk holds no non-finite element");
  std::string converted;
  if (bt.converted) {
    // The bf16 copy of an F16/F32 tensor: say whether the file holds the value or the conversion made it.
    const TensorStore::Entry* e = store_->find(bt.name);
    Result<TensorView> original = e ? e->file->view(*e->tensor) : Result<TensorView>(internal_error("gone"));
    if (original.ok()) {
      const uint32_t ob = element_bits(*original, i);
      const FloatBits ofb = float_bits(original->dtype());
      if ((ob & ~ofb.sign_mask) < ofb.exp_mask) {
        const float value = original->dtype() == DType::kF32 ? std::bit_cast<float>(ob)
                                                             : fp16_to_float(fp16_t{static_cast<uint16_t>(ob)});
        converted = fmt::format(" after conversion to bf16 (the file holds {} {}, beyond bf16's range)",
                                safetensors_dtype_name(original->dtype()), value);
      }
    }
  }
  return invalid_argument(
      fmt::format("{}: tensor '{}' holds {} at flat index {} (index {} of shape {}){}; every "
                  "weight must be finite",
                  bt.file, bt.name, non_finite_name(bt.view.dtype(), element_bits(bt.view, i)), i,
                  multi_index(bt.view, i), bt.view.shape_string(), converted));
}

const Checkpoint::Fp8Source* Checkpoint::fp8_source(const TensorView& w) const {
  const auto it = fp8_sources_.find(w.data());
  return it == fp8_sources_.end() ? nullptr : &it->second;
}

Checkpoint::QuantizedForm Checkpoint::quantized_form() const {
  QuantizedForm f;
  const auto bytes = [](const TensorView& t) { return static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype()); };
  for (const auto& [data, s] : fp8_sources_) {
    ++f.fp8;
    f.file_bytes += bytes(s.codes) + bytes(s.scale_inv);
    f.bf16_bytes += static_cast<uint64_t>(s.codes.numel()) * sizeof(bf16_t);
    f.exact = f.exact && s.config.deepseek_v4_scales;
  }
  for (const auto& [data, s] : mxfp4_sources_) {
    ++f.mxfp4;
    f.file_bytes += bytes(s.codes) + bytes(s.scales);
    f.bf16_bytes += static_cast<uint64_t>(s.codes.numel()) * 2 * sizeof(bf16_t);
  }
  return f;
}

const Checkpoint::Mxfp4Source* Checkpoint::mxfp4_source(const TensorView& w) const {
  const auto it = mxfp4_sources_.find(w.data());
  return it == mxfp4_sources_.end() ? nullptr : &it->second;
}

}  // namespace genbridge::model
