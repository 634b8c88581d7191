#include "genbridge/core/formats.h"

#include "core/vec.h"

namespace genbridge {

void bf16_to_float_n(const bf16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(dst + i, vec::load(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void float_to_bf16_n(const float* src, bf16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(dst + i, vec::load(src + i));
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void fp16_to_float_n(const fp16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(dst + i, vec::load(src + i));
  for (; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void float_to_fp16_n(const float* src, fp16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store(dst + i, vec::load(src + i));
  for (; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

}  // namespace genbridge
