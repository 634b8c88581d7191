// DeepSeek-V4's FP8 + MXFP4 checkpoint form (docs/deepseek.md, "DeepSeek-V4 checkpoints"): make-model's converter
// writes it, Checkpoint::open binds every FP8 / MXFP4 weight as its exact bf16 dequantization (code x 2^e, in
// both precisions) and keeps the file's codes and scales, the low nibble of a packed byte is the even element,
// E8M0 bytes are reinterpreted (byte 0 is 2^-127), and every inconsistency is an error naming the file, the tensor
// and the rule.
#include "runtime/checkpoint/deepseek_v4_quant.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "support/checkpoint_edit.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::RawTensor;
using testing::rewrite;

RawTensor& tensor(std::vector<RawTensor>& t, const std::string& name) {
  for (RawTensor& x : t) {
    if (x.spec.name == name) return x;
  }
  ADD_FAILURE() << "no tensor " << name;
  return t.front();
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// e2m1 as the OCP MX spec tabulates it (independent of core/formats): sign bit 3, magnitudes by the low 3 bits.
double e2m1(uint8_t nibble) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (nibble & 8 ? -1.0 : 1.0) * kMagnitude[nibble & 7];
}

// Whether bf16 holds `v` exactly: |v| <= (2 - 2^-7) 2^127 and v = m 2^e with an integer m of at most 8 bits and
// e >= -133 (the smallest subnormal is 2^-133).
bool bf16_holds(double v) {
  if (v == 0) return true;
  if (std::fabs(v) > std::ldexp(255.0, 120)) return false;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| in [2^(e-1), 2^e)
  const int lsb = std::max(e - 8, -133);
  const double m = std::ldexp(std::fabs(v), -lsb);
  return m == std::floor(m);
}

// The value a bound FP8 weight must have at [n, k]: e4m3(code) x its block's power-of-two scale.
double fp8_value(const Checkpoint::Fp8Source& s, int64_t n, int64_t k) {
  const int64_t K = s.codes.dim(1), si = (n / s.config.block_n) * s.scale_inv.dim(1) + k / s.config.block_k;
  const int e = s.scale_inv.dtype() == DType::kE8M0 ? s.scale_inv.data_as<const uint8_t>()[si] - 127
                                                    : std::ilogb(s.scale_inv.data_as<const float>()[si]);
  return std::ldexp(static_cast<double>(fp8_e4m3fn_to_float(fp8_e4m3fn_t{s.codes.data_as<const uint8_t>()[n * K + k]})),
                    e);
}

// The value a bound MXFP4 weight must have at [n, k]: the low nibble of byte k / 2 for even k, the high one for odd.
double fp4_value(const Checkpoint::Mxfp4Source& s, int64_t n, int64_t k) {
  const int64_t half = s.codes.dim(1), nb = s.scales.dim(1);
  const uint8_t byte = s.codes.data_as<const uint8_t>()[n * half + k / 2];
  return std::ldexp(e2m1(k % 2 == 0 ? byte & 0xf : byte >> 4),
                    s.scales.data_as<const uint8_t>()[n * nb + k / 32] - 127);
}

// Every weight DeepSeek's FP8 form quantizes, by name, with its bound view.
std::vector<std::pair<std::string, TensorView>> quantized_views(const Checkpoint& ck) {
  std::vector<std::pair<std::string, TensorView>> out;
  const ModelWeights& w = ck.weights();
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& lw = w.layers[l];
    const auto add = [&](const std::string& s, const TensorView& v) {
      out.emplace_back(fmt::format("layers.{}.{}", l, s), v);
    };
    add("attn.wq_a.weight", lw.v4.wq_a);
    add("attn.wq_b.weight", lw.v4.wq_b);
    add("attn.wkv.weight", lw.v4.wkv);
    add("attn.wo_a.weight", lw.v4.wo_a);
    add("attn.wo_b.weight", lw.v4.wo_b);
    if (lw.v4.index_wq_b.data()) add("attn.indexer.wq_b.weight", lw.v4.index_wq_b);
    add("ffn.shared_experts.w1.weight", lw.moe.shared_expert.gate_proj);
    add("ffn.shared_experts.w3.weight", lw.moe.shared_expert.up_proj);
    add("ffn.shared_experts.w2.weight", lw.moe.shared_expert.down_proj);
    for (size_t e = 0; e < lw.moe.experts.size(); ++e) {
      add(fmt::format("ffn.experts.{}.w1.weight", e), lw.moe.experts[e].gate_proj);
      add(fmt::format("ffn.experts.{}.w3.weight", e), lw.moe.experts[e].up_proj);
      add(fmt::format("ffn.experts.{}.w2.weight", e), lw.moe.experts[e].down_proj);
    }
  }
  return out;
}

// tiny-dsv4 (seed 3) in bf16 and in DeepSeek's FP8 + MXFP4 form, written once; each test edits a copy.
class DeepseekV4Fp8 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const ModelConfig c = synthetic_preset_config("tiny-dsv4").value();
    ASSERT_TRUE(write_synthetic_checkpoint(c, 3, *dir_ / "bf16").ok());
    ASSERT_TRUE(write_synthetic_checkpoint(c, 3, *dir_ / "fp4").ok());
    const Status fp4 = convert_checkpoint_to_deepseek_v4_fp8(*dir_ / "fp4");
    ASSERT_TRUE(fp4.ok()) << fp4.to_string();
    ASSERT_TRUE(write_synthetic_checkpoint(c, 3, *dir_ / "fp8").ok());
    const Status fp8 = convert_checkpoint_to_deepseek_v4_fp8(*dir_ / "fp8", V4ExpertDtype::kFp8);
    ASSERT_TRUE(fp8.ok()) << fp8.to_string();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // A fresh copy of the written checkpoint `form` ("bf16", "fp4" or "fp8").
  fs::path copy(const std::string& form) {
    const fs::path d = *dir_ / fmt::format("{}-{}", form, copies_++);
    fs::copy(*dir_ / form, d);
    return d;
  }
  static std::string open_error(const fs::path& d, const LoadOptions& o = {}) {
    Result<Checkpoint> r = Checkpoint::open(d, o);
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  }
  static void edit_config(const fs::path& d, const std::function<void(json&)>& edit) {
    json j = read_json(d / "config.json");
    edit(j);
    std::ofstream(d / "config.json") << j.dump(2);
  }
  static testing::TempDir* dir_;
  static int copies_;
};
testing::TempDir* DeepseekV4Fp8::dir_ = nullptr;
int DeepseekV4Fp8::copies_ = 0;

TEST(DeepseekV4WeightRole, follows_deepseeks_reference_model) {
  for (const char* n : {"layers.0.attn.wq_a.weight", "layers.12.attn.wq_b.weight", "layers.1.attn.wkv.weight",
                        "layers.1.attn.wo_a.weight", "layers.1.attn.wo_b.weight", "layers.3.attn.indexer.wq_b.weight",
                        "layers.0.ffn.shared_experts.w1.weight", "layers.0.ffn.shared_experts.w2.weight",
                        "mtp.0.ffn.shared_experts.w3.weight", "mtp.0.attn.wq_a.weight"}) {
    EXPECT_EQ(deepseek_v4_weight_role(n), V4WeightRole::kFp8Linear) << n;
  }
  for (const char* n :
       {"layers.0.ffn.experts.0.w1.weight", "layers.42.ffn.experts.255.w2.weight", "mtp.0.ffn.experts.7.w3.weight"}) {
    EXPECT_EQ(deepseek_v4_weight_role(n), V4WeightRole::kRoutedExpert) << n;
  }
  for (const char* n :
       {"embed.weight", "head.weight", "norm.weight", "layers.1.attn.compressor.wkv.weight",
        "layers.1.attn.compressor.wgate.weight", "layers.1.attn.indexer.compressor.wkv.weight",
        "layers.1.attn.indexer.weights_proj.weight", "layers.1.ffn.gate.weight", "layers.1.attn.q_norm.weight",
        "layers.1.attn.kv_norm.weight", "layers.1.attn.wq_a.scale", "layers.0.ffn.experts.x.w1.weight",
        "layers.0.ffn.experts.1.w4.weight", "mtp.0.e_proj.weight"}) {
    EXPECT_EQ(deepseek_v4_weight_role(n), V4WeightRole::kPlain) << n;
  }
}

// The converted file holds exactly DeepSeek's dtypes and shapes, and config.json the published quantization_config.
TEST_F(DeepseekV4Fp8, make_model_writes_deepseeks_form) {
  SafetensorsFile f = SafetensorsFile::open(*dir_ / "fp4" / "model.safetensors").value();
  const auto expect = [&](const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape) {
    const SafetensorsTensor* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, dtype) << name;
    EXPECT_EQ(t->shape, shape) << name;
  };
  expect("layers.1.attn.wq_a.weight", "F8_E4M3", {64, 128});
  expect("layers.1.attn.wq_a.scale", "F8_E8M0", {1, 1});
  expect("layers.1.attn.wq_b.scale", "F8_E8M0", {16, 1});  // [2048, 64]
  expect("layers.1.attn.wo_a.scale", "F8_E8M0", {1, 8});   // [128, 1024]
  expect("layers.1.attn.indexer.wq_b.weight", "F8_E4M3", {512, 64});
  expect("layers.1.ffn.shared_experts.w2.weight", "F8_E4M3", {128, 64});
  expect("layers.1.ffn.experts.0.w1.weight", "I8", {64, 64});  // [64, 128]: two e2m1 per byte
  expect("layers.1.ffn.experts.0.w1.scale", "F8_E8M0", {64, 4});
  expect("layers.1.ffn.experts.7.w2.weight", "I8", {128, 32});  // [128, 64]
  expect("layers.1.ffn.experts.7.w2.scale", "F8_E8M0", {128, 2});
  expect("mtp.0.attn.wq_a.weight", "F8_E4M3", {64, 128});
  expect("mtp.0.ffn.experts.3.w3.weight", "I8", {64, 64});
  for (const char* bf16 : {"embed.weight", "head.weight", "layers.1.attn.compressor.wkv.weight",
                           "layers.1.attn.indexer.weights_proj.weight", "layers.1.ffn.gate.weight",
                           "layers.1.attn.kv_norm.weight", "mtp.0.e_proj.weight"}) {
    EXPECT_EQ(f.find(bf16)->dtype, "BF16") << bf16;
  }
  EXPECT_EQ(f.find("layers.1.hc_attn_fn")->dtype, "F32");
  EXPECT_EQ(f.find("layers.1.attn.compressor.wkv.scale"), nullptr);
  const json c = read_json(*dir_ / "fp4" / "config.json");
  EXPECT_EQ(c["expert_dtype"], "fp4");
  EXPECT_EQ(c["quantization_config"], json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]})"));
  EXPECT_EQ(read_json(*dir_ / "fp8" / "config.json")["expert_dtype"], "fp8");
  EXPECT_EQ(
      SafetensorsFile::open(*dir_ / "fp8" / "model.safetensors").value().find("layers.1.ffn.experts.0.w1.scale")->shape,
      (std::vector<int64_t>{1, 1}));
}

// Every quantized weight is bound as code x scale, exactly, in both precisions; the codes and scales are the
// file's own (mapped), retrievable per weight; nothing else has a source.
TEST_F(DeepseekV4Fp8, binds_code_times_scale_exactly_in_both_precisions) {
  for (const char* form : {"fp4", "fp8"}) {
    for (WeightPrecision precision : {WeightPrecision::kBF16, WeightPrecision::kNative}) {
      SCOPED_TRACE(form);
      Result<Checkpoint> r = Checkpoint::open(*dir_ / form, {.precision = precision});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      const Checkpoint& ck = *r;
      int64_t fp8 = 0, fp4 = 0, mismatches = 0;
      for (const auto& [name, v] : quantized_views(ck)) {
        ASSERT_EQ(v.dtype(), DType::kBF16) << name;
        const Checkpoint::Fp8Source* s8 = ck.fp8_source(v);
        const Checkpoint::Mxfp4Source* s4 = ck.mxfp4_source(v);
        ASSERT_NE((s8 != nullptr) + (s4 != nullptr), 0) << name;
        ASSERT_EQ(s8 == nullptr, s4 != nullptr) << name;
        EXPECT_EQ(s8 ? s8->name : s4->name, name);
        EXPECT_EQ(s8 ? s8->file : s4->file, (*dir_ / form / "model.safetensors").string());
        const TensorView& codes = s8 ? s8->codes : s4->codes;
        EXPECT_NE(codes.data(), v.data());
        EXPECT_EQ(codes.dtype(), s8 ? DType::kFp8E4M3FN : DType::kFp4E2M1x2);
        if (s8) EXPECT_TRUE(s8->config.deepseek_v4_scales);
        if (s4) EXPECT_EQ(s4->scales.dtype(), DType::kE8M0);
        (s8 ? fp8 : fp4) += 1;
        for (int64_t n = 0; n < v.dim(0); ++n) {
          for (int64_t k = 0; k < v.dim(1); ++k) {
            const double want = s8 ? fp8_value(*s8, n, k) : fp4_value(*s4, n, k);
            const double got = bf16_to_float(v.data_as<const bf16_t>()[n * v.dim(1) + k]);
            if (got != want && mismatches++ < 5) ADD_FAILURE() << name << " [" << n << ", " << k << "]: " << got;
          }
        }
      }
      // Per layer 5 attention linears and 3 shared-expert ones, plus the indexer's wq_b on the 2 ratio-4 layers;
      // 8 experts x 3 routed.
      EXPECT_EQ(fp8, std::string(form) == "fp4" ? 34 : 34 + 96);
      EXPECT_EQ(fp4, std::string(form) == "fp4" ? 96 : 0);
      EXPECT_EQ(ck.fp8_source(ck.weights().layers[1].v4.compressor.wkv), nullptr);
      EXPECT_EQ(ck.mxfp4_source(ck.weights().layers[1].moe.router), nullptr);
      // The MTP layer's 53 tensors and its 32 scales are counted, not bound.
      EXPECT_EQ(ck.ignored_tensors(), 85);
      EXPECT_TRUE(ck.check_finite().ok());
    }
  }
}

// A dequantised row: byte 0x21 holds e2m1 code 1 (0.5) in its low nibble and code 2 (1.0) in its high one, so the
// row starts 0.5, 1.0 -- the even element is the low nibble (DeepSeek's convert.py stacks (low, high) per byte,
// and torch's float4_e2m1fn_x2 packs val1:val0).
TEST_F(DeepseekV4Fp8, fp4_low_nibble_is_the_even_element) {
  const fs::path d = copy("fp4");
  const std::string w = "layers.2.ffn.experts.5.w3.weight";
  rewrite(d, [&](std::vector<RawTensor>& t) {
    char* codes = tensor(t, w).bytes.data();
    codes[0] = 0x21;
    codes[1] = static_cast<char>(0xf7);                                              // low: 7 (6.0); high: 0xf (-6.0)
    codes[2] = static_cast<char>(0x8b);                                              // low: 0xb (-1.5); high: 8 (-0)
    tensor(t, "layers.2.ffn.experts.5.w3.scale").bytes[0] = static_cast<char>(128);  // 2^1
  });
  const Checkpoint ck = Checkpoint::open(d).value();
  const TensorView& v = ck.weights().layers[2].moe.experts[5].up_proj;
  std::vector<float> row(6);
  for (int k = 0; k < 6; ++k) row[static_cast<size_t>(k)] = bf16_to_float(v.data_as<const bf16_t>()[k]);
  EXPECT_EQ(row, (std::vector<float>{1.0f, 2.0f, 12.0f, -12.0f, -3.0f, 0.0f}));
  EXPECT_TRUE(std::signbit(row[5]));
}

// E8M0 bytes are exponents, reinterpreted: byte 0 is 2^-127, not 0 (a numeric conversion would make it 0).
TEST_F(DeepseekV4Fp8, e8m0_byte_zero_is_two_to_the_minus_127) {
  const fs::path d = copy("fp4");
  rewrite(d, [&](std::vector<RawTensor>& t) {
    tensor(t, "layers.0.ffn.experts.0.w1.weight").bytes[0] = 0x21;
    tensor(t, "layers.0.ffn.experts.0.w1.scale").bytes[0] = 0;
    RawTensor& wq_a = tensor(t, "layers.0.attn.wq_a.weight");
    std::fill(wq_a.bytes.begin(), wq_a.bytes.end(), 0x08);  // e4m3 2^-6
    tensor(t, "layers.0.attn.wq_a.scale").bytes[0] = 0;
  });
  const Checkpoint ck = Checkpoint::open(d).value();
  const TensorView& e = ck.weights().layers[0].moe.experts[0].gate_proj;
  EXPECT_EQ(bf16_to_float(e.data_as<const bf16_t>()[0]), std::ldexp(1.0f, -128));
  EXPECT_EQ(bf16_to_float(e.data_as<const bf16_t>()[1]), std::ldexp(1.0f, -127));
  const TensorView& q = ck.weights().layers[0].v4.wq_a;
  for (int64_t i = 0; i < q.numel(); ++i) {
    ASSERT_EQ(q.data_as<const bf16_t>()[i].bits, 0x0001) << i;  // 2^-133, bf16's smallest subnormal
  }
}

// Every (scale byte, code) pair, both formats: bound exactly when bf16 holds e x 2^k, else refused naming why.
// As docs/deepseek.md states: every FP8 code is exact for scale bytes 3..246 (2^-124..2^119), every FP4 code for
// bytes 0..252.
TEST(DeepseekV4Dequantize, exact_for_every_code_and_scale_or_refused) {
  const std::vector<int64_t> one = {1, 1}, fp4_shape = {1, 16}, fp4_scale = {1, 1};
  int64_t fp8_exact = 0, fp4_exact = 0;
  for (int b = 0; b < 255; ++b) {
    uint8_t scale_byte = static_cast<uint8_t>(b);
    const TensorView s(&scale_byte, DType::kE8M0, one.data(), 2);
    bool all_fp8 = true, all_fp4 = true;
    for (int c = 0; c < 256; ++c) {
      if ((c & 0x7f) == 0x7f) continue;  // NaN codes: refused, tested below
      uint8_t code = static_cast<uint8_t>(c);
      const TensorView q(&code, DType::kFp8E4M3FN, one.data(), 2);
      bf16_t out{0xffff};
      const Status st = dequantize_v4_fp8(q, s, {}, "f", "w.weight", &out);
      const double v = std::ldexp(static_cast<double>(fp8_e4m3fn_to_float(fp8_e4m3fn_t{code})), b - 127);
      ASSERT_EQ(st.ok(), bf16_holds(v)) << "byte " << b << " code " << c << ": " << st.to_string();
      if (st.ok()) {
        ASSERT_EQ(static_cast<double>(bf16_to_float(out)), v) << b << " " << c;
        ++fp8_exact;
      } else {
        all_fp8 = false;
        ASSERT_NE(st.message().find(std::fabs(v) > 1 ? "beyond bf16's largest finite value" : "smallest subnormal"),
                  std::string::npos)
            << st.message();
      }
    }
    // 32 values along K: codes 0..15 then 15..0, two per byte.
    std::vector<uint8_t> packed(16);
    for (int j = 0; j < 16; ++j) {
      const int lo = 2 * j < 16 ? 2 * j : 31 - 2 * j, hi = 2 * j + 1 < 16 ? 2 * j + 1 : 30 - 2 * j;
      packed[static_cast<size_t>(j)] = pack_fp4_e2m1x2(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    }
    const TensorView q4(packed.data(), DType::kU8, fp4_shape.data(), 2);
    const TensorView s4(&scale_byte, DType::kE8M0, fp4_scale.data(), 2);
    std::vector<bf16_t> out4(32);
    const Status st4 = dequantize_v4_mxfp4(q4, s4, "f", "e.weight", out4.data());
    bool holds = true;
    for (int k = 0; k < 32; ++k) {
      const uint8_t byte = packed[static_cast<size_t>(k / 2)];
      holds = holds && bf16_holds(std::ldexp(e2m1(k % 2 ? byte >> 4 : byte & 0xf), b - 127));
    }
    ASSERT_EQ(st4.ok(), holds) << "byte " << b << ": " << st4.to_string();
    if (st4.ok()) {
      for (int k = 0; k < 32; ++k) {
        const uint8_t byte = packed[static_cast<size_t>(k / 2)];
        ASSERT_EQ(static_cast<double>(bf16_to_float(out4[static_cast<size_t>(k)])),
                  std::ldexp(e2m1(k % 2 ? byte >> 4 : byte & 0xf), b - 127))
            << b << " " << k;
      }
      ++fp4_exact;
    }
    all_fp4 = st4.ok();
    EXPECT_EQ(all_fp8, b >= 3 && b <= 246) << "byte " << b;
    EXPECT_EQ(all_fp4, b <= 252) << "byte " << b;
  }
  fmt::print("exact (byte, code) pairs: FP8 {} of {}, FP4 scale bytes with every code exact: {} of 255\n", fp8_exact,
             255 * 254, fp4_exact);
}

TEST(DeepseekV4Dequantize, refusals_name_the_element_and_the_rule) {
  const std::vector<int64_t> one = {1, 1}, two = {1, 2};
  uint8_t codes[2] = {0x38, 0x7f};  // 1.0, NaN
  uint8_t byte = 127;
  bf16_t out[64];
  const TensorView q(codes, DType::kFp8E4M3FN, two.data(), 2), s(&byte, DType::kE8M0, one.data(), 2);
  EXPECT_EQ(
      dequantize_v4_fp8(q, s, {}, "m.safetensors", "l.w.weight", out).message(),
      "m.safetensors: tensor 'l.w.weight' element [0, 1] is the e4m3 code 0x7f, NaN; every weight must be finite");
  codes[1] = 0x01;  // 2^-9
  byte = 2;         // 2^-125: 2^-134 is below bf16's smallest subnormal
  EXPECT_EQ(dequantize_v4_fp8(q, s, {}, "m.safetensors", "l.w.weight", out).message(),
            "m.safetensors: tensor 'l.w.weight' element [0, 1] is e4m3 0.001953125 x 2^-125 (the scale 'l.w.scale' "
            "[0, 0]) = 4.591774807899561e-41, not a multiple of bf16's smallest subnormal, 2^-133: genbridge binds the "
            "dequantized weight in bf16 and refuses a value it would have to round");
  byte = 0xff;
  EXPECT_EQ(dequantize_v4_fp8(q, s, {}, "m.safetensors", "l.w.weight", out).message(),
            "m.safetensors: tensor 'l.w.scale' element [0, 0] is 0xff, E8M0's NaN; a scale byte b means 2^(b - 127) "
            "and must be at most 0xfe");
  float f32 = 0.75f;
  const TensorView sf(&f32, DType::kF32, one.data(), 2);
  EXPECT_EQ(dequantize_v4_fp8(q, sf, {}, "m.safetensors", "l.w.weight", out).message(),
            "m.safetensors: tensor 'l.w.scale' element [0, 0] is 0.75, not a power of two, but "
            "quantization_config.scale_fmt is \"ue8m0\" (a positive normal power of two, so that the bf16 "
            "dequantization is exact)");
  f32 = 0.25f;      // F32 powers of two (the expert_dtype "fp8" files) are accepted
  codes[1] = 0x40;  // 2.0
  ASSERT_TRUE(dequantize_v4_fp8(q, sf, {}, "m.safetensors", "l.w.weight", out).ok());
  EXPECT_EQ(bf16_to_float(out[0]), 0.25f);
  EXPECT_EQ(bf16_to_float(out[1]), 0.5f);
  bf16_t bf = float_to_bf16(0.25f);
  const TensorView sb(&bf, DType::kBF16, one.data(), 2);
  EXPECT_EQ(dequantize_v4_fp8(q, sb, {}, "m.safetensors", "l.w.weight", out).message(),
            "m.safetensors: tensor 'l.w.scale' has dtype BF16 but must be F8_E8M0 or F32");
  const std::vector<int64_t> wide = {1, 2, 1};
  const TensorView s3(&byte, DType::kE8M0, wide.data(), 3);
  EXPECT_EQ(dequantize_v4_fp8(q, s3, {}, "m.safetensors", "l.w.weight", out).message(),
            "m.safetensors: tensor 'l.w.scale' has shape [1, 2, 1] but 'l.w.weight' [1, 2] with weight_block_size "
            "[128, 128] needs [1, 1]");
  // MXFP4.
  uint8_t packed[16] = {0x07};
  uint8_t scales[2] = {253, 127};  // 6 x 2^126 is beyond bf16
  const std::vector<int64_t> p16 = {1, 16}, p8 = {2, 8}, s1 = {1, 1}, s2 = {1, 2};
  const TensorView q4(packed, DType::kI8, p16.data(), 2), e4(scales, DType::kE8M0, s1.data(), 2);
  EXPECT_EQ(dequantize_v4_mxfp4(q4, e4, "m.safetensors", "l.e.weight", out).message(),
            "m.safetensors: tensor 'l.e.weight' element [0, 0] is e2m1 6 x 2^126 (the scale 'l.e.scale' [0, 0]) = "
            "5.104235503814077e+38, beyond bf16's largest finite value, 3.3895313892515355e+38: genbridge binds the "
            "dequantized weight in bf16 and refuses a value it would have to round");
  scales[0] = 0xff;
  EXPECT_EQ(dequantize_v4_mxfp4(q4, e4, "m.safetensors", "l.e.weight", out).message(),
            "m.safetensors: tensor 'l.e.scale' element [0, 0] is 0xff, E8M0's NaN; a scale byte b means 2^(b - 127) "
            "and must be at most 0xfe");
  const TensorView e4f(&f32, DType::kF32, s1.data(), 2);
  EXPECT_EQ(dequantize_v4_mxfp4(q4, e4f, "m.safetensors", "l.e.weight", out).message(),
            "m.safetensors: tensor 'l.e.scale' has dtype F32 but must be F8_E8M0 (an MXFP4 weight's scales are E8M0 "
            "bytes, one per 32 along K)");
  const TensorView e42(scales, DType::kE8M0, s2.data(), 2);
  EXPECT_EQ(dequantize_v4_mxfp4(q4, e42, "m.safetensors", "l.e.weight", out).message(),
            "m.safetensors: tensor 'l.e.scale' has shape [1, 2] but the MXFP4 weight 'l.e.weight' [1, 16] (K = 32, "
            "two e2m1 values per byte) needs [1, 1]");
  const TensorView q8(packed, DType::kI8, p8.data(), 2);
  EXPECT_EQ(dequantize_v4_mxfp4(q8, e4, "m.safetensors", "l.e.weight", out).message(),
            "m.safetensors: tensor 'l.e.weight' [2, 8] holds MXFP4 rows of K = 16 values, not a multiple of 32 (one "
            "E8M0 scale per 32 along K)");
}

// Each inconsistency between config.json and the tensors is an error naming the file, the tensor and the rule.
TEST_F(DeepseekV4Fp8, every_inconsistency_names_the_file_the_tensor_and_the_rule) {
  struct Case {
    const char* what;
    const char* form;
    std::function<void(std::vector<RawTensor>&)> edit;
    std::string message;  // after "<dir>/model.safetensors: "
  };
  const auto erase = [](const std::string& name) {
    return [name](std::vector<RawTensor>& t) {
      std::erase_if(t, [&](const RawTensor& x) { return x.spec.name == name; });
    };
  };
  // A bf16 copy of `name` ([N, K]) from the bf16 checkpoint, replacing the quantized one and dropping its scale.
  const auto as_bf16 = [&](const std::string& name, const std::string& scale) {
    RawTensor plain;
    rewrite(copy("bf16"), [&](std::vector<RawTensor>& t) { plain = tensor(t, name); });
    return [plain, scale](std::vector<RawTensor>& t) {
      tensor(t, plain.spec.name) = plain;
      std::erase_if(t, [&](const RawTensor& x) { return x.spec.name == scale; });
    };
  };
  const std::vector<Case> cases = {
      {"missing FP8 scale", "fp4", erase("layers.2.attn.wo_b.scale"),
       "tensor 'layers.2.attn.wo_b.scale' is missing ('layers.2.attn.wo_b.weight' is F8_E4M3, and config.json's "
       "quantization_config gives it one power-of-two scale per 128 x 128 block)"},
      {"missing MXFP4 scale", "fp4", erase("layers.3.ffn.experts.6.w2.scale"),
       "tensor 'layers.3.ffn.experts.6.w2.scale' is missing ('layers.3.ffn.experts.6.w2.weight' is MXFP4, "
       "config.json's expert_dtype \"fp4\": it needs one F8_E8M0 scale per 32 along K)"},
      {"FP8 scale of the wrong shape", "fp4",
       [](std::vector<RawTensor>& t) {
         tensor(t, "layers.1.attn.wq_b.scale").spec.shape = {1, 16};
       },
       "tensor 'layers.1.attn.wq_b.scale' has shape [1, 16] but 'layers.1.attn.wq_b.weight' [2048, 64] with "
       "weight_block_size [128, 128] needs [16, 1]"},
      {"MXFP4 scale as F32", "fp4",
       [](std::vector<RawTensor>& t) {
         RawTensor& s = tensor(t, "layers.0.ffn.experts.1.w1.scale");
         s.spec.dtype = DType::kF32;
         s.spec.shape = {64, 1};
       },
       "tensor 'layers.0.ffn.experts.1.w1.scale' has dtype F32 but must be F8_E8M0 (an MXFP4 weight's scales are "
       "E8M0 bytes, one per 32 along K)"},
      {"MXFP4 codes of the wrong shape", "fp4",
       [](std::vector<RawTensor>& t) {
         tensor(t, "layers.0.ffn.experts.1.w2.weight").spec.shape = {64, 64};
       },
       "tensor 'layers.0.ffn.experts.1.w2.weight' has shape [64, 64] but config.json requires [128, 32] = "
       "[hidden_size, moe_intermediate_size / 2]: expert_dtype \"fp4\" packs two e2m1 values per byte"},
      {"FP8 weight of the wrong shape", "fp4",
       [](std::vector<RawTensor>& t) {
         tensor(t, "layers.1.attn.wkv.weight").spec.shape = {128, 512};
       },
       "tensor 'layers.1.attn.wkv.weight' has shape [128, 512] but config.json requires [512, 128] = [head_dim, "
       "hidden_size]"},
      {"E8M0 NaN", "fp4",
       [](std::vector<RawTensor>& t) { tensor(t, "layers.1.attn.wo_a.scale").bytes[5] = static_cast<char>(0xff); },
       "tensor 'layers.1.attn.wo_a.scale' element [0, 5] is 0xff, E8M0's NaN; a scale byte b means 2^(b - 127) and "
       "must be at most 0xfe"},
      {"NaN code", "fp4",
       [](std::vector<RawTensor>& t) { tensor(t, "layers.3.attn.indexer.wq_b.weight").bytes[64 * 9 + 3] = 0x7f; },
       "tensor 'layers.3.attn.indexer.wq_b.weight' element [9, 3] is the e4m3 code 0x7f, NaN; every weight must be "
       "finite"},
      {"MXFP4 beyond bf16", "fp4",
       [](std::vector<RawTensor>& t) {
         tensor(t, "layers.2.ffn.experts.0.w3.weight").bytes[64 * 3 + 16] = 0;     // elements [3, 32..33]: 0
         tensor(t, "layers.2.ffn.experts.0.w3.weight").bytes[64 * 3 + 17] = 0x70;  // [3, 34]: 0; [3, 35]: 6
         tensor(t, "layers.2.ffn.experts.0.w3.scale").bytes[4 * 3 + 1] = static_cast<char>(254);
       },
       "tensor 'layers.2.ffn.experts.0.w3.weight' element [3, 35] is e2m1 6 x 2^127 (the scale "
       "'layers.2.ffn.experts.0.w3.scale' [3, 1]) = 1.0208471007628154e+39, beyond bf16's largest finite value, "
       "3.3895313892515355e+38: genbridge binds the dequantized weight in bf16 and refuses a value it would have to "
       "round"},
      {"BF16 where FP8 is expected", "fp4", as_bf16("layers.1.attn.wq_b.weight", "layers.1.attn.wq_b.scale"),
       "tensor 'layers.1.attn.wq_b.weight' has dtype BF16 but config.json's quantization_config makes it an FP8 "
       "linear: it must be F8_E4M3 with a 'layers.1.attn.wq_b.scale' per 128 x 128 block"},
      {"BF16 routed expert in the fp4 form", "fp4",
       as_bf16("layers.1.ffn.experts.2.w1.weight", "layers.1.ffn.experts.2.w1.scale"),
       "tensor 'layers.1.ffn.experts.2.w1.weight' has dtype BF16 but config.json's expert_dtype is \"fp4\": a routed "
       "expert is MXFP4, I8 [N, K / 2] holding two e2m1 values per byte, with an F8_E8M0 "
       "'layers.1.ffn.experts.2.w1.scale' [N, K / 32]"},
      {"BF16 routed expert in the fp8 form", "fp8",
       as_bf16("layers.1.ffn.experts.2.w1.weight", "layers.1.ffn.experts.2.w1.scale"),
       "tensor 'layers.1.ffn.experts.2.w1.weight' has dtype BF16 but config.json's expert_dtype is \"fp8\" (or absent) "
       "with a quantization_config, so the routed experts are FP8 blocks: it must be F8_E4M3 with a "
       "'layers.1.ffn.experts.2.w1.scale' per 128 x 128 block"},
      {"FP8 where BF16 is expected", "fp4",
       [](std::vector<RawTensor>& t) {
         RawTensor& w = tensor(t, "layers.1.attn.compressor.wkv.weight");
         w.spec.dtype = DType::kFp8E4M3FN;
         w.bytes.resize(w.bytes.size() / 2);
       },
       "tensor 'layers.1.attn.compressor.wkv.weight' has dtype F8_E4M3 but DeepSeek-V4 keeps it unquantized (BF16; "
       "F16 and F32 are converted), in its FP8 form too: only the attention's wq_a, wq_b, wkv, wo_a and wo_b, the "
       "indexer's wq_b and the experts are quantized (docs/deepseek.md)"},
      {"a stray scale", "fp4",
       [](std::vector<RawTensor>& t) {
         RawTensor s = tensor(t, "layers.1.attn.wq_a.scale");
         s.spec.name = "layers.1.attn.compressor.wkv.scale";
         t.push_back(s);
       },
       "tensor 'layers.1.attn.compressor.wkv.scale' is not used by the model config.json describes (1 unused tensor; "
       "config and weights disagree)"},
  };
  for (const Case& c : cases) {
    const fs::path d = copy(c.form);
    rewrite(d, c.edit);
    EXPECT_EQ(open_error(d), (d / "model.safetensors").string() + ": " + c.message) << c.what;
  }
  // MXFP4 experts under expert_dtype "fp8" (absent), FP8 ones under "fp4".
  fs::path d = copy("fp4");
  edit_config(d, [](json& j) { j.erase("expert_dtype"); });
  EXPECT_EQ(open_error(d),
            (d / "model.safetensors").string() +
                ": tensor 'layers.0.ffn.experts.0.w1.weight' has dtype I8 but config.json's expert_dtype "
                "is \"fp8\" (or absent) with a quantization_config, so the routed experts are FP8 "
                "blocks: it must be F8_E4M3 with a 'layers.0.ffn.experts.0.w1.scale' per 128 x 128 "
                "block");
  d = copy("fp8");
  edit_config(d, [](json& j) { j["expert_dtype"] = "fp4"; });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.0.ffn.experts.0.w1.weight' has dtype F8_E4M3 but config.json's "
                               "expert_dtype is \"fp4\": a routed expert is MXFP4, I8 [N, K / 2] holding two e2m1 "
                               "values per byte, with an F8_E8M0 'layers.0.ffn.experts.0.w1.scale' [N, K / 32]");
  // A module the quantization_config leaves unquantized must not be F8_E4M3.
  d = copy("fp4");
  edit_config(d, [](json& j) { j["quantization_config"]["modules_to_not_convert"] = {"layers.1.attn.wq_a"}; });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.1.attn.wq_a.weight' has dtype F8_E4M3 but config.json's "
                               "quantization_config lists 'layers.1.attn.wq_a' among the modules left unquantized "
                               "(modules_to_not_convert / ignored_layers)");
}

// DeepSeek-V4-Flash-Base's form: FP8 experts, every scale F32 (powers of two); it loads to the same bf16 values.
TEST_F(DeepseekV4Fp8, f32_power_of_two_scales_load_like_e8m0) {
  const fs::path d = copy("fp8");
  rewrite(d, [](std::vector<RawTensor>& t) {
    for (RawTensor& r : t) {
      if (r.spec.dtype != DType::kE8M0) continue;
      std::vector<char> f32(r.bytes.size() * sizeof(float));
      for (size_t i = 0; i < r.bytes.size(); ++i) {
        const float v = std::ldexp(1.0f, static_cast<uint8_t>(r.bytes[i]) - 127);
        std::memcpy(f32.data() + i * sizeof v, &v, sizeof v);
      }
      r.spec.dtype = DType::kF32;
      r.bytes = f32;
    }
  });
  const Checkpoint a = Checkpoint::open(*dir_ / "fp8").value();
  const Checkpoint b = Checkpoint::open(d).value();
  const auto va = quantized_views(a), vb = quantized_views(b);
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_EQ(b.fp8_source(vb[i].second)->scale_inv.dtype(), DType::kF32);
    ASSERT_EQ(std::memcmp(va[i].second.data(), vb[i].second.data(), static_cast<size_t>(va[i].second.numel()) * 2), 0)
        << va[i].first;
  }
}

// The quantization error of tiny-dsv4's FP8 + MXFP4 form against its bf16 form, per tensor role (printed; the
// documented bound in docs/deepseek.md). Per element, RNE on the format's grid gives |q - w| <= 2^-4 |w| + 2^-10 s
// for e4m3 and <= 2^-2 |w| + 2^-2 s for e2m1 (s the block's scale; no block saturates: amax <= max x s).
TEST_F(DeepseekV4Fp8, quantization_error_per_role_is_within_the_format_bound) {
  const Checkpoint bf16 = Checkpoint::open(*dir_ / "bf16").value();
  const Checkpoint q = Checkpoint::open(*dir_ / "fp4").value();
  struct Role {
    double err2 = 0, ref2 = 0, max_rel = 0;
    int64_t n = 0;
  };
  std::map<std::string, Role> roles;
  const auto va = quantized_views(bf16), vq = quantized_views(q);
  ASSERT_EQ(va.size(), vq.size());
  int64_t beyond = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const std::string& name = va[i].first;
    std::string role = name.substr(name.find('.', 7) + 1);  // after "layers.L."
    if (role.starts_with("ffn.experts.")) role = "ffn.experts.E" + role.substr(role.find(".w"));
    const Checkpoint::Fp8Source* s8 = q.fp8_source(vq[i].second);
    const Checkpoint::Mxfp4Source* s4 = q.mxfp4_source(vq[i].second);
    const TensorView& w = va[i].second;
    Role& r = roles[role];
    for (int64_t n = 0; n < w.dim(0); ++n) {
      for (int64_t k = 0; k < w.dim(1); ++k) {
        const double x = bf16_to_float(w.data_as<const bf16_t>()[n * w.dim(1) + k]);
        const double y = bf16_to_float(vq[i].second.data_as<const bf16_t>()[n * w.dim(1) + k]);
        double scale = 0;
        if (s8) {
          const int64_t si = (n / 128) * s8->scale_inv.dim(1) + k / 128;
          scale = std::ldexp(1.0, s8->scale_inv.data_as<const uint8_t>()[si] - 127);
        } else {
          scale = std::ldexp(1.0, s4->scales.data_as<const uint8_t>()[n * s4->scales.dim(1) + k / 32] - 127);
        }
        const double bound = s8 ? std::ldexp(std::fabs(x), -4) + std::ldexp(scale, -10)
                                : std::ldexp(std::fabs(x), -2) + std::ldexp(scale, -2);
        if (std::fabs(y - x) > bound && beyond++ < 5) ADD_FAILURE() << name << " [" << n << ", " << k << "]";
        r.err2 += (y - x) * (y - x);
        r.ref2 += x * x;
        if (x != 0) r.max_rel = std::max(r.max_rel, std::fabs(y - x) / std::fabs(x));
        ++r.n;
      }
    }
  }
  fmt::print("tiny-dsv4 (seed 3), FP8 + MXFP4 form vs bf16: relative RMS error ||q - w|| / ||w|| per role\n");
  for (const auto& [role, r] : roles) {
    const double rel = std::sqrt(r.err2 / r.ref2);
    fmt::print("  {:<32} {:>7} elements  rel RMS {:.4f}  max |q - w| / |w| {:.4f}\n", role, r.n, rel, r.max_rel);
    EXPECT_LT(rel, role.starts_with("ffn.experts") ? 0.12 : 0.03) << role;
  }
}

}  // namespace
}  // namespace genbridge::model
