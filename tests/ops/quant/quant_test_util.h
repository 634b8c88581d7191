#pragma once
// Helpers shared by the quant/* contract tests (each test file still runs unchanged in every target build).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/tensor.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

// MX operators are a capability of the Ascend950 generation; the Ascend910 tree carries the explicit
// unsupported provider (docs/design.md#provider-staging). This is the one place the tests branch on the build target.
inline bool mx_supported() { return ops::build_target() != "Ascend910"; }

#define GB_REQUIRE_MX()                                                                             \
  do {                                                                                              \
    if (!::genbridge::testing::mx_supported()) {                                                    \
      GTEST_SKIP() << "MX operators are unsupported on " << ::genbridge::ops::build_target()        \
                   << " (checked by the unsupported_provider test)";                                \
    }                                                                                               \
  } while (0)

// Bytes of a 1-byte-element tensor in logical (row-major) order, whatever its strides.
inline std::vector<uint8_t> logical_bytes(const TensorView& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = t.data_as<const uint8_t>()[logical_offset(t, i)];
  return out;
}

inline void fill_bytes(const TensorView& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<uint8_t>()[logical_offset(t, i)] = static_cast<uint8_t>(rng());
}

// Sets the logical elements of a float tensor from values already representable in its dtype.
inline void set_values(const TensorView& t, const std::vector<float>& v) {
  for (int64_t i = 0; i < t.numel(); ++i) set_element(t, logical_offset(t, i), v[static_cast<size_t>(i)]);
}

// Values spanning many binades: each run of `block` elements gets its own magnitude 2^[-24, 24], so
// MX blocks see a wide range of scale exponents; rounded to dtype d.
inline std::vector<float> wide_range_values(int64_t n, int64_t block, uint64_t seed, DType d) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> e(-24, 24);
  std::vector<float> v(static_cast<size_t>(n));
  int exp = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % block == 0) exp = e(rng);
    float x = std::ldexp(u(rng), exp);
    if (d == DType::kF16) x = fp16_to_float(float_to_fp16(x));
    if (d == DType::kBF16) x = bf16_to_float(float_to_bf16(x));
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}

inline float round_like(float v, DType d) {
  if (d == DType::kF16) return fp16_to_float(float_to_fp16(v));
  if (d == DType::kBF16) return bf16_to_float(float_to_bf16(v));
  return v;
}

inline std::string shape_name(const std::vector<int64_t>& s) {
  std::string n;
  for (int64_t d : s) n += (n.empty() ? "" : "x") + std::to_string(d);
  return n;
}

inline int64_t leading_rows(const std::vector<int64_t>& s) {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}

// A view of `shape` over `t` whose last dimension has stride 2 and whose rows are padded (storage must
// hold 2 * numel + rows * 8 elements).
inline TensorView column_strided(OwnedTensor& t, DType d, const std::vector<int64_t>& shape) {
  const int64_t k = shape.back();
  std::vector<int64_t> strides(shape.size());
  strides.back() = 2;
  int64_t s = 2 * k + 8;
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = s;
    s *= shape[static_cast<size_t>(i)];
  }
  if (shape.size() == 2) return TensorView::strided(t.data(), d, {shape[0], shape[1]}, {strides[0], strides[1]});
  return TensorView::strided(t.data(), d, {shape[0], shape[1], shape[2]}, {strides[0], strides[1], strides[2]});
}

}  // namespace genbridge::testing
