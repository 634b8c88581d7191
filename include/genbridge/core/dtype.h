#pragma once
// Element types understood by the kernel library.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace genbridge {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI32,
  kI64,
  kFp8E4M3FN,
  kFp8E5M2,
  kE8M0,
  kFp4E2M1x2,  // two fp4 e2m1 values per byte, low nibble first; one element = one byte
};

// Bytes per element (kFp4E2M1x2: one byte holds two values).
size_t dtype_size(DType t);
// Lower-case name used in messages and file formats: "bf16", "fp8_e4m3fn", ...
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
inline bool is_float16ish(DType t) { return t == DType::kF16 || t == DType::kBF16; }

}  // namespace genbridge
