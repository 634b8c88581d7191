// Hugging Face FP8 block-scaled checkpoints: make-model's converter writes one, Checkpoint::open
// reads it back (F8_E4M3 + weight_scale_inv dequantized to bf16 within the documented bound), the engine runs
// it with --weight-quant, and every inconsistent scale tensor, block size or dtype is an error naming it.
#include "runtime/checkpoint/fp8_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "support/checkpoint_edit.h"
#include "support/quant_accuracy.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::testing {
namespace {

namespace fs = std::filesystem;

struct Raw {
  model::SafetensorsTensorSpec spec;
  std::vector<char> bytes;
};

// Rewrites model.safetensors of `dir` through `edit` (FP8 tensors included).
void edit_tensors(const fs::path& dir, const std::function<void(std::vector<Raw>&)>& edit) {
  std::vector<Raw> t;
  {
    auto f = model::SafetensorsFile::open(dir / "model.safetensors").value();
    for (const model::SafetensorsTensor& e : f.tensors()) {
      const DType d = e.dtype == "F8_E4M3" ? DType::kFp8E4M3FN
                      : e.dtype == "BF16"  ? DType::kBF16
                      : e.dtype == "F16"   ? DType::kF16
                                           : DType::kF32;
      const char* p = reinterpret_cast<const char*>(f.mapping().data() + e.offset);
      t.push_back({{e.name, d, e.shape}, std::vector<char>(p, p + e.nbytes)});
    }
  }
  edit(t);
  std::vector<model::SafetensorsTensorData> data;
  for (const Raw& r : t) data.push_back({r.spec, r.bytes.data()});
  ASSERT_TRUE(model::write_safetensors(dir / "model.safetensors", data).ok());
}

void edit_config(const fs::path& dir, const std::string& from, const std::string& to) {
  std::ifstream in(dir / "config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  std::ofstream(dir / "config.json") << s;
}

class Fp8Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 4, dir_ / "bf16").ok());
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 4, dir_ / "fp8").ok());
    ASSERT_TRUE(model::convert_checkpoint_to_fp8(dir_ / "fp8").ok());
  }
  std::string open_error() {
    auto c = model::Checkpoint::open(dir_ / "fp8");
    EXPECT_FALSE(c.ok());
    return c.ok() ? std::string() : c.status().message();
  }
  TempDir dir_;
};

// |bf16(e4m3(w / s) * s) - w| <= 2^-4 |w| + 2^-10 s (e4m3 rounding, normal and subnormal) plus bf16's
// 2^-9 of the result: <= 0.0645 |w| + 0.00101 s, s = amax(128 x 128 block) / 448. Returns the number of
// elements that changed (each view of `va` against the same view of `vb`).
int64_t expect_within_fp8_bound(const std::vector<TensorView>& va, const std::vector<TensorView>& vb) {
  EXPECT_EQ(va.size(), vb.size());
  int64_t changed = 0, bad = 0;
  for (size_t t = 0; t < std::min(va.size(), vb.size()); ++t) {
    const std::vector<double> x = to_doubles(va[t]), y = to_doubles(vb[t]);
    EXPECT_EQ(x.size(), y.size());
    if (x.size() != y.size()) continue;
    const int64_t N = va[t].rank() == 2 ? va[t].dim(0) : 1, K = va[t].rank() == 2 ? va[t].dim(1) : va[t].numel();
    const int64_t bk = (K + 127) / 128;
    std::vector<double> block_amax(static_cast<size_t>((N + 127) / 128 * bk), 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        double& m = block_amax[static_cast<size_t>(n / 128 * bk + k / 128)];
        m = std::max(m, std::abs(x[n * K + k]));
      }
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const double amax = block_amax[static_cast<size_t>(n / 128 * bk + k / 128)];
        const double w = x[n * K + k], got = y[n * K + k];
        changed += got != w;
        if (!(std::abs(got - w) <= 0.0645 * std::abs(w) + 0.00101 * amax / 448) && bad++ < 5)
          ADD_FAILURE() << "tensor " << t << " [" << n << ", " << k << "]: " << got << " vs " << w;
      }
    }
  }
  EXPECT_EQ(bad, 0);
  return changed;
}

TEST_F(Fp8Checkpoint, loads_as_bf16_within_the_documented_bound) {
  {
    auto f = model::SafetensorsFile::open(dir_ / "fp8" / "model.safetensors").value();
    const auto* q = f.find("model.layers.0.self_attn.q_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dtype, "F8_E4M3");
    ASSERT_NE(f.find("model.layers.0.self_attn.q_proj.weight_scale_inv"), nullptr);
    EXPECT_EQ(f.find("model.layers.0.mlp.gate.weight")->dtype, "BF16");  // the router stays bf16
  }
  auto a = model::Checkpoint::open(dir_ / "bf16");
  auto b = model::Checkpoint::open(dir_ / "fp8");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  EXPECT_GT(expect_within_fp8_bound(all_views(a->weights()), all_views(b->weights())), 1000);
  // The engine runs it, quantized again into the generation's scheme.
  std::vector<int32_t> prompt = {1, 2, 3, 4};
  auto acc = measure_quant_accuracy(*b, "auto", prompt, 4);
  ASSERT_TRUE(acc.ok()) << acc.status().to_string();
  EXPECT_EQ(acc->steps(), 5);
}

// DeepSeek-V3 / V3.2 FP8 checkpoints store every Linear weight of attention (q_a/q_b or q, kv_a_proj_with_mqa,
// kv_b, o; the indexer's wq_b and wk) and of the MLPs / experts / shared experts as F8_E4M3 with a 128 x 128
// weight_scale_inv; the router (mlp.gate.weight, e_score_correction_bias), the indexer's weights_proj, norms,
// embeddings and the LM head stay as they were. The converter writes exactly that, the loader reads each
// within the bound, and the engine runs it.
std::vector<TensorView> deepseek_views(const model::ModelWeights& w) {
  std::vector<TensorView> out = {w.embed_tokens, w.final_norm, w.lm_head};
  const auto mlp = [&](const model::MlpWeights& m) { out.insert(out.end(), {m.gate_proj, m.up_proj, m.down_proj}); };
  for (const model::LayerWeights& l : w.layers) {
    const model::MlaWeights& a = l.mla;
    const model::IndexerWeights& x = l.indexer;
    for (const TensorView& v : {l.input_layernorm, l.post_attention_layernorm, a.q_a_proj, a.q_a_layernorm, a.q_b_proj,
                                a.q_proj, a.kv_a_proj_with_mqa, a.kv_a_layernorm, a.kv_b_proj, a.o_proj, x.wq_b, x.wk,
                                x.k_norm, x.k_norm_bias, x.weights_proj}) {
      if (v.data()) out.push_back(v);
    }
    if (l.is_moe) {
      out.insert(out.end(), {l.moe.router, l.moe.e_score_correction_bias});
      for (const model::MlpWeights& e : l.moe.experts) mlp(e);
      if (l.moe.shared_expert.gate_proj.data()) mlp(l.moe.shared_expert);
    } else {
      mlp(l.dense);
    }
  }
  return out;
}

class Fp8DeepseekCheckpoint : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8DeepseekCheckpoint, every_linear_weight_is_fp8_and_loads_within_the_bound) {
  TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint(GetParam(), 4, dir / "bf16").ok());
  ASSERT_TRUE(model::write_synthetic_checkpoint(GetParam(), 4, dir / "fp8").ok());
  ASSERT_TRUE(model::convert_checkpoint_to_fp8(dir / "fp8").ok());
  const model::ModelConfig c = model::Checkpoint::open(dir / "bf16").value().config();
  {
    auto f = model::SafetensorsFile::open(dir / "fp8" / "model.safetensors").value();
    const auto ends = [](const std::string& n, std::string_view s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    int64_t fp8 = 0, roles_seen = 0;
    for (const model::SafetensorsTensor& t : f.tensors()) {
      if (ends(t.name, "_scale_inv")) continue;
      bool linear = false;
      for (std::string_view p : {".q_a_proj.weight", ".q_b_proj.weight", ".q_proj.weight", ".kv_a_proj_with_mqa.weight",
                                 ".kv_b_proj.weight", ".o_proj.weight", ".indexer.wq_b.weight", ".indexer.wk.weight",
                                 ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}) {
        linear |= ends(t.name, p);
      }
      EXPECT_EQ(t.dtype, linear ? "F8_E4M3" : "BF16") << t.name;
      if (!linear) continue;
      ++fp8;
      const auto* s = f.find(t.name + "_scale_inv");
      ASSERT_NE(s, nullptr) << t.name;
      EXPECT_EQ(s->dtype, "F32") << t.name;
      EXPECT_EQ(s->shape, (std::vector<int64_t>{(t.shape[0] + 127) / 128, (t.shape[1] + 127) / 128})) << t.name;
    }
    // Layer 0's attention roles, by name (q_a/q_b with q_lora, else q; the indexer's on V3.2).
    std::vector<std::string> attention = {"kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
    if (c.deepseek.q_lora_rank > 0) {
      attention.insert(attention.end(), {"q_a_proj", "q_b_proj"});
    } else {
      attention.push_back("q_proj");
    }
    if (c.has_indexer()) attention.insert(attention.end(), {"indexer.wq_b", "indexer.wk"});
    for (const std::string& a : attention) {
      const auto* t = f.find("model.layers.0.self_attn." + a + ".weight");
      ASSERT_NE(t, nullptr) << a;
      EXPECT_EQ(t->dtype, "F8_E4M3") << a;
      ++roles_seen;
    }
    if (c.has_indexer()) {
      EXPECT_EQ(f.find("model.layers.0.self_attn.indexer.weights_proj.weight")->dtype, "BF16");
    }
    EXPECT_EQ(f.find("model.layers.1.mlp.gate.weight")->dtype, "BF16");
    EXPECT_EQ(f.find("lm_head.weight")->dtype, "BF16");
    if (c.deepseek.n_shared_experts > 0) {
      EXPECT_EQ(f.find("model.layers.1.mlp.shared_experts.down_proj.weight")->dtype, "F8_E4M3");
    }
    EXPECT_GT(fp8, roles_seen);
  }
  auto a = model::Checkpoint::open(dir / "bf16");
  auto b = model::Checkpoint::open(dir / "fp8");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  EXPECT_GT(expect_within_fp8_bound(deepseek_views(a->weights()), deepseek_views(b->weights())), 1000);
  // Every MLA projection is bound from its FP8 codes (the source --weight-quant converts from).
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerWeights& lw = b->weights().layers[static_cast<size_t>(l)];
    for (const TensorView* w : {&lw.mla.q_a_proj, &lw.mla.q_b_proj, &lw.mla.q_proj, &lw.mla.kv_a_proj_with_mqa,
                                &lw.mla.kv_b_proj, &lw.mla.o_proj, &lw.indexer.wq_b, &lw.indexer.wk}) {
      if (w->rank() == 2) {
        EXPECT_NE(b->fp8_source(*w), nullptr) << "layer " << l;
      }
    }
  }
  std::vector<int32_t> prompt = {1, 2, 3, 4};
  auto acc = measure_quant_accuracy(*b, "auto", prompt, 4);
  ASSERT_TRUE(acc.ok()) << acc.status().to_string();
  EXPECT_EQ(acc->steps(), 5);
}

INSTANTIATE_TEST_SUITE_P(Presets, Fp8DeepseekCheckpoint, ::testing::Values("tiny-dsa", "tiny-dsv3-noq"),
                         [](const auto& p) {
                           return std::string(p.param) == "tiny-dsa" ? "tiny_dsa" : "tiny_dsv3_noq";
                         });

TEST_F(Fp8Checkpoint, inconsistent_scale_tensors_and_configs_are_errors_naming_them) {
  const std::string f = (dir_ / "fp8" / "model.safetensors").string();
  const std::string c = (dir_ / "fp8" / "config.json").string();
  const std::string w = "model.layers.1.self_attn.k_proj.weight";
  edit_tensors(dir_ / "fp8", [&](std::vector<Raw>& t) {
    std::erase_if(t, [&](const Raw& r) { return r.spec.name == w + "_scale_inv"; });
  });
  EXPECT_EQ(open_error(), f + ": tensor '" + w + "_scale_inv' is missing ('" + w +
                              "' is F8_E4M3 and config.json's quantization_config is fp8 block-scaled)");
  SetUp();
  edit_tensors(dir_ / "fp8", [&](std::vector<Raw>& t) {
    for (Raw& r : t) {
      if (r.spec.name == w + "_scale_inv") {
        r.spec.shape = {2, 1};
        r.bytes.resize(8);
      }
    }
  });
  EXPECT_EQ(open_error(), f + ": tensor '" + w + "_scale_inv' has shape [2, 1] but '" + w +
                              "' [128, 128] with weight_block_size [128, 128] needs [1, 1]");
  SetUp();
  edit_tensors(dir_ / "fp8", [&](std::vector<Raw>& t) {
    for (Raw& r : t) {
      if (r.spec.name == w + "_scale_inv") {
        r.spec.dtype = DType::kF16;
        r.bytes.resize(2);
      }
    }
  });
  EXPECT_EQ(open_error(), f + ": tensor '" + w + "_scale_inv' has dtype F16 but must be F32 or BF16");
  SetUp();
  edit_config(dir_ / "fp8", "\"quant_method\": \"fp8\"", "\"quant_method\": \"awq\"");
  EXPECT_EQ(open_error(), c + ": quantization_config.quant_method is \"awq\" but genbridge reads only quant_method "
                              "\"fp8\" (block-scaled F8_E4M3 weights with weight_scale_inv)");
  SetUp();
  edit_config(dir_ / "fp8", "\"weight_block_size\": [\n      128,\n      128\n    ]", "\"weight_block_size\": [128]");
  EXPECT_EQ(open_error(), c + ": quantization_config.weight_block_size is [128] but it must be two integers "
                              "[block_n, block_k] in [1, 65536] (per-tensor FP8 is not supported)");
}

// Rewrites config.json of `dir` with quantization_config set to `q` (null: removed).
void set_quantization_config(const fs::path& dir, const nlohmann::json& q) {
  std::ifstream in(dir / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  if (q.is_null()) {
    j.erase("quantization_config");
  } else {
    j["quantization_config"] = q;
  }
  std::ofstream(dir / "config.json") << j.dump(2);
}

// Every key of quantization_config is checked against what genbridge does with the weights; a claim it
// cannot honour (static activation scales, another fmt, a module said to be unquantized that is F8, a key
// it does not know) is refused naming the key and the value (before: accepted without a word).
TEST_F(Fp8Checkpoint, every_quantization_config_key_is_validated) {
  const std::string c = (dir_ / "fp8" / "config.json").string();
  const nlohmann::json good = {
      {"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    nlohmann::json q = good;
    if (v.is_discarded()) {
      q.erase(key);
    } else {
      q[key] = v;
    }
    return q;
  };
  const nlohmann::json absent = nlohmann::json(nlohmann::json::value_t::discarded);
  const std::string keys =
      "quant_method, weight_block_size, fmt, activation_scheme, scale_fmt, modules_to_not_convert, ignored_layers, "
      "dequantize";
  const std::string act =
      "genbridge reads only \"dynamic\": it never uses a checkpoint's activation scales (input_scale); activations "
      "stay bf16, or are quantized per token at run time with --weight-quant";
  const std::string block =
      "it must be two integers [block_n, block_k] in [1, 65536] (per-tensor FP8 is not supported)";
  const std::vector<std::pair<nlohmann::json, std::string>> refused = {
      {with("activation_scheme", "static"), "quantization_config.activation_scheme is \"static\" but " + act},
      {with("activation_scheme", "bogus"), "quantization_config.activation_scheme is \"bogus\" but " + act},
      {with("activation_scheme", 1), "quantization_config.activation_scheme is 1 but " + act},
      {with("fmt", "e5m2"), "quantization_config.fmt is \"e5m2\" but genbridge reads only \"e4m3\" (F8_E4M3 codes)"},
      {with("scale_fmt", "fp32"),
       "quantization_config.scale_fmt is \"fp32\" but genbridge reads only \"ue8m0\" (every weight_scale_inv a power "
       "of two, checked at load) or no scale_fmt (any positive scale)"},
      {with("quant_method", absent),
       "quantization_config.quant_method is missing but genbridge reads only quant_method \"fp8\" (block-scaled "
       "F8_E4M3 weights with weight_scale_inv)"},
      {with("weight_block_size", absent), "quantization_config.weight_block_size is missing but " + block},
      {with("weight_block_size", {0, 128}), "quantization_config.weight_block_size is [0,128] but " + block},
      {with("weight_block_size", {128, -1}), "quantization_config.weight_block_size is [128,-1] but " + block},
      {with("weight_block_size", {128, 1000000}),
       "quantization_config.weight_block_size is [128,1000000] but " + block},
      {with("weight_block_size", nlohmann::json::parse("[128, 18446744073709551615]")),
       "quantization_config.weight_block_size is [128,18446744073709551615] but " + block},
      {with("weight_block_size", {128.0, 128}), "quantization_config.weight_block_size is [128.0,128] but " + block},
      {with("weight_block_size", {128, 128, 1}), "quantization_config.weight_block_size is [128,128,1] but " + block},
      {with("modules_to_not_convert", 5),
       "quantization_config.modules_to_not_convert is 5 but it must be a list of module names"},
      {with("ignored_layers", {"lm_head", 3}),
       "quantization_config.ignored_layers[1] is 3 but it must be a module name (a non-empty string)"},
      {with("dequantize", "yes"),
       "quantization_config.dequantize is \"yes\" but it must be a boolean (genbridge dequantizes FP8 weights at load "
       "either way)"},
      {with("input_scale_dtype", "f32"),
       "quantization_config.input_scale_dtype is \"f32\" but genbridge does not read this key, so it cannot honour it "
       "(it reads " +
           keys + ")"},
      {nlohmann::json(5), "quantization_config is 5 but it must be an object"},
  };
  for (const auto& [q, message] : refused) {
    SetUp();
    set_quantization_config(dir_ / "fp8", q);
    EXPECT_EQ(open_error(), c + ": " + message) << q.dump();
  }
  // What real checkpoints carry loads: DeepSeek-V3's keys, Qwen3-FP8's modules_to_not_convert (modules
  // that are bf16 here), vLLM's ignored_layers, transformers' dequantize, nulls.
  for (const nlohmann::json& q : {good, with("modules_to_not_convert", {"lm_head", "model.layers.0.mlp.gate"}),
                                  with("ignored_layers", nlohmann::json::array()), with("dequantize", false),
                                  with("fmt", nullptr), with("activation_scheme", absent)}) {
    SetUp();
    set_quantization_config(dir_ / "fp8", q);
    auto ck = model::Checkpoint::open(dir_ / "fp8");
    EXPECT_TRUE(ck.ok()) << q.dump() << ": " << ck.status().to_string();
  }
  // A module said to stay unquantized whose weight is F8.
  const std::string f = (dir_ / "fp8" / "model.safetensors").string();
  SetUp();
  set_quantization_config(dir_ / "fp8", with("modules_to_not_convert", {"model.layers.0.self_attn.q_proj"}));
  EXPECT_EQ(open_error(), f + ": tensor 'model.layers.0.self_attn.q_proj.weight' is F8_E4M3 but config.json's "
                              "quantization_config lists 'model.layers.0.self_attn.q_proj' among the modules left "
                              "unquantized (modules_to_not_convert / ignored_layers)");
}

// scale_fmt "ue8m0" (DeepSeek-V3.1's) promises power-of-two scales: make-model's amax / 448 scales break it,
// the same scales rounded to powers of two keep it.
TEST_F(Fp8Checkpoint, ue8m0_scale_fmt_needs_power_of_two_scales) {
  const std::string f = (dir_ / "fp8" / "model.safetensors").string();
  set_quantization_config(
      dir_ / "fp8",
      {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"}, {"weight_block_size", {128, 128}}});
  const std::string err = open_error();
  EXPECT_EQ(err.rfind(f + ": tensor 'model.layers.0.self_attn.q_proj.weight_scale_inv' element 0 is ", 0), 0u) << err;
  EXPECT_NE(err.find(", not a power of two, but quantization_config.scale_fmt is \"ue8m0\""), std::string::npos) << err;
  edit_tensors(dir_ / "fp8", [&](std::vector<Raw>& t) {
    for (Raw& r : t) {
      if (r.spec.name.size() < 10 || r.spec.name.substr(r.spec.name.size() - 10) != "_scale_inv") continue;
      float* v = reinterpret_cast<float*>(r.bytes.data());
      for (size_t i = 0; i < r.bytes.size() / sizeof(float); ++i) v[i] = std::exp2(std::round(std::log2(v[i])));
    }
  });
  auto ck = model::Checkpoint::open(dir_ / "fp8");
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
}

// F8 tensors without a quantization_config: the error names the missing config (before: "genbridge reads
// BF16, F16 and F32 tensors", as if F8 were never readable); a quantization_config on a checkpoint without
// F8 weights is refused too.
TEST_F(Fp8Checkpoint, f8_tensors_without_quantization_config_and_the_reverse_are_named) {
  const std::string f = (dir_ / "fp8" / "model.safetensors").string();
  set_quantization_config(dir_ / "fp8", nullptr);
  EXPECT_EQ(open_error(),
            f + ": tensor 'model.layers.0.self_attn.q_proj.weight' has dtype F8_E4M3 but config.json has no "
                "quantization_config; an FP8 checkpoint's config says how its codes are scaled (quantization_config: "
                "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]} with a '<name>_scale_inv' per "
                "weight, docs/quant_weights.md)");
  set_quantization_config(dir_ / "bf16", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}});
  auto ck = model::Checkpoint::open(dir_ / "bf16");
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().message(),
            (dir_ / "bf16" / "model.safetensors").string() +
                ": config.json's quantization_config says the weights are FP8 (quant_method \"fp8\") but no weight "
                "is F8_E4M3; remove quantization_config from a checkpoint that is not quantized");
}

}  // namespace
}  // namespace genbridge::testing
