#pragma once
// Test helpers over checkpoints: rewrite the tensors of a single-file safetensors checkpoint in place (to
// plant a broken shape, a non-finite value, a renamed tensor, ...) and list every weight view of a model.

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"

namespace genbridge::testing {

struct RawTensor {
  model::SafetensorsTensorSpec spec;
  std::vector<char> bytes;
};

inline DType safetensors_dtype(const std::string& st) {
  if (st == "BF16") return DType::kBF16;
  if (st == "F16") return DType::kF16;
  if (st == "I64") return DType::kI64;
  if (st == "I32") return DType::kI32;
  if (st == "I8") return DType::kI8;
  if (st == "U8") return DType::kU8;
  if (st == "F8_E4M3") return DType::kFp8E4M3FN;
  if (st == "F8_E8M0") return DType::kE8M0;
  return DType::kF32;
}

// Reads every tensor of `dir`/model.safetensors, lets `edit` change the list, writes it back.
inline void rewrite(const std::filesystem::path& dir, const std::function<void(std::vector<RawTensor>&)>& edit) {
  std::vector<RawTensor> tensors;
  {
    model::SafetensorsFile f = model::SafetensorsFile::open(dir / "model.safetensors").value();
    for (const model::SafetensorsTensor& t : f.tensors()) {
      const char* p = reinterpret_cast<const char*>(f.mapping().data() + t.offset);
      tensors.push_back({{t.name, safetensors_dtype(t.dtype), t.shape}, std::vector<char>(p, p + t.nbytes)});
    }
  }
  edit(tensors);
  std::vector<model::SafetensorsTensorData> data;
  for (const RawTensor& t : tensors) data.push_back({t.spec, t.bytes.data()});
  ASSERT_TRUE(model::write_safetensors(dir / "model.safetensors", data).ok());
}

// Every view of the model, in a fixed order, for checks over all of them.
inline std::vector<TensorView> all_views(const model::ModelWeights& w) {
  std::vector<TensorView> out = {w.embed_tokens, w.final_norm, w.lm_head};
  const auto mlp = [&](const model::MlpWeights& m) { out.insert(out.end(), {m.gate_proj, m.up_proj, m.down_proj}); };
  for (const model::LayerWeights& l : w.layers) {
    out.insert(out.end(), {l.input_layernorm, l.post_attention_layernorm, l.attn.q_proj, l.attn.k_proj, l.attn.v_proj,
                           l.attn.o_proj, l.attn.q_norm, l.attn.k_norm});
    if (l.is_moe) {
      out.push_back(l.moe.router);
      for (const model::MlpWeights& e : l.moe.experts) mlp(e);
      if (l.moe.shared_expert_gate.data()) {
        mlp(l.moe.shared_expert);
        out.push_back(l.moe.shared_expert_gate);
      }
    } else {
      mlp(l.dense);
    }
  }
  return out;
}

}  // namespace genbridge::testing
