// Synthetic checkpoints: determinism (runs, thread counts, a pinned fingerprint), sharding, presets and
// the weight distributions the generator promises.
#include "tools/make_model/synthetic.h"

#include <gtest/gtest.h>

#include <cmath>

#include "genbridge/core/threading.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "support/temp_dir.h"
#include "support/tensor_util.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

uint64_t fnv1a(const std::vector<char>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

TEST(Synthetic, presets_are_valid_and_kernel_friendly) {
  EXPECT_EQ(
      synthetic_preset_names(),
      (std::vector<std::string>{"tiny", "tiny-gemma", "small", "tiny-dsa", "tiny-dsv3", "tiny-dsv3-noq", "small-dsa",
                                "tiny-qwen35", "tiny-qwen35-split", "small-qwen35", "tiny-dsv4", "small-dsv4"}));
  for (const std::string& name : synthetic_preset_names()) {
    const ModelConfig c = synthetic_preset_config(name).value();
    EXPECT_TRUE(validate_model_config(c, name).ok()) << name;
    if (!c.is_deepseek() && !c.is_deepseek_v4()) {
      EXPECT_TRUE(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256) << name;
    }
    EXPECT_GT(c.num_moe_layers(), 0) << name;
  }
  const ModelConfig tiny = synthetic_preset_config("tiny").value();
  EXPECT_LT(tiny.num_moe_layers(), tiny.num_hidden_layers);  // at least one dense layer
  EXPECT_TRUE(tiny.has_shared_expert());
  const ModelConfig gemma = synthetic_preset_config("tiny-gemma").value();
  EXPECT_EQ(gemma.norm_type, NormType::kGemma);
  EXPECT_TRUE(gemma.tie_word_embeddings);
  EXPECT_EQ(synthetic_preset_config("huge").status().message(),
            "unknown synthetic model preset 'huge' (known presets: tiny, tiny-gemma, small, tiny-dsa, tiny-dsv3, "
            "tiny-dsv3-noq, small-dsa, tiny-qwen35, tiny-qwen35-split, small-qwen35, tiny-dsv4, small-dsv4)");
}

TEST(Synthetic, weight_bytes_of_presets) {
  // tiny: embed + lm_head 2 * 512 * 128; per layer attention q/k/v/o, q/k norms and two layer norms;
  // 3 MoE layers (router, 8 experts of 3 * 64 * 128, shared expert 3 * 128 * 128 and its gate); 1 dense
  // layer 3 * 256 * 128; the final norm.
  const ModelConfig tiny = synthetic_preset_config("tiny").value();
  const int64_t h = 128;
  const int64_t attn = (256 + 128 + 128) * h + h * 256 + 64 + 64 + 2 * h;
  const int64_t moe = 8 * h + 8 * 3 * 64 * h + 3 * 128 * h + h;
  const int64_t dense = 3 * 256 * h;
  const int64_t total = 2 * 512 * h + 4 * attn + 3 * moe + dense + h;
  EXPECT_EQ(model_weight_bytes(tiny), static_cast<uint64_t>(2 * total));
  EXPECT_EQ(model_weight_bytes(tiny, DType::kF32), static_cast<uint64_t>(4 * total));
  const uint64_t small = model_weight_bytes(synthetic_preset_config("small").value());
  EXPECT_GT(small, 800u << 20);
  EXPECT_LT(small, 900u << 20);
}

TEST(Synthetic, same_preset_and_seed_give_identical_files) {
  TempDir a, b, c;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 7, a.path()).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 7, b.path()).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 8, c.path()).ok());
  for (const char* f : {"config.json", "model.safetensors"}) {
    EXPECT_EQ(testing::read_file_bytes(a / f), testing::read_file_bytes(b / f)) << f;
  }
  EXPECT_NE(testing::read_file_bytes(a / "model.safetensors"), testing::read_file_bytes(c / "model.safetensors"));
}

TEST(Synthetic, files_do_not_depend_on_thread_count) {
  TempDir a, b;
  set_num_threads(1);
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 3, a.path()).ok());
  set_num_threads(2);
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 3, b.path()).ok());
  set_num_threads(0);
  EXPECT_EQ(testing::read_file_bytes(a / "model.safetensors"), testing::read_file_bytes(b / "model.safetensors"));
}

// Pinned fingerprints: a change here changes every synthetic model (and invalidates cached checkpoints and
// recorded benchmark outputs), so it must be deliberate.
TEST(Synthetic, fingerprint_is_pinned) {
  TempDir a, b;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 0, a.path()).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 0, b.path()).ok());
  EXPECT_EQ(fnv1a(testing::read_file_bytes(a / "model.safetensors")), 0xe1c1271b5168f510ull);
  EXPECT_EQ(fnv1a(testing::read_file_bytes(b / "model.safetensors")), 0x468b18e22d1642a8ull);
}

TEST(Synthetic, sharded_checkpoint_holds_the_same_tensors) {
  TempDir one, three;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 5, one.path(), 1).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 5, three.path(), 3).ok());
  EXPECT_FALSE(std::filesystem::exists(one / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(three / "model.safetensors.index.json"));
  for (int s = 1; s <= 3; ++s) EXPECT_TRUE(std::filesystem::exists(three / shard_file_name(s, 3))) << s;
  EXPECT_FALSE(std::filesystem::exists(three / "model.safetensors"));
  EXPECT_EQ(testing::read_file_bytes(one / "config.json"), testing::read_file_bytes(three / "config.json"));

  TensorStore a = TensorStore::open_dir(one.path()).value();
  TensorStore b = TensorStore::open_dir(three.path()).value();
  ASSERT_EQ(a.names(), b.names());
  EXPECT_EQ(b.files().size(), 3u);
  for (const std::string& n : a.names()) {
    const TensorStore::Entry* ea = a.find(n);
    const TensorStore::Entry* eb = b.find(n);
    ASSERT_EQ(ea->tensor->nbytes, eb->tensor->nbytes) << n;
    EXPECT_EQ(std::memcmp(ea->file->mapping().data() + ea->tensor->offset,
                          eb->file->mapping().data() + eb->tensor->offset, ea->tensor->nbytes),
              0)
        << n;
  }
}

TEST(Synthetic, rewriting_a_directory_replaces_the_old_checkpoint) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 1, dir.path(), 4).ok());
  testing::write_file_bytes(dir / "notes.txt", "keep me");
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 1, dir.path(), 1).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / shard_file_name(1, 4)));
  EXPECT_TRUE(std::filesystem::exists(dir / "notes.txt"));
  Result<Checkpoint> ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->config().norm_type, NormType::kGemma);
}

TEST(Synthetic, bad_arguments) {
  TempDir dir;
  EXPECT_EQ(write_synthetic_checkpoint("nope", 0, dir.path()).message(),
            "unknown synthetic model preset 'nope' (known presets: tiny, tiny-gemma, small, tiny-dsa, tiny-dsv3, "
            "tiny-dsv3-noq, small-dsa, tiny-qwen35, tiny-qwen35-split, small-qwen35, tiny-dsv4, small-dsv4)");
  EXPECT_EQ(write_synthetic_checkpoint("tiny", 0, dir.path(), 0).message(),
            "write_synthetic_checkpoint: shards = 0 must be between 1 and the number of tensors (125)");
  ModelConfig c = synthetic_preset_config("tiny").value();
  EXPECT_EQ(write_synthetic_checkpoint(c, 0, dir.path(), 1, DType::kI8).message(),
            "write_synthetic_checkpoint: dtype int8 is not bf16, f16 or f32");
  c.num_key_value_heads = 3;
  EXPECT_EQ(write_synthetic_checkpoint(c, 0, dir.path()).message(),
            "write_synthetic_checkpoint config: num_key_value_heads = 3: num_attention_heads (4) must be a multiple "
            "of num_key_value_heads");
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

struct Moments {
  double mean = 0, std = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const TensorView& v) {
  Moments m;
  const std::vector<double> x = testing::to_doubles(v);
  for (double e : x) {
    m.mean += e;
    m.min = std::min(m.min, e);
    m.max = std::max(m.max, e);
  }
  m.mean /= static_cast<double>(x.size());
  for (double e : x) m.std += (e - m.mean) * (e - m.mean);
  m.std = std::sqrt(m.std / static_cast<double>(x.size()));
  return m;
}

TEST(Synthetic, weights_follow_the_documented_scales) {
  TempDir dir, gdir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 11, dir.path()).ok());
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-gemma", 11, gdir.path()).ok());
  const Checkpoint ck = Checkpoint::open(dir.path()).value();
  const ModelWeights& w = ck.weights();
  const auto expect_std = [](const TensorView& v, double std, const char* what) {
    const Moments m = moments(v);
    EXPECT_NEAR(m.mean, 0.0, 0.1 * std) << what;
    EXPECT_NEAR(m.std, std, 0.05 * std) << what;
    EXPECT_LE(m.max, std * std::sqrt(3.0) * 1.01) << what;
  };
  expect_std(w.embed_tokens, 1.0, "embed_tokens");
  expect_std(w.lm_head, 1.0 / std::sqrt(128.0), "lm_head");
  expect_std(w.layers[0].attn.q_proj, 1.0 / std::sqrt(128.0), "q_proj");
  expect_std(w.layers[0].attn.o_proj, 1.0 / std::sqrt(256.0), "o_proj");
  expect_std(w.layers[0].moe.router, 2.0 / std::sqrt(128.0), "router");
  expect_std(w.layers[0].moe.experts[3].down_proj, 1.0 / std::sqrt(64.0), "expert down_proj");
  expect_std(w.layers[1].dense.down_proj, 1.0 / std::sqrt(256.0), "dense down_proj");
  for (const TensorView& n : {w.layers[2].input_layernorm, w.layers[2].attn.q_norm, w.final_norm}) {
    const Moments m = moments(n);
    EXPECT_GE(m.min, 0.9 - 1.0 / 128);  // U(0.9, 1.1) rounded to bf16 (spacing 2^-7 near 1)
    EXPECT_LE(m.max, 1.1 + 1.0 / 128);
    EXPECT_NEAR(m.mean, 1.0, 0.03);
  }
  const Checkpoint gk = Checkpoint::open(gdir.path()).value();
  for (const TensorView& n : {gk.weights().layers[0].input_layernorm, gk.weights().final_norm}) {
    const Moments m = moments(n);
    EXPECT_GE(m.min, -0.1 - 1.0 / 1024);
    EXPECT_LE(m.max, 0.1 + 1.0 / 1024);
  }
  expect_std(gk.weights().embed_tokens, 1.0 / std::sqrt(128.0), "tied embed_tokens");
  // Different tensors are not copies of each other.
  EXPECT_NE(testing::to_doubles(w.layers[0].moe.experts[0].gate_proj),
            testing::to_doubles(w.layers[0].moe.experts[1].gate_proj));
}

// DeepSeek-V4 presets: DeepSeek's tensor names (no "model." prefix) in the dtypes DeepSeek ships the bf16 parts
// (F32 hyper-connection weights, sinks, position biases and gate biases; I64 tid2eid; BF16 the rest), an MTP
// layer beside the model, and files that do not depend on the thread count.
TEST(Synthetic, deepseek_v4_presets_write_deepseeks_names_and_dtypes) {
  TempDir one, two;
  set_num_threads(1);
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-dsv4", 5, one.path()).ok());
  set_num_threads(2);
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-dsv4", 5, two.path()).ok());
  set_num_threads(0);
  EXPECT_EQ(testing::read_file_bytes(one / "model.safetensors"), testing::read_file_bytes(two / "model.safetensors"));
  const auto kept_f32 = [](const std::string& n) {
    for (const char* s : {"_fn", "_base", "_scale", "attn_sink", ".ape", "gate.bias"}) {
      if (n.ends_with(s)) return true;
    }
    return false;
  };
  SafetensorsFile f = SafetensorsFile::open(one / "model.safetensors").value();
  int64_t mtp = 0, f32 = 0, i64 = 0;
  uint64_t mtp_bytes = 0, all_bytes = 0;
  for (const SafetensorsTensor& t : f.tensors()) {
    const std::string want = t.name.ends_with("tid2eid") ? "I64" : kept_f32(t.name) ? "F32" : "BF16";
    EXPECT_EQ(t.dtype, want) << t.name;
    EXPECT_FALSE(t.name.starts_with("model.")) << t.name;
    f32 += t.dtype == "F32";
    i64 += t.dtype == "I64";
    all_bytes += t.nbytes;
    if (t.name.starts_with("mtp.0.")) {
      ++mtp;
      mtp_bytes += t.nbytes;
    }
  }
  // Per layer 6 hyper-connection tensors and a sink; a position bias per compressor (layers 1 and 3: the
  // attention's and the indexer's, layer 2: the attention's); the gate biases of layers 1-3; the head's 3;
  // the MTP layer's 6 + 1 + 1 gate bias + its head's 3.
  EXPECT_EQ(f32, 4 * 7 + 5 + 3 + 3 + 11);
  EXPECT_EQ(i64, 1);  // layer 0's tid2eid (num_hash_layers 1)
  EXPECT_EQ(mtp, 53);
  EXPECT_EQ(all_bytes, model_weight_bytes(synthetic_preset_config("tiny-dsv4").value()));
  // What the loader binds is everything but the MTP layer.
  const Checkpoint ck = Checkpoint::open(one.path()).value();
  EXPECT_EQ(ck.mapped_weight_bytes(), all_bytes - mtp_bytes);
  EXPECT_EQ(ck.ignored_tensors(), 53);
  EXPECT_EQ(ck.config(), synthetic_preset_config("tiny-dsv4").value());
}

TEST(Synthetic, deepseek_v4_presets_are_sized_as_documented) {
  const ModelConfig tiny = synthetic_preset_config("tiny-dsv4").value();
  const ModelConfig small = synthetic_preset_config("small-dsv4").value();
  EXPECT_EQ(tiny.dsv4.compress_ratios, (std::vector<int64_t>{0, 4, 128, 4, 0}));
  EXPECT_EQ(small.dsv4.compress_ratios, (std::vector<int64_t>{0, 0, 4, 128, 4, 128, 4, 128, 0}));
  // small-dsv4 is sized like small (hidden 1024, 8 layers, 32 experts top-4 of width 512, vocab 8192) and
  // weighs ~1.09 GB in bf16 with its MTP layer (synthetic.cpp says so).
  const ModelConfig like = synthetic_preset_config("small").value();
  EXPECT_EQ(small.hidden_size, like.hidden_size);
  EXPECT_EQ(small.num_hidden_layers, like.num_hidden_layers);
  EXPECT_EQ(small.num_experts, like.num_experts);
  EXPECT_EQ(small.num_experts_per_tok, like.num_experts_per_tok);
  EXPECT_EQ(small.moe_intermediate_size, like.moe_intermediate_size);
  EXPECT_EQ(small.vocab_size, like.vocab_size);
  EXPECT_NEAR(static_cast<double>(model_weight_bytes(small)) / 1e9, 1.09, 0.01);
  EXPECT_EQ(small.dsv4.index_topk, 64);
  EXPECT_EQ(small.num_attention_heads * small.head_dim / small.dsv4.o_groups, 1024);
}

TEST(Synthetic, deepseek_v4_weights_follow_the_documented_scales) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-dsv4", 11, dir.path()).ok());
  const Checkpoint ck = Checkpoint::open(dir.path()).value();
  const ModelWeights& w = ck.weights();
  const auto expect_std = [](const TensorView& v, double center, double std, const char* what) {
    const Moments m = moments(v);
    EXPECT_NEAR(m.mean, center, 0.1 * std) << what;
    EXPECT_NEAR(m.std, std, 0.05 * std) << what;
    EXPECT_LE(m.max, center + std * std::sqrt(3.0) * 1.01) << what;
    EXPECT_GE(m.min, center - std * std::sqrt(3.0) * 1.01) << what;
  };
  const LayerWeights& l1 = w.layers[1];
  expect_std(w.embed_tokens, 0, 1.0, "embed.weight");
  expect_std(w.lm_head, 0, 1.0 / std::sqrt(128.0), "head.weight");
  expect_std(l1.hc_attn.fn, 0, 1.0 / std::sqrt(4.0 * 128), "hc_attn_fn");
  expect_std(w.hc_head.fn, 0, 1.0 / std::sqrt(4.0 * 128), "hc_head_fn");
  expect_std(l1.v4.wq_b, 0, 1.0 / 8, "attn.wq_b");
  expect_std(l1.v4.wo_a, 0, 1.0 / 32, "attn.wo_a");
  expect_std(l1.v4.compressor.ape, 0, 0.5, "attn.compressor.ape");
  expect_std(l1.v4.compressor.wgate, 0, 1.0 / std::sqrt(128.0), "attn.compressor.wgate");
  expect_std(l1.moe.router, 0, 2.0 / std::sqrt(128.0), "ffn.gate.weight");
  expect_std(l1.moe.experts[5].down_proj, 0, 1.0 / 8, "ffn.experts.5.w2");
  for (const TensorView& scale : {l1.hc_attn.scale, l1.hc_ffn.scale, w.hc_head.scale}) {
    for (double s : testing::to_doubles(scale)) {
      EXPECT_GE(s, 0.9);
      EXPECT_LE(s, 1.1);
    }
  }
  for (const TensorView& n : {l1.input_layernorm, l1.v4.q_norm, l1.v4.index_compressor.norm, w.final_norm}) {
    const Moments m = moments(n);
    EXPECT_GE(m.min, 0.9 - 1.0 / 128);  // U(0.9, 1.1) rounded to bf16
    EXPECT_LE(m.max, 1.1 + 1.0 / 128);
  }
  for (const TensorView& n : {l1.v4.kv_norm, l1.v4.compressor.norm}) {  // they set the attention logits' scale
    const Moments m = moments(n);
    EXPECT_GE(m.min, 1.8 - 1.0 / 64);  // U(1.8, 2.2) rounded to bf16
    EXPECT_LE(m.max, 2.2 + 1.0 / 64);
    EXPECT_NEAR(m.mean, 2.0, 0.05);
  }
}

}  // namespace
}  // namespace genbridge::model
