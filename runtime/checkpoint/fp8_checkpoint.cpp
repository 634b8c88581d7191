#include "runtime/checkpoint/fp8_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"

namespace genbridge::model {

using json = nlohmann::json;

Result<std::optional<Fp8QuantizationConfig>> read_fp8_quantization_config(std::string_view text,
                                                                          std::string_view source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantization_config")) return std::optional<Fp8QuantizationConfig>();
  const json& q = j["quantization_config"];
  auto shown = [](const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  };
  auto bad = [&](std::string_view key, const std::string& value, std::string_view rule) {
    return invalid_argument(
        fmt::format("{}: quantization_config{}{} is {} but {}", source, key.empty() ? "" : ".", key, value, rule));
  };
  if (!q.is_object()) return bad("", shown(q), "it must be an object");
  const auto m = q.find("quant_method");
  if (m == q.end() || !m->is_string() || m->get<std::string>() != "fp8") {
    return bad("quant_method", m == q.end() ? std::string("missing") : shown(*m),
               "genbridge reads only quant_method \"fp8\" (block-scaled F8_E4M3 weights with weight_scale_inv)");
  }
  Fp8QuantizationConfig c;
  const auto b = q.find("weight_block_size");
  auto block_ok = [](const json& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= kMaxFp8BlockSize;
    return v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= kMaxFp8BlockSize;
  };
  if (b == q.end() || !b->is_array() || b->size() != 2 || !block_ok((*b)[0]) || !block_ok((*b)[1])) {
    return bad("weight_block_size", b == q.end() ? std::string("missing") : shown(*b),
               fmt::format("it must be two integers [block_n, block_k] in [1, {}] (per-tensor FP8 is not supported)",
                           kMaxFp8BlockSize));
  }
  c.block.block_n = (*b)[0].get<int64_t>();
  c.block.block_k = (*b)[1].get<int64_t>();
  // Optional string keys with the one value genbridge implements (null: absent).
  struct OneValue {
    const char* key;
    const char* value;
    const char* rule;
  };
  for (const OneValue& k : {
           OneValue{"fmt", "e4m3", "genbridge reads only \"e4m3\" (F8_E4M3 codes)"},
           OneValue{"activation_scheme", "dynamic",
                    "genbridge reads only \"dynamic\": it never uses a checkpoint's activation scales (input_scale); "
                    "activations stay bf16, or are quantized per token at run time with --weight-quant"},
           OneValue{"scale_fmt", "ue8m0",
                    "genbridge reads only \"ue8m0\" (every weight_scale_inv a power of two, checked at load) or no "
                    "scale_fmt (any positive scale)"},
       }) {
    const auto it = q.find(k.key);
    if (it == q.end() || it->is_null()) continue;
    if (!it->is_string() || it->get<std::string>() != k.value) return bad(k.key, shown(*it), k.rule);
  }
  if (const auto it = q.find("scale_fmt"); it != q.end() && it->is_string()) c.block.ue8m0_scales = true;
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    const auto it = q.find(key);
    if (it == q.end() || it->is_null()) continue;
    if (!it->is_array()) return bad(key, shown(*it), "it must be a list of module names");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_string() || v.get<std::string>().empty()) {
        return bad(fmt::format("{}[{}]", key, i), shown(v), "it must be a module name (a non-empty string)");
      }
      c.modules_not_converted.push_back(v.get<std::string>());
    }
  }
  if (const auto it = q.find("dequantize"); it != q.end() && !it->is_null() && !it->is_boolean()) {
    return bad("dequantize", shown(*it), "it must be a boolean (genbridge dequantizes FP8 weights at load either way)");
  }
  static constexpr const char* kKeys[] = {"quant_method",      "weight_block_size", "fmt",
                                          "activation_scheme", "scale_fmt",         "modules_to_not_convert",
                                          "ignored_layers",    "dequantize"};
  for (const auto& [key, v] : q.items()) {
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) != std::end(kKeys))
      continue;
    return bad(key, shown(v),
               fmt::format("genbridge does not read this key, so it cannot honour it (it reads {})",
                           fmt::join(std::begin(kKeys), std::end(kKeys), ", ")));
  }
  return std::optional<Fp8QuantizationConfig>(std::move(c));
}

std::string fp8_scale_tensor_name(std::string_view weight, const Fp8BlockQuantConfig& c) {
  if (!c.deepseek_v4_scales) return std::string(weight) + "_scale_inv";
  constexpr std::string_view kWeight = ".weight";
  if (weight.ends_with(kWeight)) weight.remove_suffix(kWeight.size());
  return std::string(weight) + ".scale";
}

Status check_fp8_block_scale(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c,
                             std::string_view file, std::string_view name) {
  const int64_t N = q.dim(0), K = q.dim(1);
  const int64_t bn = (N + c.block_n - 1) / c.block_n, bk = (K + c.block_k - 1) / c.block_k;
  const std::string scale = fp8_scale_tensor_name(name, c);
  const bool dtype_ok = c.deepseek_v4_scales ? s.dtype() == DType::kE8M0 || s.dtype() == DType::kF32
                                             : s.dtype() == DType::kF32 || s.dtype() == DType::kBF16;
  if (!dtype_ok) {
    return invalid_argument(fmt::format("{}: tensor '{}' has dtype {} but must be {}", file, scale,
                                        safetensors_dtype_name(s.dtype()),
                                        c.deepseek_v4_scales ? "F8_E8M0 or F32" : "F32 or BF16"));
  }
  if (s.rank() != 2 || s.dim(0) != bn || s.dim(1) != bk) {
    return invalid_argument(
        fmt::format("{}: tensor '{}' has shape {} but '{}' {} with weight_block_size [{}, {}] needs [{}, {}]", file,
                    scale, s.shape_string(), name, q.shape_string(), c.block_n, c.block_k, bn, bk));
  }
  return ok_status();
}

namespace {

// Scale element i of an F32, BF16 or E8M0 (2^(byte - 127), the byte reinterpreted) scale tensor.
float scale_at(const TensorView& s, int64_t i) {
  switch (s.dtype()) {
    case DType::kF32:
      return s.data_as<const float>()[i];
    case DType::kBF16:
      return bf16_to_float(s.data_as<const bf16_t>()[i]);
    default:
      return e8m0_to_float(s.data_as<const e8m0_t>()[i]);
  }
}

}  // namespace

Status dequantize_fp8_rows_f32(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c,
                               std::string_view file, std::string_view name, int64_t row_begin, int64_t row_end,
                               float* out) {
  GB_RETURN_IF_ERROR(check_fp8_block_scale(q, s, c, file, name));
  const int64_t N = q.dim(0), K = q.dim(1), bk = (K + c.block_k - 1) / c.block_k;
  if (row_begin < 0 || row_begin > row_end || row_end > N) {
    return invalid_argument(fmt::format("{}: rows [{}, {}) of tensor '{}' {} are out of range", file, row_begin,
                                        row_end, name, q.shape_string()));
  }
  const float* table = detail::fp8_e4m3fn_decode_table();
  const uint8_t* qp = q.data_as<const uint8_t>();
  for (int64_t n = row_begin; n < row_end; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float sc = scale_at(s, (n / c.block_n) * bk + k / c.block_k);
      out[(n - row_begin) * K + k] = table[qp[n * K + k]] * sc;
    }
  }
  return ok_status();
}

Status dequantize_fp8_block(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c,
                            std::string_view file, std::string_view name, bf16_t* out) {
  GB_RETURN_IF_ERROR(check_fp8_block_scale(q, s, c, file, name));
  if (c.ue8m0_scales) {
    // A power of two: a positive normal value with no mantissa bits (F32: 23, BF16: 7).
    for (int64_t i = 0; i < s.numel(); ++i) {
      // bf16 and e8m0 widen to float exactly, so one test covers every dtype.
      const float v = scale_at(s, i);
      uint32_t bits = 0;
      std::memcpy(&bits, &v, sizeof bits);
      const uint32_t exponent = (bits >> 23) & 0xffu;
      if ((bits >> 31) != 0 || exponent == 0 || exponent == 0xffu || (bits & 0x7fffffu) != 0) {
        return invalid_argument(
            fmt::format("{}: tensor '{}' element {} is {}, not a power of two, but quantization_config.scale_fmt is "
                        "\"ue8m0\"",
                        file, fp8_scale_tensor_name(name, c), i, v));
      }
    }
  }
  const int64_t N = q.dim(0), K = q.dim(1), bk = (K + c.block_k - 1) / c.block_k;
  const float* table = detail::fp8_e4m3fn_decode_table();
  const uint8_t* qp = q.data_as<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const float sc = scale_at(s, (n / c.block_n) * bk + k / c.block_k);
      out[n * K + k] = float_to_bf16(table[qp[n * K + k]] * sc);
    }
  }
  return ok_status();
}

namespace {

// The Linear weights a published FP8 checkpoint (DeepSeek-V3 / V3.2, Qwen3) stores as F8_E4M3 with a
// weight_scale_inv: every attention projection (GQA q/k/v/o; MLA q_a/q_b or q, kv_a_proj_with_mqa, kv_b, o;
// the DSA indexer's wq_b and wk) and every MLP / expert / shared expert projection. The router (mlp.gate),
// the indexer's weights_proj, embeddings, norms and the LM head stay as they are (docs/quant_weights.md).
bool is_fp8_role(const std::string& name) {
  const auto ends = [&](std::string_view s) {
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
           name[name.size() - s.size() - 1] == '.';
  };
  for (std::string_view p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_a_proj.weight",
                             "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight", "indexer.wq_b.weight",
                             "indexer.wk.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    if (ends(p)) return true;
  }
  return false;
}

}  // namespace

Status convert_checkpoint_to_fp8(const std::filesystem::path& dir, const Fp8BlockQuantConfig& c) {
  struct Out {
    SafetensorsTensorSpec spec;
    std::vector<char> bytes;
  };
  std::vector<Out> out;
  {
    GB_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir / "model.safetensors"));
    for (const SafetensorsTensor& t : f.tensors()) {
      GB_ASSIGN_OR_RETURN(TensorView v, f.view(t));
      const char* p = reinterpret_cast<const char*>(f.mapping().data() + t.offset);
      if (!is_fp8_role(t.name) || t.shape.size() != 2) {
        out.push_back({{t.name, v.dtype(), t.shape}, std::vector<char>(p, p + t.nbytes)});
        continue;
      }
      if (v.dtype() != DType::kBF16) {
        return invalid_argument(fmt::format("convert_checkpoint_to_fp8: {}: tensor '{}' is {}, not BF16", f.path(),
                                            t.name, dtype_name(v.dtype())));
      }
      const int64_t N = t.shape[0], K = t.shape[1];
      const int64_t bn = (N + c.block_n - 1) / c.block_n, bk = (K + c.block_k - 1) / c.block_k;
      const bf16_t* w = v.data_as<const bf16_t>();
      std::vector<float> scale(static_cast<size_t>(bn * bk));
      for (int64_t i = 0; i < bn; ++i) {
        for (int64_t j = 0; j < bk; ++j) {
          float amax = 0.f;
          for (int64_t n = i * c.block_n; n < std::min(N, (i + 1) * c.block_n); ++n) {
            for (int64_t k = j * c.block_k; k < std::min(K, (j + 1) * c.block_k); ++k) {
              amax = std::max(amax, std::fabs(bf16_to_float(w[n * K + k])));
            }
          }
          scale[static_cast<size_t>(i * bk + j)] = amax > 0.f ? amax / 448.0f : 1.0f;
        }
      }
      std::vector<char> codes(static_cast<size_t>(N * K));
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const float sc = scale[static_cast<size_t>((n / c.block_n) * bk + k / c.block_k)];
          codes[static_cast<size_t>(n * K + k)] =
              static_cast<char>(float_to_fp8_e4m3fn(bf16_to_float(w[n * K + k]) / sc).bits);
        }
      }
      out.push_back({{t.name, DType::kFp8E4M3FN, t.shape}, std::move(codes)});
      std::vector<char> sb(scale.size() * sizeof(float));
      std::memcpy(sb.data(), scale.data(), sb.size());
      out.push_back({{t.name + "_scale_inv", DType::kF32, {bn, bk}}, std::move(sb)});
    }
  }
  std::vector<SafetensorsTensorData> data;
  for (const Out& o : out) data.push_back({o.spec, o.bytes.data()});
  GB_RETURN_IF_ERROR(write_safetensors(dir / "model.safetensors", data));
  std::ifstream in(dir / "config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (!j.is_object()) return invalid_argument(fmt::format("{}: not a JSON object", (dir / "config.json").string()));
  j["quantization_config"] = {{"quant_method", "fp8"},
                              {"activation_scheme", "dynamic"},
                              {"fmt", "e4m3"},
                              {"weight_block_size", {c.block_n, c.block_k}}};
  const std::filesystem::path tmp = dir / "config.json.tmp";
  {
    std::ofstream o(tmp);
    o << j.dump(2) << "\n";
    if (!o) return unavailable(fmt::format("{}: write failed", tmp.string()));
  }
  std::filesystem::rename(tmp, dir / "config.json");
  return ok_status();
}

}  // namespace genbridge::model
