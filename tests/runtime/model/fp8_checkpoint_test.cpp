// Hugging Face FP8 block-scaled checkpoints: make-model's converter writes one, Checkpoint::open
// reads it back (F8_E4M3 + weight_scale_inv dequantized to bf16 within the documented bound), the engine runs
// it with --weight-quant, and every inconsistent scale tensor, block size or dtype is an error naming it.
#include "runtime/model/fp8_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "runtime/model/checkpoint.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/synthetic.h"
#include "support/checkpoint_edit.h"
#include "support/quant_accuracy.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"

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
// 2^-9 of the result: <= 0.0645 |w| + 0.00101 s, s = amax(128 x 128 block) / 448.
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
  const auto va = all_views(a->weights()), vb = all_views(b->weights());
  ASSERT_EQ(va.size(), vb.size());
  int64_t changed = 0, bad = 0;
  for (size_t t = 0; t < va.size(); ++t) {
    const std::vector<double> x = to_doubles(va[t]), y = to_doubles(vb[t]);
    ASSERT_EQ(x.size(), y.size());
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
  EXPECT_GT(changed, 1000);
  EXPECT_EQ(bad, 0);
  // The engine runs it, quantized again into the generation's scheme.
  std::vector<int32_t> prompt = {1, 2, 3, 4};
  auto acc = measure_quant_accuracy(*b, "auto", prompt, 4);
  ASSERT_TRUE(acc.ok()) << acc.status().to_string();
  EXPECT_EQ(acc->steps(), 5);
}

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
  EXPECT_EQ(open_error(), c + ": quantization_config.weight_block_size is [128] but it must be two positive integers "
                              "[block_n, block_k] (per-tensor FP8 is not supported)");
  SetUp();
  edit_config(dir_ / "fp8", "\"quantization_config\"", "\"no_quantization_config\"");
  EXPECT_NE(open_error().find("has dtype F8_E4M3; genbridge reads BF16, F16 and F32 tensors"), std::string::npos);
}

}  // namespace
}  // namespace genbridge::testing
