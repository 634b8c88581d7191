#pragma once
// Test helpers: owned tensors, seeded random fills and exact fp64 views of float tensors.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "genbridge/core/formats.h"
#include "genbridge/core/tensor.h"

namespace genbridge::testing {

// A contiguous tensor that owns its bytes (with optional padding for strided views).
class OwnedTensor {
 public:
  OwnedTensor(DType dtype, std::vector<int64_t> shape, int64_t extra_elements = 0)
      : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    bytes_.assign(static_cast<size_t>((n + extra_elements) * static_cast<int64_t>(dtype_size(dtype))) + 64, std::byte{0});
  }
  TensorView view() { return TensorView(bytes_.data(), dtype_, shape_.data(), static_cast<int>(shape_.size())); }
  void* data() { return bytes_.data(); }
  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  std::vector<std::byte> bytes_;
};

inline double element_as_double(const TensorView& t, int64_t offset) {
  switch (t.dtype()) {
    case DType::kF32: return t.data_as<const float>()[offset];
    case DType::kF16: return fp16_to_float(t.data_as<const fp16_t>()[offset]);
    case DType::kBF16: return bf16_to_float(t.data_as<const bf16_t>()[offset]);
    case DType::kF64: return t.data_as<const double>()[offset];
    default: return 0.0;
  }
}

inline void set_element(const TensorView& t, int64_t offset, float v) {
  switch (t.dtype()) {
    case DType::kF32: t.data_as<float>()[offset] = v; break;
    case DType::kF16: t.data_as<fp16_t>()[offset] = float_to_fp16(v); break;
    case DType::kBF16: t.data_as<bf16_t>()[offset] = float_to_bf16(v); break;
    default: break;
  }
}

// Element offset of the i-th element in row-major logical order.
inline int64_t logical_offset(const TensorView& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.rank() - 1; d >= 0; --d) {
    off += (i % t.dim(d)) * t.stride(d);
    i /= t.dim(d);
  }
  return off;
}

// All elements in logical order, exactly, as fp64.
inline std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = element_as_double(t, logical_offset(t, i));
  return out;
}

// Fills the logical elements with uniform values in [lo, hi), rounded to the tensor's dtype.
inline void fill_uniform(const TensorView& t, uint64_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) set_element(t, logical_offset(t, i), dist(rng));
}

}  // namespace genbridge::testing
