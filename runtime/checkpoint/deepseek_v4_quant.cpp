#include "runtime/checkpoint/deepseek_v4_quant.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <vector>

#include "genbridge/core/threading.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/safetensors.h"

namespace genbridge::model {

V4WeightRole deepseek_v4_weight_role(std::string_view name) {
  for (std::string_view s : {".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight",
                             ".attn.wo_b.weight", ".attn.indexer.wq_b.weight", ".ffn.shared_experts.w1.weight",
                             ".ffn.shared_experts.w2.weight", ".ffn.shared_experts.w3.weight"}) {
    if (name.ends_with(s)) return V4WeightRole::kFp8Linear;
  }
  // ".ffn.experts.<digits>.w{1,2,3}.weight"
  constexpr std::string_view kExperts = ".ffn.experts.";
  const size_t at = name.rfind(kExperts);
  if (at == std::string_view::npos) return V4WeightRole::kPlain;
  std::string_view rest = name.substr(at + kExperts.size());
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  rest.remove_prefix(digits);
  if (digits > 0 && (rest == ".w1.weight" || rest == ".w2.weight" || rest == ".w3.weight")) {
    return V4WeightRole::kRoutedExpert;
  }
  return V4WeightRole::kPlain;
}

namespace {

// ---- exact dequantization: one table entry per (scale exponent byte, code) ----

// What code x 2^(byte - 127) is in bf16.
enum class Exactness : uint8_t { kExact, kNaN, kOverflow, kUnderflow };
struct Scaled {
  uint16_t bits = 0;  // the bf16 value when kExact
  Exactness kind = Exactness::kExact;
};

constexpr double kBf16Max = 3.3895313892515355e38;  // (2 - 2^-7) * 2^127

Scaled scaled_bf16(float code_value, int exponent) {
  if (std::isnan(code_value)) return {0, Exactness::kNaN};
  const double d = std::ldexp(static_cast<double>(code_value), exponent);  // exact in double
  if (std::fabs(d) > kBf16Max) return {0, Exactness::kOverflow};
  const float f = static_cast<float>(d);
  const bf16_t b = float_to_bf16(f);
  if (static_cast<double>(f) != d || bf16_to_float(b) != f) return {0, Exactness::kUnderflow};
  return {b.bits, Exactness::kExact};
}

// Byte b (E8M0, or the biased exponent of an F32 power of two) in [0, 254] times every e4m3 / e2m1 code.
struct ScaledTables {
  std::array<std::array<Scaled, 256>, 255> fp8;
  std::array<std::array<Scaled, 16>, 255> fp4;
};

const ScaledTables& scaled_tables() {
  static const std::unique_ptr<const ScaledTables> tables = [] {
    auto t = std::make_unique<ScaledTables>();
    for (int b = 0; b < 255; ++b) {
      for (int c = 0; c < 256; ++c) {
        t->fp8[static_cast<size_t>(b)][static_cast<size_t>(c)] =
            scaled_bf16(fp8_e4m3fn_to_float(fp8_e4m3fn_t{static_cast<uint8_t>(c)}), b - 127);
      }
      for (int c = 0; c < 16; ++c) {
        t->fp4[static_cast<size_t>(b)][static_cast<size_t>(c)] =
            scaled_bf16(fp4_e2m1_to_float(static_cast<uint8_t>(c)), b - 127);
      }
    }
    return std::unique_ptr<const ScaledTables>(std::move(t));
  }();
  return *tables;
}

// Runs rows [0, rows) through `row(n)`, which returns the first flat index in row n it refuses or -1, on the kernel
// threads; returns the smallest refused index (or -1), whatever the thread count.
template <typename Row>
int64_t first_refused(int64_t rows, int64_t row_cost, Row&& row) {
  std::atomic<int64_t> first{std::numeric_limits<int64_t>::max()};
  parallel_for(rows, row_cost, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      if (const int64_t at = row(n); at >= 0) {
        int64_t cur = first.load();
        while (at < cur && !first.compare_exchange_weak(cur, at)) {
        }
        return;  // later rows of this chunk hold larger indices
      }
    }
  });
  const int64_t f = first.load();
  return f == std::numeric_limits<int64_t>::max() ? -1 : f;
}

std::string why_inexact(Exactness kind) {
  return kind == Exactness::kOverflow ? "beyond bf16's largest finite value, 3.3895313892515355e+38"
                                      : "not a multiple of bf16's smallest subnormal, 2^-133";
}

Status nan_scale_byte(std::string_view file, const std::string& scale, int64_t i, int64_t j) {
  return invalid_argument(fmt::format(
      "{}: tensor '{}' element [{}, {}] is 0xff, E8M0's NaN; a scale byte b means 2^(b - 127) and must be at most "
      "0xfe",
      file, scale, i, j));
}

}  // namespace

Status dequantize_v4_fp8(const TensorView& q, const TensorView& s, const Fp8BlockQuantConfig& c, std::string_view file,
                         std::string_view name, bf16_t* out) {
  GB_CHECK(q.rank() == 2 && q.dtype() == DType::kFp8E4M3FN, "dequantize_v4_fp8: codes must be fp8 e4m3fn [N, K]");
  Fp8BlockQuantConfig naming = c;
  naming.deepseek_v4_scales = true;
  GB_RETURN_IF_ERROR(check_fp8_block_scale(q, s, naming, file, name));
  const std::string scale = fp8_scale_tensor_name(name, naming);
  const int64_t N = q.dim(0), K = q.dim(1), bn = s.dim(0), bk = s.dim(1);
  // Each block's exponent byte: E8M0 as stored (reinterpreted, never converted), F32's biased exponent.
  std::vector<uint8_t> exponent(static_cast<size_t>(bn * bk));
  for (int64_t i = 0; i < bn; ++i) {
    for (int64_t j = 0; j < bk; ++j) {
      const int64_t at = i * bk + j;
      if (s.dtype() == DType::kE8M0) {
        const uint8_t b = s.data_as<const uint8_t>()[at];
        if (b == 0xff) return nan_scale_byte(file, scale, i, j);
        exponent[static_cast<size_t>(at)] = b;
        continue;
      }
      const float v = s.data_as<const float>()[at];
      const uint32_t bits = std::bit_cast<uint32_t>(v);
      const uint32_t e = (bits >> 23) & 0xffu;
      if ((bits >> 31) != 0 || e == 0 || e == 0xffu || (bits & 0x7fffffu) != 0) {
        return invalid_argument(fmt::format(
            "{}: tensor '{}' element [{}, {}] is {}, not a power of two, but quantization_config.scale_fmt is "
            "\"ue8m0\" (a positive normal power of two, so that the bf16 dequantization is exact)",
            file, scale, i, j, v));
      }
      exponent[static_cast<size_t>(at)] = static_cast<uint8_t>(e);
    }
  }
  const ScaledTables& t = scaled_tables();
  const uint8_t* codes = q.data_as<const uint8_t>();
  const int64_t bad = first_refused(N, K, [&](int64_t n) -> int64_t {
    const uint8_t* row_exp = exponent.data() + (n / c.block_n) * bk;
    for (int64_t k = 0; k < K; ++k) {
      const Scaled& v = t.fp8[row_exp[k / c.block_k]][codes[n * K + k]];
      if (v.kind != Exactness::kExact) return n * K + k;
      out[n * K + k] = bf16_t{v.bits};
    }
    return -1;
  });
  if (bad < 0) return ok_status();
  const int64_t n = bad / K, k = bad % K, i = n / c.block_n, j = k / c.block_k;
  const uint8_t code = codes[bad], b = exponent[static_cast<size_t>(i * bk + j)];
  const Scaled& v = t.fp8[b][code];
  if (v.kind == Exactness::kNaN) {
    return invalid_argument(
        fmt::format("{}: tensor '{}' element [{}, {}] is the e4m3 code 0x{:02x}, NaN; every weight "
                    "must be finite",
                    file, name, n, k, code));
  }
  const float cv = fp8_e4m3fn_to_float(fp8_e4m3fn_t{code});
  return invalid_argument(fmt::format(
      "{}: tensor '{}' element [{}, {}] is e4m3 {} x 2^{} (the scale '{}' [{}, {}]) = {}, {}: genbridge binds the "
      "dequantized weight in bf16 and refuses a value it would have to round",
      file, name, n, k, cv, static_cast<int>(b) - 127, scale, i, j, std::ldexp(static_cast<double>(cv), b - 127),
      why_inexact(v.kind)));
}

Status dequantize_v4_mxfp4(const TensorView& q, const TensorView& s, std::string_view file, std::string_view name,
                           bf16_t* out) {
  GB_CHECK(q.rank() == 2 && dtype_size(q.dtype()) == 1, "dequantize_v4_mxfp4: codes must be one-byte [N, K / 2]");
  const int64_t N = q.dim(0), K = 2 * q.dim(1);
  std::string scale(name);
  if (scale.ends_with(".weight")) scale.resize(scale.size() - 7);
  scale += ".scale";
  if (K % kMxfp4BlockK != 0) {
    return invalid_argument(fmt::format(
        "{}: tensor '{}' {} holds MXFP4 rows of K = {} values, not a multiple of {} (one E8M0 scale per {} along K)",
        file, name, q.shape_string(), K, kMxfp4BlockK, kMxfp4BlockK));
  }
  if (s.dtype() != DType::kE8M0) {
    return invalid_argument(fmt::format(
        "{}: tensor '{}' has dtype {} but must be F8_E8M0 (an MXFP4 weight's scales are E8M0 bytes, one per {} along "
        "K)",
        file, scale, safetensors_dtype_name(s.dtype()), kMxfp4BlockK));
  }
  const int64_t nb = K / kMxfp4BlockK;
  if (s.rank() != 2 || s.dim(0) != N || s.dim(1) != nb) {
    return invalid_argument(fmt::format(
        "{}: tensor '{}' has shape {} but the MXFP4 weight '{}' {} (K = {}, two e2m1 values per byte) needs [{}, {}]",
        file, scale, s.shape_string(), name, q.shape_string(), K, N, nb));
  }
  const uint8_t* sb = s.data_as<const uint8_t>();
  for (int64_t i = 0; i < N * nb; ++i) {
    if (sb[i] == 0xff) return nan_scale_byte(file, scale, i / nb, i % nb);
  }
  const ScaledTables& t = scaled_tables();
  const uint8_t* codes = q.data_as<const uint8_t>();
  const int64_t bad = first_refused(N, K, [&](int64_t n) -> int64_t {
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t byte = codes[n * (K / 2) + k / 2];
      const Scaled& v = t.fp4[sb[n * nb + k / kMxfp4BlockK]][k % 2 == 0 ? byte & 0xf : byte >> 4];
      if (v.kind != Exactness::kExact) return n * K + k;
      out[n * K + k] = bf16_t{v.bits};
    }
    return -1;
  });
  if (bad < 0) return ok_status();
  const int64_t n = bad / K, k = bad % K;
  const uint8_t byte = codes[n * (K / 2) + k / 2], nibble = k % 2 == 0 ? byte & 0xf : byte >> 4;
  const uint8_t b = sb[n * nb + k / kMxfp4BlockK];
  const float cv = fp4_e2m1_to_float(nibble);
  return invalid_argument(fmt::format(
      "{}: tensor '{}' element [{}, {}] is e2m1 {} x 2^{} (the scale '{}' [{}, {}]) = {}, {}: genbridge binds the "
      "dequantized weight in bf16 and refuses a value it would have to round",
      file, name, n, k, cv, static_cast<int>(b) - 127, scale, n, k / kMxfp4BlockK,
      std::ldexp(static_cast<double>(cv), b - 127), why_inexact(t.fp4[b][nibble].kind)));
}

// ---- make-model's converter ----

namespace {

// The E8M0 byte of the smallest power of two 2^e with amax <= max * 2^e (amax 0: 2^0), e clamped to [-127, 127].
uint8_t pow2_scale_byte(float amax, double max) {
  if (!(amax > 0.f)) return 127;
  int ea = 0, em = 0;
  std::frexp(static_cast<double>(amax), &ea);
  std::frexp(max, &em);
  int e = ea - em;  // within one of the answer: comparisons below are exact in double
  while (static_cast<double>(amax) > std::ldexp(max, e)) ++e;
  while (static_cast<double>(amax) <= std::ldexp(max, e - 1)) --e;
  return static_cast<uint8_t>(std::clamp(e, -127, 127) + 127);
}

struct Converted {
  SafetensorsTensorSpec spec;
  std::vector<char> bytes;
};

// 2^(127 - byte): the multiplier that divides by a block's E8M0 scale (exact: 2^-127..2^127 are all fp32 values).
float inverse_scale(uint8_t byte) { return std::ldexp(1.0f, 127 - byte); }

// codes F8_E4M3 [N, K] + scale F8_E8M0 [ceil(N / 128), ceil(K / 128)]; the codes through core's scaled encoder.
void quantize_fp8_blocks(const std::string& name, const bf16_t* w, int64_t N, int64_t K, std::vector<Converted>* out) {
  constexpr int64_t kBlock = 128;
  const int64_t bn = (N + kBlock - 1) / kBlock, bk = (K + kBlock - 1) / kBlock;
  std::vector<char> scale(static_cast<size_t>(bn * bk));
  parallel_for(bn, kBlock * K, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < bk; ++j) {
        float amax = 0.f;
        for (int64_t n = i * kBlock; n < std::min(N, (i + 1) * kBlock); ++n) {
          for (int64_t k = j * kBlock; k < std::min(K, (j + 1) * kBlock); ++k) {
            amax = std::max(amax, std::fabs(bf16_to_float(w[n * K + k])));
          }
        }
        scale[static_cast<size_t>(i * bk + j)] = static_cast<char>(pow2_scale_byte(amax, 448.0));
      }
    }
  });
  std::vector<char> codes(static_cast<size_t>(N * K));
  parallel_for(N, K, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = b; n < e; ++n) {
      bf16_to_float_n(w + n * K, row.data(), static_cast<size_t>(K));
      for (int64_t j = 0; j < bk; ++j) {
        const int64_t k0 = j * kBlock, len = std::min(K - k0, kBlock);
        float_to_fp8_e4m3fn_n(row.data() + k0,
                              inverse_scale(static_cast<uint8_t>(scale[static_cast<size_t>((n / kBlock) * bk + j)])),
                              reinterpret_cast<fp8_e4m3fn_t*>(codes.data() + n * K + k0), static_cast<size_t>(len));
      }
    }
  });
  out->push_back({{name, DType::kFp8E4M3FN, {N, K}}, std::move(codes)});
  out->push_back(
      {{fp8_scale_tensor_name(name, {.deepseek_v4_scales = true}), DType::kE8M0, {bn, bk}}, std::move(scale)});
}

// codes I8 [N, K / 2] (even element in the low nibble) + scale F8_E8M0 [N, K / 32].
void quantize_mxfp4(const std::string& name, const bf16_t* w, int64_t N, int64_t K, std::vector<Converted>* out) {
  const int64_t nb = K / kMxfp4BlockK;
  std::vector<char> scale(static_cast<size_t>(N * nb)), codes(static_cast<size_t>(N * K / 2));
  parallel_for(N, K, [&](int64_t b, int64_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t n = b; n < e; ++n) {
      bf16_to_float_n(w + n * K, row.data(), static_cast<size_t>(K));
      for (int64_t j = 0; j < nb; ++j) {
        const float* x = row.data() + j * kMxfp4BlockK;
        float amax = 0.f;
        for (int64_t k = 0; k < kMxfp4BlockK; ++k) amax = std::max(amax, std::fabs(x[k]));
        const uint8_t byte = pow2_scale_byte(amax, 6.0);
        scale[static_cast<size_t>(n * nb + j)] = static_cast<char>(byte);
        float_to_fp4_e2m1x2_n(x, inverse_scale(byte),
                              reinterpret_cast<uint8_t*>(codes.data() + (n * K + j * kMxfp4BlockK) / 2),
                              static_cast<size_t>(kMxfp4BlockK));
      }
    }
  });
  std::string scale_name = name.substr(0, name.size() - std::string_view(".weight").size()) + ".scale";
  out->push_back({{name, DType::kI8, {N, K / 2}}, std::move(codes)});
  out->push_back({{std::move(scale_name), DType::kE8M0, {N, nb}}, std::move(scale)});
}

}  // namespace

Status convert_checkpoint_to_deepseek_v4_fp8(const std::filesystem::path& dir, V4ExpertDtype experts) {
  GB_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir / "config.json"));
  if (!config.is_deepseek_v4() || config.dsv4.quantized()) {
    return invalid_argument(fmt::format(
        "convert_checkpoint_to_deepseek_v4_fp8: {} is not a DeepSeek-V4 checkpoint in the bf16 form", dir.string()));
  }
  if (experts == V4ExpertDtype::kBf16) {
    return invalid_argument("convert_checkpoint_to_deepseek_v4_fp8: the routed experts must become fp4 or fp8");
  }
  std::vector<Converted> out;
  {
    GB_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir / "model.safetensors"));
    for (const SafetensorsTensor& t : f.tensors()) {
      const V4WeightRole role = deepseek_v4_weight_role(t.name);
      if (role == V4WeightRole::kPlain) {  // copied as it is (the I64 tid2eid tables included)
        const DType types[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kI64, DType::kI32};
        const DType* type = std::find_if(std::begin(types), std::end(types),
                                         [&](DType d) { return safetensors_dtype_name(d) == t.dtype; });
        if (type == std::end(types)) {
          return invalid_argument(fmt::format("convert_checkpoint_to_deepseek_v4_fp8: {}: tensor '{}' has dtype {}",
                                              f.path(), t.name, t.dtype));
        }
        const char* p = reinterpret_cast<const char*>(f.mapping().data() + t.offset);
        out.push_back({{t.name, *type, t.shape}, std::vector<char>(p, p + t.nbytes)});
        continue;
      }
      GB_ASSIGN_OR_RETURN(TensorView v, f.view(t));
      if (v.dtype() != DType::kBF16 || v.rank() != 2) {
        return invalid_argument(
            fmt::format("convert_checkpoint_to_deepseek_v4_fp8: {}: tensor '{}' is {} {}, not a "
                        "BF16 matrix",
                        f.path(), t.name, safetensors_dtype_name(v.dtype()), v.shape_string()));
      }
      const int64_t N = v.dim(0), K = v.dim(1);
      if (role == V4WeightRole::kFp8Linear || experts == V4ExpertDtype::kFp8) {
        quantize_fp8_blocks(t.name, v.data_as<const bf16_t>(), N, K, &out);
        continue;
      }
      if (K % kMxfp4BlockK != 0) {
        return invalid_argument(fmt::format(
            "convert_checkpoint_to_deepseek_v4_fp8: {}: routed expert '{}' {} has K = {}, not a multiple of {} (MXFP4 "
            "has one scale per {} along K)",
            f.path(), t.name, v.shape_string(), K, kMxfp4BlockK, kMxfp4BlockK));
      }
      quantize_mxfp4(t.name, v.data_as<const bf16_t>(), N, K, &out);
    }
  }
  std::vector<SafetensorsTensorData> data;
  for (const Converted& o : out) data.push_back({o.spec, o.bytes.data()});
  GB_RETURN_IF_ERROR(write_safetensors(dir / "model.safetensors", data));
  config.dsv4.expert_dtype = experts;
  const std::filesystem::path tmp = dir / "config.json.tmp";
  {
    std::ofstream o(tmp);
    o << to_config_json(config);
    if (!o) return unavailable(fmt::format("{}: write failed", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir / "config.json", ec);
  if (ec) return unavailable(fmt::format("{}: rename failed: {}", tmp.string(), ec.message()));
  return ok_status();
}

}  // namespace genbridge::model
