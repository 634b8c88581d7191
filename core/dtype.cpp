#include "genbridge/core/dtype.h"

#include <array>
#include <utility>

namespace genbridge {
namespace {
constexpr std::array<std::pair<DType, std::string_view>, 12> kNames{{
    {DType::kF32, "fp32"},
    {DType::kF16, "fp16"},
    {DType::kBF16, "bf16"},
    {DType::kF64, "fp64"},
    {DType::kI8, "int8"},
    {DType::kU8, "uint8"},
    {DType::kI32, "int32"},
    {DType::kI64, "int64"},
    {DType::kFp8E4M3FN, "fp8_e4m3fn"},
    {DType::kFp8E5M2, "fp8_e5m2"},
    {DType::kE8M0, "e8m0"},
    {DType::kFp4E2M1x2, "fp4_e2m1x2"},
}};
}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    default: return 1;
  }
}

std::string_view dtype_name(DType t) {
  for (const auto& [d, n] : kNames) {
    if (d == t) return n;
  }
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& [d, n] : kNames) {
    if (n == name) return d;
  }
  return std::nullopt;
}

}  // namespace genbridge
