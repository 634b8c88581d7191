#pragma once
// Tests only: rewrites one element of one tensor of a single-file checkpoint (model.safetensors) through
// the project's safetensors reader and writer, e.g. a +Inf or a NaN in lm_head.weight.

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "genbridge/core/formats.h"
#include "runtime/checkpoint/safetensors.h"

namespace genbridge::testing {

// Sets element `index` (row-major) of tensor `name` in dir/model.safetensors to `value`, rounded to the
// tensor's dtype (BF16, F16 or F32). Every other byte of every tensor is kept.
inline Status poison_tensor(const std::filesystem::path& dir, const std::string& name, int64_t index, float value) {
  const std::filesystem::path file = dir / "model.safetensors";
  std::vector<std::vector<std::byte>> bytes;
  std::vector<model::SafetensorsTensorData> tensors;
  std::map<std::string, std::string> metadata;
  bool found = false;
  {
    GB_ASSIGN_OR_RETURN(model::SafetensorsFile f, model::SafetensorsFile::open(file));
    metadata = f.metadata();
    bytes.reserve(f.tensors().size());
    for (const model::SafetensorsTensor& t : f.tensors()) {
      DType dt = DType::kU8;
      for (DType c : {DType::kBF16, DType::kF16, DType::kF32}) {
        if (model::safetensors_dtype_name(c) == t.dtype) dt = c;
      }
      if (dt == DType::kU8) return invalid_argument(fmt::format("poison_tensor: {} has dtype {}", t.name, t.dtype));
      const std::byte* src = f.mapping().data() + t.offset;
      bytes.emplace_back(src, src + t.nbytes);
      if (t.name == name) {
        if (index < 0 || index >= t.numel()) {
          return invalid_argument(fmt::format("poison_tensor: {} has {} elements, not {}", name, t.numel(), index + 1));
        }
        std::byte* at = bytes.back().data() + index * static_cast<int64_t>(dtype_size(dt));
        if (dt == DType::kBF16) {
          const bf16_t b = float_to_bf16(value);
          std::memcpy(at, &b, sizeof b);
        } else if (dt == DType::kF16) {
          const fp16_t h = float_to_fp16(value);
          std::memcpy(at, &h, sizeof h);
        } else {
          std::memcpy(at, &value, sizeof value);
        }
        found = true;
      }
      tensors.push_back({{t.name, dt, t.shape}, nullptr});
    }
  }
  if (!found) return invalid_argument(fmt::format("poison_tensor: {} has no tensor {}", file.string(), name));
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = bytes[i].data();
  return model::write_safetensors(file, tensors, metadata);
}

}  // namespace genbridge::testing
