#include "genbridge/core/formats.h"

#include "core/simd/dispatch.h"

// ---- per CPU target: the bulk conversions (the same bits as the scalar codecs on every target) ----
#define HWY_TARGET_INCLUDE "core/formats.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/formats8-inl.h"
#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd::HWY_NAMESPACE {

template <typename From, typename To, typename Scalar>
HWY_INLINE void Convert(const From* src, To* dst, size_t n, Scalar scalar) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store16(dst + i, Load16(src + i));
  for (; i < n; ++i) dst[i] = scalar(src[i]);
}
void Bf16ToFloatN(const bf16_t* s, float* d, size_t n) { Convert(s, d, n, bf16_to_float); }
void FloatToBf16N(const float* s, bf16_t* d, size_t n) { Convert(s, d, n, float_to_bf16); }
void Fp16ToFloatN(const fp16_t* s, float* d, size_t n) { Convert(s, d, n, fp16_to_float); }
void FloatToFp16N(const float* s, fp16_t* d, size_t n) { Convert(s, d, n, float_to_fp16); }

void FloatToFp8E4M3FNN(const float* src, float mul, fp8_e4m3fn_t* dst, size_t n) {
  const V16 m = Set16(mul);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBytes16(&dst[i].bits, EncodeFp8E4M3FN16(Load16(src + i) * m));
  if (i < n) StoreBytesTail16(&dst[i].bits, EncodeFp8E4M3FN16(LoadTail16(src + i, n - i) * m), n - i);
}

void FloatToFp8E5M2N(const float* src, float mul, fp8_e5m2_t* dst, size_t n) {
  const V16 m = Set16(mul);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBytes16(&dst[i].bits, EncodeFp8E5M2_16(Load16(src + i) * m));
  if (i < n) StoreBytesTail16(&dst[i].bits, EncodeFp8E5M2_16(LoadTail16(src + i, n - i) * m), n - i);
}

void FloatToFp4E2M1x2N(const float* src, float mul, uint8_t* dst, size_t n) {
  const V16 m = Set16(mul);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreNibblePairs16(dst + i / 2, EncodeFp4E2M1_16(Load16(src + i) * m));
  const size_t rest = (n - i) & ~size_t{1};  // an odd last value has no byte
  if (rest) StoreNibblePairsTail16(dst + i / 2, EncodeFp4E2M1_16(LoadTail16(src + i, rest) * m), rest);
}

void FloatToInt8N(const float* src, float div, int8_t* dst, size_t n) {
  const V16 d = Set16(div);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) StoreBytes16(dst + i, EncodeInt8_16(Load16(src + i) / d));
  if (i < n) StoreBytesTail16(dst + i, EncodeInt8_16(LoadTail16(src + i, n - i) / d), n - i);
}

// dst[i] = table[src[i]] * mul: a gather from the 256-entry decode table, so every code decodes to exactly
// the table's value on every target.
void Fp8ToFloatN(const uint8_t* src, const float* table, float mul, float* dst, size_t n) {
  const hn::Rebind<uint8_t, DI> d8;
  const VF m = hn::Set(DF(), mul);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    GB_UNROLL for (int j = 0; j < kParts; ++j) {
      const VI idx = hn::PromoteTo(DI(), hn::LoadU(d8, src + i + j * kPart));
      hn::StoreU(hn::Mul(hn::GatherIndex(DF(), table, idx), m), DF(), dst + i + j * kPart);
    }
  }
  for (; i < n; ++i) dst[i] = table[src[i]] * mul;
}

}  // namespace genbridge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge {
namespace simd {
HWY_EXPORT(Bf16ToFloatN);
HWY_EXPORT(FloatToBf16N);
HWY_EXPORT(Fp16ToFloatN);
HWY_EXPORT(FloatToFp16N);
HWY_EXPORT(FloatToFp8E4M3FNN);
HWY_EXPORT(FloatToFp8E5M2N);
HWY_EXPORT(FloatToFp4E2M1x2N);
HWY_EXPORT(FloatToInt8N);
HWY_EXPORT(Fp8ToFloatN);
}  // namespace simd

void bf16_to_float_n(const bf16_t* src, float* dst, size_t n) { GB_DISPATCH(simd::Bf16ToFloatN)(src, dst, n); }
void float_to_bf16_n(const float* src, bf16_t* dst, size_t n) { GB_DISPATCH(simd::FloatToBf16N)(src, dst, n); }
void fp16_to_float_n(const fp16_t* src, float* dst, size_t n) { GB_DISPATCH(simd::Fp16ToFloatN)(src, dst, n); }
void float_to_fp16_n(const float* src, fp16_t* dst, size_t n) { GB_DISPATCH(simd::FloatToFp16N)(src, dst, n); }
void float_to_fp8_e4m3fn_n(const float* src, float mul, fp8_e4m3fn_t* dst, size_t n) {
  GB_DISPATCH(simd::FloatToFp8E4M3FNN)(src, mul, dst, n);
}
void float_to_fp8_e5m2_n(const float* src, float mul, fp8_e5m2_t* dst, size_t n) {
  GB_DISPATCH(simd::FloatToFp8E5M2N)(src, mul, dst, n);
}
void float_to_fp4_e2m1x2_n(const float* src, float mul, uint8_t* dst, size_t n) {
  GB_DISPATCH(simd::FloatToFp4E2M1x2N)(src, mul, dst, n);
}
void float_to_int8_n(const float* src, float div, int8_t* dst, size_t n) {
  GB_DISPATCH(simd::FloatToInt8N)(src, div, dst, n);
}

static_assert(sizeof(fp8_e4m3fn_t) == 1 && sizeof(fp8_e5m2_t) == 1, "fp8 codes are single bytes");

void fp8_e4m3fn_to_float_n(const fp8_e4m3fn_t* src, float mul, float* dst, size_t n) {
  GB_DISPATCH(simd::Fp8ToFloatN)(reinterpret_cast<const uint8_t*>(src), detail::fp8_e4m3fn_decode_table(), mul, dst, n);
}

void fp8_e5m2_to_float_n(const fp8_e5m2_t* src, float mul, float* dst, size_t n) {
  GB_DISPATCH(simd::Fp8ToFloatN)(reinterpret_cast<const uint8_t*>(src), detail::fp8_e5m2_decode_table(), mul, dst, n);
}

void fp4_e2m1x2_to_float_n(const uint8_t* src, float mul, float* dst, size_t n) {
  for (size_t i = 0; i + 1 < n; i += 2) {
    dst[i] = detail::kFp4E2M1Values[src[i / 2] & 0xf] * mul;
    dst[i + 1] = detail::kFp4E2M1Values[src[i / 2] >> 4] * mul;
  }
}

}  // namespace genbridge
#endif  // HWY_ONCE
