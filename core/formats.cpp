#include "genbridge/core/formats.h"

#include "core/vec.h"
#include "core/vec_formats.h"

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


void float_to_fp8_e4m3fn_n(const float* src, float mul, fp8_e4m3fn_t* dst, size_t n) {
  const vec::f32x16 m = vec::splat(mul);
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) {
    vec::store_bytes(&dst[i].bits, vec::encode_fp8_e4m3fn(vec::load(src + i) * m));
  }
  for (; i < n; ++i) dst[i] = float_to_fp8_e4m3fn(src[i] * mul);
}

void float_to_fp8_e5m2_n(const float* src, float mul, fp8_e5m2_t* dst, size_t n) {
  const vec::f32x16 m = vec::splat(mul);
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) {
    vec::store_bytes(&dst[i].bits, vec::encode_fp8_e5m2(vec::load(src + i) * m));
  }
  for (; i < n; ++i) dst[i] = float_to_fp8_e5m2(src[i] * mul);
}

void float_to_fp4_e2m1x2_n(const float* src, float mul, uint8_t* dst, size_t n) {
  const vec::f32x16 m = vec::splat(mul);
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) {
    vec::store_nibble_pairs(dst + i / 2, vec::encode_fp4_e2m1(vec::load(src + i) * m));
  }
  for (; i + 1 < n; i += 2) {
    dst[i / 2] = pack_fp4_e2m1x2(float_to_fp4_e2m1(src[i] * mul), float_to_fp4_e2m1(src[i + 1] * mul));
  }
}

void float_to_int8_n(const float* src, float div, int8_t* dst, size_t n) {
  const vec::f32x16 d = vec::splat(div);
  size_t i = 0;
  for (; i + vec::kLanes <= n; i += vec::kLanes) vec::store_bytes(dst + i, vec::encode_int8(vec::load(src + i) / d));
  for (; i < n; ++i) dst[i] = float_to_int8(src[i] / div);
}

void fp8_e4m3fn_to_float_n(const fp8_e4m3fn_t* src, float mul, float* dst, size_t n) {
  const float* t = detail::fp8_e4m3fn_decode_table();
  for (size_t i = 0; i < n; ++i) dst[i] = t[src[i].bits] * mul;
}

void fp8_e5m2_to_float_n(const fp8_e5m2_t* src, float mul, float* dst, size_t n) {
  const float* t = detail::fp8_e5m2_decode_table();
  for (size_t i = 0; i < n; ++i) dst[i] = t[src[i].bits] * mul;
}

void fp4_e2m1x2_to_float_n(const uint8_t* src, float mul, float* dst, size_t n) {
  for (size_t i = 0; i + 1 < n; i += 2) {
    dst[i] = detail::kFp4E2M1Values[src[i / 2] & 0xf] * mul;
    dst[i + 1] = detail::kFp4E2M1Values[src[i / 2] >> 4] * mul;
  }
}

}  // namespace genbridge
