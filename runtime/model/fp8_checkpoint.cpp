#include "runtime/model/fp8_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/model/safetensors.h"

namespace genbridge::model {

using json = nlohmann::json;

Result<std::optional<Fp8BlockQuantConfig>> read_fp8_quantization_config(std::string_view text,
                                                                        std::string_view source) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("quantization_config")) return std::optional<Fp8BlockQuantConfig>();
  const json& q = j["quantization_config"];
  auto bad = [&](std::string_view key, const std::string& value, std::string_view rule) {
    return invalid_argument(fmt::format("{}: quantization_config.{} is {} but {}", source, key, value, rule));
  };
  if (!q.is_object()) return bad("", q.dump(), "it must be an object");
  const auto m = q.find("quant_method");
  if (m == q.end() || !m->is_string() || m->get<std::string>() != "fp8") {
    return bad("quant_method", m == q.end() ? std::string("missing") : m->dump(),
               "genbridge reads only quant_method \"fp8\" (block-scaled F8_E4M3 weights with weight_scale_inv)");
  }
  if (const auto f = q.find("fmt"); f != q.end() && (!f->is_string() || f->get<std::string>() != "e4m3")) {
    return bad("fmt", f->dump(), "genbridge reads only \"e4m3\"");
  }
  const auto b = q.find("weight_block_size");
  const bool ok_shape = b != q.end() && b->is_array() && b->size() == 2 && (*b)[0].is_number_integer() &&
                        (*b)[1].is_number_integer() && (*b)[0].get<int64_t>() > 0 && (*b)[1].get<int64_t>() > 0;
  if (!ok_shape) {
    return bad("weight_block_size", b == q.end() ? std::string("missing") : b->dump(),
               "it must be two positive integers [block_n, block_k] (per-tensor FP8 is not supported)");
  }
  return std::optional<Fp8BlockQuantConfig>(Fp8BlockQuantConfig{(*b)[0].get<int64_t>(), (*b)[1].get<int64_t>()});
}

namespace {

Status check_fp8_scale(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c, std::string_view file,
                       std::string_view name) {
  const int64_t N = q.dim(0), K = q.dim(1);
  const int64_t bn = (N + c.block_n - 1) / c.block_n, bk = (K + c.block_k - 1) / c.block_k;
  if (s.dtype() != DType::kF32 && s.dtype() != DType::kBF16) {
    return invalid_argument(fmt::format("{}: tensor '{}_scale_inv' has dtype {} but must be F32 or BF16", file, name,
                                        safetensors_dtype_name(s.dtype())));
  }
  if (s.rank() != 2 || s.dim(0) != bn || s.dim(1) != bk) {
    return invalid_argument(
        fmt::format("{}: tensor '{}_scale_inv' has shape {} but '{}' {} with weight_block_size [{}, {}] needs [{}, {}]",
                    file, name, s.shape_string(), name, q.shape_string(), c.block_n, c.block_k, bn, bk));
  }
  return ok_status();
}

}  // namespace

Status dequantize_fp8_rows_f32(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c,
                               std::string_view file, std::string_view name, int64_t row_begin, int64_t row_end,
                               float* out) {
  GB_RETURN_IF_ERROR(check_fp8_scale(q, s, c, file, name));
  const int64_t N = q.dim(0), K = q.dim(1), bk = (K + c.block_k - 1) / c.block_k;
  if (row_begin < 0 || row_begin > row_end || row_end > N) {
    return invalid_argument(fmt::format("{}: rows [{}, {}) of tensor '{}' {} are out of range", file, row_begin,
                                        row_end, name, q.shape_string()));
  }
  const float* table = detail::fp8_e4m3fn_decode_table();
  const uint8_t* qp = q.data_as<const uint8_t>();
  for (int64_t n = row_begin; n < row_end; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t si = (n / c.block_n) * bk + k / c.block_k;
      const float sc =
          s.dtype() == DType::kF32 ? s.data_as<const float>()[si] : bf16_to_float(s.data_as<const bf16_t>()[si]);
      out[(n - row_begin) * K + k] = table[qp[n * K + k]] * sc;
    }
  }
  return ok_status();
}

Status dequantize_fp8_block(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c,
                            std::string_view file, std::string_view name, bf16_t* out) {
  GB_RETURN_IF_ERROR(check_fp8_scale(q, s, c, file, name));
  const int64_t N = q.dim(0), K = q.dim(1), bk = (K + c.block_k - 1) / c.block_k;
  const float* table = detail::fp8_e4m3fn_decode_table();
  const uint8_t* qp = q.data_as<const uint8_t>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t si = (n / c.block_n) * bk + k / c.block_k;
      const float sc =
          s.dtype() == DType::kF32 ? s.data_as<const float>()[si] : bf16_to_float(s.data_as<const bf16_t>()[si]);
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
