#include "runtime/checkpoint/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "genbridge/ops/attention/paged_decode.h"
#include "runtime/checkpoint/config_reader.h"
#include "runtime/checkpoint/deepseek_config.h"
#include "runtime/checkpoint/deepseek_v4_config.h"
#include "runtime/checkpoint/file_access.h"
#include "runtime/checkpoint/json_util.h"
#include "runtime/checkpoint/qwen35_config.h"

namespace genbridge::model {
namespace {

using json = nlohmann::json;

using Reader = detail::ConfigReader;
constexpr int64_t kMaxSize = detail::kMaxConfigSize;

std::string_view torch_dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kF32:
      return "float32";
    default:
      return "unsupported";
  }
}

Status bad_value(std::string_view source, std::string_view key, const std::string& value, std::string_view rule) {
  return detail::bad_config_value(source, key, value, rule);
}

Status check_size(std::string_view source, std::string_view key, int64_t v, int64_t min) {
  return detail::check_config_size(source, key, v, min);
}

// torch_dtype (or HF's newer "dtype"), when present.
Status parse_torch_dtype(const Reader& r, ModelConfig* c) {
  const char* dtype_key = r.has("torch_dtype") ? "torch_dtype" : (r.has("dtype") ? "dtype" : nullptr);
  if (dtype_key) {
    const json& v = *r.find(dtype_key);
    const std::string s = v.is_string() ? v.get<std::string>() : "";
    if (s == "bfloat16") {
      c->torch_dtype = DType::kBF16;
    } else if (s == "float16") {
      c->torch_dtype = DType::kF16;
    } else if (s == "float32") {
      c->torch_dtype = DType::kF32;
    } else {
      return r.bad(dtype_key, v, "must be \"bfloat16\", \"float16\" or \"float32\"");
    }
  }
  return ok_status();
}

// The first dense layer, or -1 when every layer is MoE.
int64_t first_dense_layer(const ModelConfig& c) {
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) return l;
  }
  return -1;
}

// head_dim must be one attention implements (ops::kPagedDecodeHeadDims), so that an unsupported model is
// refused at load rather than at its first forward. `derived`: config.json has no head_dim and it came from
// hidden_size / num_attention_heads, so the message names those keys.
Status check_head_dim_supported(const ModelConfig& c, std::string_view source, bool derived) {
  const auto& dims = ops::kPagedDecodeHeadDims;
  if (std::find(dims.begin(), dims.end(), c.head_dim) != dims.end()) return ok_status();
  std::string list;
  for (size_t i = 0; i < dims.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == dims.size() ? " or " : ", ") + std::to_string(dims[i]);
  }
  const std::string rule = fmt::format("must be {} (the head dimensions attention implements)", list);
  if (derived) {
    return invalid_argument(
        fmt::format("{}: head_dim is absent and hidden_size / num_attention_heads = {} / {} = {}: {}", source,
                    c.hidden_size, c.num_attention_heads, c.head_dim, rule));
  }
  return bad_value(source, "head_dim", std::to_string(c.head_dim), rule);
}

}  // namespace

std::string_view norm_type_name(NormType type) { return type == NormType::kGemma ? "gemma" : "rms"; }

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kDeepseekV3:
      return kDeepseekV3Architecture;
    case Architecture::kDeepseekV32:
      return kDeepseekV32Architecture;
    case Architecture::kQwen35Moe:
      return kQwen35MoeArchitecture;
    case Architecture::kDeepseekV4:
      return kDeepseekV4Architecture;
    default:
      return kQwen3MoeArchitecture;
  }
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (is_deepseek_v4()) return num_experts > 0;  // no dense layers (the first num_hash_layers are hash-routed MoE)
  if (is_deepseek()) {
    return num_experts > 0 && deepseek.moe_layer_freq > 0 && layer >= deepseek.first_k_dense_replace &&
           layer % deepseek.moe_layer_freq == 0;
  }
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_kv_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += is_linear_layer(l) ? 0 : 1;
  return n;
}

int64_t ModelConfig::rotary_dim() const {
  if (is_deepseek_v4()) return dsv4.qk_rope_head_dim;  // each head's trailing dims
  if (!is_qwen35()) return head_dim;
  return static_cast<int64_t>(static_cast<double>(head_dim) * qwen35.partial_rotary_factor);
}

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < num_hidden_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

Status validate_model_config(const ModelConfig& c, std::string_view src) {
  if (!c.is_deepseek_v4() && c.dsv4 != DeepseekV4Config{}) {
    return invalid_argument(fmt::format("{}: the DeepSeek-V4 keys are set but the architecture is {}", src,
                                        architecture_name(c.architecture)));
  }
  if (c.is_deepseek()) return detail::validate_deepseek_config(c, src);
  if (c.deepseek != DeepseekConfig{}) {
    return invalid_argument(fmt::format("{}: the DeepSeek keys are set but the architecture is {}", src,
                                        architecture_name(c.architecture)));
  }
  if (!c.is_qwen35() && c.qwen35 != Qwen35Config{}) {
    return invalid_argument(
        fmt::format("{}: the Qwen3.5 keys are set but the architecture is {}", src, architecture_name(c.architecture)));
  }
  if (c.is_deepseek_v4()) return detail::validate_deepseek_v4_config(c, src);
  GB_RETURN_IF_ERROR(check_size(src, "vocab_size", c.vocab_size, 1));
  GB_RETURN_IF_ERROR(check_size(src, "hidden_size", c.hidden_size, 1));
  GB_RETURN_IF_ERROR(check_size(src, "num_hidden_layers", c.num_hidden_layers, 1));
  GB_RETURN_IF_ERROR(check_size(src, "num_attention_heads", c.num_attention_heads, 1));
  GB_RETURN_IF_ERROR(check_size(src, "num_key_value_heads", c.num_key_value_heads, 1));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad_value(
        src, "num_key_value_heads", std::to_string(c.num_key_value_heads),
        fmt::format("num_attention_heads ({}) must be a multiple of num_key_value_heads", c.num_attention_heads));
  }
  GB_RETURN_IF_ERROR(check_size(src, "head_dim", c.head_dim, 1));
  if (c.head_dim % 2 != 0) {
    return bad_value(src, "head_dim", std::to_string(c.head_dim),
                     "must be even (NeoX RoPE rotates the two halves of each head)");
  }
  GB_RETURN_IF_ERROR(check_head_dim_supported(c, src, /*derived=*/false));
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps)) {
    return bad_value(src, "rms_norm_eps", fmt::format("{}", c.rms_norm_eps), "must be a positive finite number");
  }
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta)) {
    return bad_value(src, "rope_theta", fmt::format("{}", c.rope_theta), "must be a positive finite number");
  }
  GB_RETURN_IF_ERROR(detail::check_fp32_positive(src, "rms_norm_eps", c.rms_norm_eps));
  GB_RETURN_IF_ERROR(detail::check_fp32_positive(src, "rope_theta", c.rope_theta));
  if (c.max_position_embeddings < 1 || c.max_position_embeddings > (int64_t{1} << 31)) {
    return bad_value(src, "max_position_embeddings", std::to_string(c.max_position_embeddings),
                     "must be a positive integer no larger than 2147483648");
  }
  GB_RETURN_IF_ERROR(check_size(src, "num_experts", c.num_experts, 0));
  if (c.num_experts > 0) {
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
      return bad_value(src, "num_experts_per_tok", std::to_string(c.num_experts_per_tok),
                       fmt::format("must be between 1 and num_experts ({})", c.num_experts));
    }
    GB_RETURN_IF_ERROR(check_size(src, "moe_intermediate_size", c.moe_intermediate_size, 1));
  }
  if (c.decoder_sparse_step < 1 || c.decoder_sparse_step > kMaxSize) {
    return bad_value(src, "decoder_sparse_step", std::to_string(c.decoder_sparse_step),
                     "must be a positive integer (1: every layer may be MoE)");
  }
  std::set<int64_t> seen;
  for (int64_t l : c.mlp_only_layers) {
    if (l < 0 || l >= c.num_hidden_layers) {
      return bad_value(src, "mlp_only_layers", detail::int_list_text(c.mlp_only_layers),
                       fmt::format("layer {} is outside [0, num_hidden_layers = {})", l, c.num_hidden_layers));
    }
    if (!seen.insert(l).second) {
      return bad_value(src, "mlp_only_layers", detail::int_list_text(c.mlp_only_layers),
                       fmt::format("layer {} is listed twice", l));
    }
  }
  if (const int64_t dense = first_dense_layer(c); dense >= 0) {
    if (c.intermediate_size < 1 || c.intermediate_size > kMaxSize) {
      return bad_value(
          src, "intermediate_size", std::to_string(c.intermediate_size),
          fmt::format("must be a positive integer no larger than {} because layer {} is dense", kMaxSize, dense));
    }
  }
  GB_RETURN_IF_ERROR(check_size(src, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, 0));
  if (c.has_shared_expert() && c.num_experts == 0) {
    return bad_value(src, "shared_expert_intermediate_size", std::to_string(c.shared_expert_intermediate_size),
                     "a shared expert needs MoE layers (num_experts > 0)");
  }
  if (c.torch_dtype != DType::kBF16 && c.torch_dtype != DType::kF16 && c.torch_dtype != DType::kF32) {
    return bad_value(src, "torch_dtype", std::string(dtype_name(c.torch_dtype)),
                     "must be bfloat16, float16 or float32");
  }
  if (c.is_qwen35()) return detail::validate_qwen35_config(c, src);
  return ok_status();
}

Result<ModelConfig> parse_model_config(std::string_view text, std::string_view source) {
  std::string error;
  std::optional<json> parsed = detail::parse_json_strict(text, &error);
  if (!parsed) return invalid_argument(fmt::format("{}: {}", source, error));
  const json& j = *parsed;
  if (!j.is_object()) {
    return invalid_argument(fmt::format("{}: the top level must be a JSON object, found {}", source, j.type_name()));
  }
  Reader r(j, source);
  ModelConfig c;

  // Architecture first: the rest only makes sense for the family we implement.
  const json* arch = r.find("architectures");
  if (!arch) return r.missing("architectures");
  bool known = false;
  if (arch->is_array()) {
    for (const json& a : *arch) {
      for (Architecture candidate : {Architecture::kQwen3Moe, Architecture::kDeepseekV3, Architecture::kDeepseekV32,
                                     Architecture::kQwen35Moe, Architecture::kDeepseekV4}) {
        if (!known && a.is_string() && a.get<std::string>() == architecture_name(candidate)) {
          known = true;
          c.architecture = candidate;
        }
      }
      if (!known && a.is_string() && a.get<std::string>() == kQwen35MoeTextArchitecture) {
        known = true;
        c.architecture = Architecture::kQwen35Moe;
      }
    }
  }
  if (!known) {
    return r.bad("architectures", *arch,
                 fmt::format("unsupported architecture (genbridge supports [\"{}\", \"{}\", \"{}\", \"{}\", \"{}\", "
                             "\"{}\"])",
                             kQwen3MoeArchitecture, kQwen35MoeArchitecture, kQwen35MoeTextArchitecture,
                             kDeepseekV3Architecture, kDeepseekV32Architecture, kDeepseekV4Architecture));
  }
  if (c.is_qwen35()) {
    if (const json* mt = r.find("model_type");
        mt && !(mt->is_string() && (mt->get<std::string>() == "qwen3_5_moe" || mt->get<std::string>() == "qwen3_5_moe_text"))) {
      return r.bad("model_type", *mt, "must be \"qwen3_5_moe\" for Qwen3.5-MoE");
    }
    GB_RETURN_IF_ERROR(detail::parse_qwen35_config(r, &c));
    GB_RETURN_IF_ERROR(parse_torch_dtype(r, &c));
    if (const json* t = r.find("text_config"); t && t->is_object()) {
      GB_RETURN_IF_ERROR(parse_torch_dtype(Reader(*t, source, "text_config."), &c));
    }
    GB_RETURN_IF_ERROR(validate_model_config(c, source));
    return c;
  }
  if (c.is_deepseek()) {
    GB_RETURN_IF_ERROR(detail::parse_deepseek_config(r, &c));
    GB_RETURN_IF_ERROR(parse_torch_dtype(r, &c));
    GB_RETURN_IF_ERROR(validate_model_config(c, source));
    return c;
  }
  if (c.is_deepseek_v4()) {
    GB_RETURN_IF_ERROR(detail::parse_deepseek_v4_config(r, &c));
    GB_RETURN_IF_ERROR(parse_torch_dtype(r, &c));
    GB_RETURN_IF_ERROR(validate_model_config(c, source));
    return c;
  }
  if (const json* mt = r.find("model_type"); mt && (!mt->is_string() || mt->get<std::string>() != "qwen3_moe")) {
    return r.bad("model_type", *mt, "must be \"qwen3_moe\" for Qwen3MoeForCausalLM");
  }

  // Features of the HF config that this implementation does not have: refuse rather than ignore.
  if (const json* v = r.find("attention_bias"); v && !(v->is_boolean() && !v->get<bool>())) {
    return r.bad("attention_bias", *v, "must be false (attention projection biases are not supported)");
  }
  if (const json* v = r.find("hidden_act"); v && !(v->is_string() && v->get<std::string>() == "silu")) {
    return r.bad("hidden_act", *v, "must be \"silu\" (experts and dense layers are SwiGLU)");
  }
  if (const json* v = r.find("rope_scaling")) {
    return r.bad("rope_scaling", *v, "must be null (RoPE scaling is not supported)");
  }
  if (const json* v = r.find("use_sliding_window"); v && !(v->is_boolean() && !v->get<bool>())) {
    return r.bad("use_sliding_window", *v, "must be false (sliding-window attention is not supported)");
  }

  GB_RETURN_IF_ERROR(r.get_int("vocab_size", true, &c.vocab_size));
  GB_RETURN_IF_ERROR(r.get_int("hidden_size", true, &c.hidden_size));
  GB_RETURN_IF_ERROR(r.get_int("num_hidden_layers", true, &c.num_hidden_layers));
  GB_RETURN_IF_ERROR(r.get_int("num_attention_heads", true, &c.num_attention_heads));
  GB_RETURN_IF_ERROR(r.get_int("num_key_value_heads", true, &c.num_key_value_heads));
  GB_RETURN_IF_ERROR(r.get_double("rms_norm_eps", true, &c.rms_norm_eps));
  GB_RETURN_IF_ERROR(r.get_double("rope_theta", true, &c.rope_theta));
  GB_RETURN_IF_ERROR(r.get_int("max_position_embeddings", false, &c.max_position_embeddings));
  GB_RETURN_IF_ERROR(r.get_int("num_experts", true, &c.num_experts));
  if (r.has("head_dim")) {
    GB_RETURN_IF_ERROR(r.get_int("head_dim", true, &c.head_dim));
  } else {
    if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
      return invalid_argument(fmt::format(
          "{}: head_dim is absent and hidden_size ({}) is not a positive multiple of num_attention_heads ({})", source,
          c.hidden_size, c.num_attention_heads));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
    GB_RETURN_IF_ERROR(check_head_dim_supported(c, source, /*derived=*/true));
  }
  GB_RETURN_IF_ERROR(r.get_int("decoder_sparse_step", false, &c.decoder_sparse_step));
  if (const json* v = r.find("mlp_only_layers")) {
    if (!v->is_array()) return r.bad("mlp_only_layers", *v, "must be a list of layer indices");
    for (const json& e : *v) {
      if (!e.is_number_integer()) return r.bad("mlp_only_layers", *v, "must be a list of layer indices");
      c.mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  GB_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &c.norm_topk_prob));
  GB_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c.tie_word_embeddings));
  GB_RETURN_IF_ERROR(r.get_int("shared_expert_intermediate_size", false, &c.shared_expert_intermediate_size));
  // Conditionally required keys: the MoE sizes when experts exist, the dense width when a dense layer exists.
  if (c.num_experts > 0) {
    GB_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", true, &c.num_experts_per_tok));
    GB_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", true, &c.moe_intermediate_size));
  } else {
    GB_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", false, &c.num_experts_per_tok));
    GB_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", false, &c.moe_intermediate_size));
  }
  if (c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxSize && c.decoder_sparse_step >= 1 && c.num_experts >= 0) {
    if (const int64_t dense = first_dense_layer(c); dense >= 0 && !r.has("intermediate_size")) {
      return invalid_argument(
          fmt::format("{}: missing required key 'intermediate_size' (layer {} is dense)", source, dense));
    }
  }
  GB_RETURN_IF_ERROR(r.get_int("intermediate_size", false, &c.intermediate_size));

  GB_RETURN_IF_ERROR(parse_torch_dtype(r, &c));
  if (const json* v = r.find(kNormTypeKey)) {
    const std::string s = v->is_string() ? v->get<std::string>() : "";
    if (s == "rms") {
      c.norm_type = NormType::kRms;
    } else if (s == "gemma") {
      c.norm_type = NormType::kGemma;
    } else {
      return r.bad(kNormTypeKey, *v, "must be \"rms\" or \"gemma\"");
    }
  }
  GB_RETURN_IF_ERROR(validate_model_config(c, source));
  return c;
}

Result<ModelConfig> load_model_config(const std::filesystem::path& path) {
  // Regular files only: a FIFO would block the read forever, a directory would read as empty text.
  GB_ASSIGN_OR_RETURN(const bool exists, detail::entry_exists(path));
  if (!exists) {
    return invalid_argument(fmt::format("{}: cannot open the model config (does the file exist?)", path.string()));
  }
  GB_ASSIGN_OR_RETURN(const std::string text, detail::read_regular_file(path));
  return parse_model_config(text, path.string());
}

std::string to_config_json(const ModelConfig& c) {
  if (c.is_deepseek()) return detail::deepseek_config_json(c, torch_dtype_name(c.torch_dtype));
  if (c.is_qwen35()) return detail::qwen35_config_json(c, torch_dtype_name(c.torch_dtype));
  if (c.is_deepseek_v4()) return detail::deepseek_v4_config_json(c, torch_dtype_name(c.torch_dtype));
  nlohmann::ordered_json j;
  j["architectures"] = {std::string(kQwen3MoeArchitecture)};
  j["model_type"] = "qwen3_moe";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["use_sliding_window"] = false;
  j["num_experts"] = c.num_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["intermediate_size"] = c.intermediate_size;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["decoder_sparse_step"] = c.decoder_sparse_step;
  j["mlp_only_layers"] = c.mlp_only_layers;
  j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = std::string(torch_dtype_name(c.torch_dtype));
  j[std::string(kNormTypeKey)] = std::string(norm_type_name(c.norm_type));
  return j.dump(2) + "\n";
}

std::string describe(const ModelConfig& c) {
  if (c.is_deepseek_v4()) return detail::describe_deepseek_v4(c);
  if (c.is_deepseek()) {
    const DeepseekConfig& d = c.deepseek;
    return fmt::format(
        "{} {} layers ({} MoE: {} experts in {} groups, top-{} of {} groups{}), hidden {}, MLA {} heads "
        "(kv_lora_rank {}, q_lora_rank {}, nope/rope/v {}/{}/{}){}{}, vocab {}",
        architecture_name(c.architecture), c.num_hidden_layers, c.num_moe_layers(), c.num_experts, d.n_group,
        c.num_experts_per_tok, d.topk_group,
        d.n_shared_experts > 0 ? fmt::format(" + {} shared", d.n_shared_experts) : "", c.hidden_size,
        c.num_attention_heads, d.kv_lora_rank, d.q_lora_rank, d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim,
        d.yarn ? fmt::format(", YaRN x{}", d.rope_scaling.factor) : "",
        c.has_indexer() ? fmt::format(", DSA indexer {} x {} top-{}", d.index_n_heads, d.index_head_dim, d.index_topk)
                        : "",
        c.vocab_size);
  }
  if (c.is_qwen35()) {
    const Qwen35Config& q = c.qwen35;
    return fmt::format(
        "{} {} layers ({} Gated DeltaNet: {}/{} heads x {}/{}, conv {}; {} gated attention: heads {}/{} x {}, rotary "
        "{}; all MoE: {} experts, top-{} + gated shared expert), hidden {}, vocab {}, gemma norm",
        architecture_name(c.architecture), c.num_hidden_layers, c.num_linear_layers(), q.linear_num_key_heads,
        q.linear_num_value_heads, q.linear_key_head_dim, q.linear_value_head_dim, q.linear_conv_kernel_dim,
        c.num_kv_layers(), c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim(), c.num_experts,
        c.num_experts_per_tok, c.hidden_size, c.vocab_size);
  }
  return fmt::format("{} layers ({} MoE: {} experts, top-{}{}), hidden {}, heads {}/{} x {}, vocab {}, {} norm",
                     c.num_hidden_layers, c.num_moe_layers(), c.num_experts, c.num_experts_per_tok,
                     c.has_shared_expert() ? " + shared expert" : "", c.hidden_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.vocab_size, norm_type_name(c.norm_type));
}

}  // namespace genbridge::model
