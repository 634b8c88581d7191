// Checkpoint: binding typed weights to a synthetic checkpoint, zero-copy bf16, conversion of fp16/fp32 at
// open, tied embeddings, and every validation error (missing / wrong shape / wrong dtype / unused tensor).
#include "runtime/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "support/checkpoint_edit.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

using testing::RawTensor;
using testing::rewrite;

RawTensor* find(std::vector<RawTensor>& v, const std::string& name) {
  for (RawTensor& t : v) {
    if (t.spec.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

std::string open_error(const std::filesystem::path& dir, const LoadOptions& options = {}) {
  Result<Checkpoint> c = Checkpoint::open(dir, options);
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  return c.status().message();
}

bool points_into(const TensorView& v, const Checkpoint& ck) {
  for (const auto& f : ck.store().files()) {
    const std::byte* p = static_cast<const std::byte*>(v.data());
    if (p >= f->mapping().data() && p < f->mapping().data() + f->mapping().size()) return true;
  }
  return false;
}

using testing::all_views;

TEST(Checkpoint, binds_every_weight_of_tiny_zero_copy) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 1, dir.path()).ok());
  Result<Checkpoint> r = Checkpoint::open(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const Checkpoint& ck = *r;
  const ModelConfig& c = ck.config();
  const ModelWeights& w = ck.weights();
  ASSERT_EQ(w.layers.size(), 4u);
  EXPECT_TRUE(w.layers[0].is_moe);
  EXPECT_FALSE(w.layers[1].is_moe);  // mlp_only_layers = [1]
  EXPECT_EQ(w.layers[0].moe.experts.size(), 8u);
  EXPECT_EQ(w.layers[0].attn.q_proj.dim(0), c.q_size());
  EXPECT_EQ(w.layers[0].attn.k_proj.dim(0), c.kv_size());
  EXPECT_EQ(w.layers[2].moe.shared_expert.down_proj.dim(1), 128);
  EXPECT_EQ(w.layers[2].moe.shared_expert_gate.dim(0), 1);
  EXPECT_EQ(w.layers[1].dense.gate_proj.dim(0), 256);
  EXPECT_NE(w.lm_head.data(), w.embed_tokens.data());
  for (const TensorView& v : all_views(w)) {
    EXPECT_EQ(v.dtype(), DType::kBF16);
    EXPECT_TRUE(v.is_contiguous());
    EXPECT_TRUE(points_into(v, ck));
  }
  EXPECT_EQ(ck.converted_weight_bytes(), 0u);
  EXPECT_EQ(ck.mapped_weight_bytes(), model_weight_bytes(c));
}

// Qwen3.5 as the Hub ships it: each routed expert is a view into the fused mlp.experts.gate_up_proj [E, 2I, H]
// (its gate rows, then its up rows) and mlp.experts.down_proj [E, H, I], byte for byte the file's rows and
// zero-copy; A_log and the DeltaNet norm stay F32; the vision tower and MTP head are counted, not bound.
TEST(Checkpoint, qwen35_fused_expert_views_are_the_files_rows) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-qwen35", 1, dir.path()).ok());
  const Checkpoint ck = Checkpoint::open(dir.path()).value();
  const ModelConfig& c = ck.config();
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  model::SafetensorsFile f = model::SafetensorsFile::open(dir / "model.safetensors").value();
  auto raw = [&](const std::string& name) -> const std::byte* {
    for (const model::SafetensorsTensor& t : f.tensors()) {
      if (t.name == name) return reinterpret_cast<const std::byte*>(f.mapping().data() + t.offset);
    }
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = ck.weights().layers[static_cast<size_t>(l)];
    const std::string p = fmt::format("model.language_model.layers.{}.mlp.experts.", l);
    const std::byte* gu = raw(p + "gate_up_proj");
    const std::byte* dn = raw(p + "down_proj");
    ASSERT_TRUE(gu && dn);
    ASSERT_EQ(lw.moe.experts.size(), static_cast<size_t>(E));
    const size_t row = static_cast<size_t>(H) * 2, block = static_cast<size_t>(I) * row;  // bf16 rows of H
    for (int64_t e = 0; e < E; ++e) {
      const MlpWeights& m = lw.moe.experts[static_cast<size_t>(e)];
      ASSERT_EQ(m.gate_proj.dim(0), I);
      ASSERT_EQ(m.up_proj.dim(1), H);
      ASSERT_EQ(m.down_proj.dim(0), H);
      EXPECT_EQ(std::memcmp(m.gate_proj.data(), gu + 2 * e * block, block), 0) << "layer " << l << " expert " << e;
      EXPECT_EQ(std::memcmp(m.up_proj.data(), gu + (2 * e + 1) * block, block), 0) << "layer " << l << " expert " << e;
      EXPECT_EQ(std::memcmp(m.down_proj.data(), dn + e * block, block), 0) << "layer " << l << " expert " << e;
      EXPECT_TRUE(points_into(m.gate_proj, ck) && points_into(m.up_proj, ck) && points_into(m.down_proj, ck));
    }
    if (lw.linear) {
      EXPECT_EQ(lw.gdn.A_log.dtype(), DType::kF32);
      EXPECT_EQ(lw.gdn.norm.dtype(), DType::kF32);
      EXPECT_EQ(lw.gdn.conv1d.rank(), 2);
    }
  }
  EXPECT_EQ(ck.ignored_tensors(), 3);  // model.visual.patch_embed.proj.weight, mtp.layers.0.*, mtp.fc.weight
  EXPECT_EQ(ck.converted_weight_bytes(), 0u);
}

// A fused expert tensor of the wrong shape is refused naming it and the shape the config asks for.
TEST(Checkpoint, qwen35_fused_experts_of_the_wrong_shape_are_refused) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-qwen35", 1, dir.path()).ok());
  const std::string name = "model.language_model.layers.1.mlp.experts.gate_up_proj";
  rewrite(dir.path(), [&](std::vector<RawTensor>& t) {
    RawTensor* gu = find(t, name);
    gu->spec.shape = {gu->spec.shape[0], gu->spec.shape[1] / 2, gu->spec.shape[2] * 2};
  });
  const std::string err = open_error(dir.path());
  EXPECT_NE(err.find("'" + name + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("[num_experts, 2 * moe_intermediate_size, hidden_size]"), std::string::npos) << err;
}

TEST(Checkpoint, sharded_checkpoint_binds_the_same_values) {
  TempDir one, four;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 2, one.path(), 1).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 2, four.path(), 4).ok());
  const Checkpoint a = Checkpoint::open(one.path()).value();
  const Checkpoint b = Checkpoint::open(four.path(), LoadOptions{.populate = false}).value();
  EXPECT_EQ(b.store().files().size(), 4u);
  const std::vector<TensorView> va = all_views(a.weights()), vb = all_views(b.weights());
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_EQ(std::memcmp(va[i].data(), vb[i].data(), static_cast<size_t>(va[i].numel()) * 2), 0) << i;
  }
}

TEST(Checkpoint, tied_embeddings_share_one_view) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 1, dir.path()).ok());
  const Checkpoint ck = Checkpoint::open(dir.path()).value();
  EXPECT_EQ(ck.weights().lm_head.data(), ck.weights().embed_tokens.data());
  EXPECT_FALSE(ck.weights().layers[0].is_moe);  // decoder_sparse_step = 2
  EXPECT_TRUE(ck.weights().layers[1].is_moe);
  EXPECT_EQ(ck.weights().layers[1].moe.shared_expert_gate.data(), nullptr);  // no shared expert
  // A tied checkpoint that still carries lm_head.weight loads; the copy is ignored.
  rewrite(dir.path(), [](std::vector<RawTensor>& t) {
    RawTensor head = *find(t, "model.embed_tokens.weight");
    head.spec.name = "lm_head.weight";
    t.push_back(head);
  });
  const Checkpoint again = Checkpoint::open(dir.path()).value();
  EXPECT_EQ(again.weights().lm_head.data(), again.weights().embed_tokens.data());
}

TEST(Checkpoint, f32_and_f16_checkpoints_convert_to_bf16_once) {
  for (DType dt : {DType::kF32, DType::kF16}) {
    TempDir dir;
    const ModelConfig cfg = synthetic_preset_config("tiny").value();
    ASSERT_TRUE(write_synthetic_checkpoint(cfg, 4, dir.path(), 2, dt).ok());
    const Checkpoint native = Checkpoint::open(dir.path(), LoadOptions{.precision = WeightPrecision::kNative}).value();
    const Checkpoint bf = Checkpoint::open(dir.path()).value();
    EXPECT_EQ(native.config().torch_dtype, dt);
    EXPECT_EQ(native.converted_weight_bytes(), 0u);
    EXPECT_EQ(native.mapped_weight_bytes(), model_weight_bytes(cfg, dt));
    EXPECT_EQ(bf.converted_weight_bytes(), model_weight_bytes(cfg, DType::kBF16));
    EXPECT_EQ(bf.mapped_weight_bytes(), 0u);
    const std::vector<TensorView> vn = all_views(native.weights()), vb = all_views(bf.weights());
    for (size_t i = 0; i < vn.size(); ++i) {
      EXPECT_EQ(vn[i].dtype(), dt);
      EXPECT_TRUE(points_into(vn[i], native));
      ASSERT_EQ(vb[i].dtype(), DType::kBF16);
      EXPECT_FALSE(points_into(vb[i], bf));
      // Each bf16 value is the round-to-nearest-even of the file's value.
      const std::vector<double> exact = testing::to_doubles(vn[i]);
      const bf16_t* got = vb[i].data_as<const bf16_t>();
      for (size_t j = 0; j < exact.size(); ++j) {
        ASSERT_EQ(got[j].bits, float_to_bf16(static_cast<float>(exact[j])).bits) << i << " " << j;
      }
    }
  }
}

TEST(Checkpoint, views_outlive_a_move_of_the_checkpoint) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 1, dir.path()).ok());
  Checkpoint a = Checkpoint::open(dir.path()).value();
  const TensorView q = a.weights().layers[3].attn.q_proj;
  const std::vector<double> before = testing::to_doubles(q);
  Checkpoint b = std::move(a);
  EXPECT_EQ(b.weights().layers[3].attn.q_proj.data(), q.data());
  EXPECT_EQ(testing::to_doubles(b.weights().layers[3].attn.q_proj), before);
}

class CheckpointBroken : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(write_synthetic_checkpoint("tiny", 9, dir_.path()).ok()); }
  std::string file() const { return (dir_ / "model.safetensors").string(); }
  TempDir dir_;
};

TEST_F(CheckpointBroken, missing_config) {
  std::filesystem::remove(dir_ / "config.json");
  EXPECT_EQ(open_error(dir_.path()),
            (dir_ / "config.json").string() + ": cannot open the model config (does the file exist?)");
}

TEST_F(CheckpointBroken, missing_weights_file) {
  std::filesystem::remove(dir_ / "model.safetensors");
  EXPECT_EQ(
      open_error(dir_.path()),
      dir_.path().string() + ": no model.safetensors or model.safetensors.index.json in the checkpoint directory");
}

TEST_F(CheckpointBroken, missing_tensor) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    t.erase(std::find_if(t.begin(), t.end(),
                         [](const RawTensor& x) { return x.spec.name == "model.layers.1.mlp.up_proj.weight"; }));
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() +
                ": tensor 'model.layers.1.mlp.up_proj.weight' is missing (config.json requires it: layer 1 is "
                "dense (mlp_only_layers / decoder_sparse_step))");
}

TEST_F(CheckpointBroken, missing_lm_head_when_untied) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    t.erase(std::find_if(t.begin(), t.end(), [](const RawTensor& x) { return x.spec.name == "lm_head.weight"; }));
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() + ": tensor 'lm_head.weight' is missing (config.json requires it: tie_word_embeddings is false)");
}

TEST_F(CheckpointBroken, config_has_more_experts_than_the_weights) {
  ModelConfig c = synthetic_preset_config("tiny").value();
  c.num_experts = 16;
  testing::write_file_bytes(dir_ / "config.json", to_config_json(c));
  EXPECT_EQ(open_error(dir_.path()),
            file() +
                ": tensor 'model.layers.0.mlp.gate.weight' has shape [8, 128] but config.json requires "
                "[16, 128] = [num_experts, hidden_size]");
}

TEST_F(CheckpointBroken, wrong_shape) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    find(t, "model.layers.2.self_attn.q_proj.weight")->spec.shape = {128, 256};  // transposed
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() +
                ": tensor 'model.layers.2.self_attn.q_proj.weight' has shape [128, 256] but config.json "
                "requires [256, 128] = [num_attention_heads * head_dim, hidden_size]");
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    find(t, "model.layers.2.self_attn.q_proj.weight")->spec.shape = {256, 128};
    RawTensor* e = find(t, "model.layers.3.mlp.experts.5.down_proj.weight");
    e->spec.shape = {128, 32};
    e->bytes.resize(128 * 32 * 2);
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() +
                ": tensor 'model.layers.3.mlp.experts.5.down_proj.weight' has shape [128, 32] but config.json "
                "requires [128, 64] = [hidden_size, moe_intermediate_size]");
}

TEST_F(CheckpointBroken, wrong_dtype) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    RawTensor* n = find(t, "model.norm.weight");
    n->spec.dtype = DType::kI32;
    n->bytes.resize(128 * 4);
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() + ": tensor 'model.norm.weight' has dtype I32; genbridge reads BF16, F16 and F32 tensors");
}

TEST_F(CheckpointBroken, unused_tensor_means_config_and_weights_disagree) {
  rewrite(dir_.path(), [](std::vector<RawTensor>& t) {
    RawTensor extra = *find(t, "model.layers.0.mlp.experts.7.up_proj.weight");
    extra.spec.name = "model.layers.0.mlp.experts.8.up_proj.weight";
    t.push_back(extra);
  });
  EXPECT_EQ(open_error(dir_.path()),
            file() +
                ": tensor 'model.layers.0.mlp.experts.8.up_proj.weight' is not used by the model config.json "
                "describes (1 unused tensor; config and weights disagree)");
}

TEST_F(CheckpointBroken, file_truncated_before_the_run) {
  // The header promises more bytes than the file has: refused at open, naming the last tensor.
  const SafetensorsFile f = SafetensorsFile::open(file()).value();
  const SafetensorsTensor* last = &f.tensors()[0];
  for (const SafetensorsTensor& t : f.tensors()) {
    if (t.offset > last->offset) last = &t;
  }
  const uint64_t data_begin = f.file_size() - [&] {
    uint64_t n = 0;
    for (const SafetensorsTensor& t : f.tensors()) n += t.nbytes;
    return n;
  }();
  const uint64_t begin = last->offset - data_begin, end = begin + last->nbytes;
  std::filesystem::resize_file(file(), f.file_size() - 1);
  EXPECT_EQ(open_error(dir_.path()),
            fmt::format("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} bytes; "
                        "truncated file?)",
                        file(), last->name, begin, end, end - 1));
}

TEST_F(CheckpointBroken, malformed_weights_file_is_named) {
  std::filesystem::resize_file(dir_ / "model.safetensors", 100);
  const std::string e = open_error(dir_.path());
  EXPECT_EQ(e.rfind(file() + ": ", 0), 0u) << e;
  EXPECT_NE(e.find("truncated file?"), std::string::npos) << e;
}

}  // namespace
}  // namespace genbridge::model
