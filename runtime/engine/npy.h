#pragma once
// Minimal NumPy .npy (format version 1.0) writer for fp32 matrices, used by --dump-logits.

#include <cstdint>
#include <span>
#include <string>

#include "genbridge/core/status.h"

namespace genbridge::engine {

// Writes a little-endian float32 array of shape (rows, cols) to `path` (C order). `data` holds rows*cols values.
Status write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols);

}  // namespace genbridge::engine
