#pragma once
// Test helper: rewrites the tensors of a single-file safetensors checkpoint in place (to plant a broken
// shape, a non-finite value, a renamed tensor, ...).

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/model/safetensors.h"

namespace genbridge::testing {

struct RawTensor {
  model::SafetensorsTensorSpec spec;
  std::vector<char> bytes;
};

inline DType safetensors_dtype(const std::string& st) {
  if (st == "BF16") return DType::kBF16;
  if (st == "F16") return DType::kF16;
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

}  // namespace genbridge::testing
