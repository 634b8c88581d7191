#pragma once
// Bit-exact scalar codecs for the float formats of docs/design.md#data-formats (bf16, fp16, fp8 e4m3fn/e5m2, e8m0,
// fp4 e2m1, int8), plus vectorized bulk conversions. 16-bit encoders round to nearest, ties to even;
// NaN stays NaN (quiet); fp16 overflows to infinity. The 8/4-bit rules are stated further down.

#include <bit>
#include <cstddef>
#include <cstdint>

namespace genbridge {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

inline float bf16_to_float(bf16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

inline bf16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

inline float fp16_to_float(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24 is exact in fp32.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
}

inline fp16_t float_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN
  if (a >= 0x477ff000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65536: inf
  if (a >= 0x38800000u) {  // normal fp16 range (>= 2^-14)
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return fp16_t{static_cast<uint16_t>(sign | (r >> 13))};
  }
  // Subnormal or zero: value = a_float; quantum 2^-24. Round mantissa with RNE via integer shift.
  const uint32_t exp = a >> 23;
  if (exp < 102) return fp16_t{sign};  // < 2^-25: rounds to zero (2^-25 exactly is a tie to 0)
  const uint32_t man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // value = man * 2^(exp-150); in units of 2^-24: man >> (126-exp)
  uint32_t q = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return fp16_t{static_cast<uint16_t>(sign | q)};
}

// ---- 8-bit and 4-bit formats (docs/design.md#data-formats) ----
// fp8 e4m3fn: 1-4-3, bias 7, max 448, no infinities, NaN = S.1111.111.
// fp8 e5m2:   1-5-2, bias 15, max 57344, IEEE-style infinities and NaNs.
// e8m0:       8-bit biased exponent, value 2^(e-127), 0xFF = NaN (scales only).
// fp4 e2m1:   1-2-1, bias 1, values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; packed two per byte, low nibble first.
//
// Encoders round to nearest, ties to even, on the format's own grid (subnormals included); decoders are
// exact. Overflow rule (the rounding boundary is the midpoint between max and the next grid value:
// 464 for e4m3fn, 61440 for e5m2, 7 for e2m1; the midpoint itself rounds to even, i.e. to max for
// e4m3fn and away from max for e5m2 and e2m1):
//   Overflow::kSaturate (the default, and what every quantizer uses): anything that rounds beyond max,
//     and +-inf, becomes +-max ("satfinite"). e4m3fn then never produces its NaN from a non-NaN input
//     and e5m2 never produces an infinity. This matches OCP MX element conversion, which clamps to the
//     largest normal, and the saturating casts of the deployed quant kernels.
//   Overflow::kNonFinite (plain IEEE-style conversion, offered for tooling): e5m2 rounds to +-inf past
//     61440 and keeps +-inf; e4m3fn, having no infinity, gives NaN past 464 and for +-inf.
// NaN input encodes as NaN (e4m3fn S.1111.111, e5m2 S.11111.10); fp4 e2m1 has no NaN and encodes NaN as +0.

struct fp8_e4m3fn_t {
  uint8_t bits;
};
struct fp8_e5m2_t {
  uint8_t bits;
};
struct e8m0_t {
  uint8_t bits;
};

// What an encoder does with a value beyond the format's largest finite value (after rounding).
enum class Overflow {
  kSaturate,  // clamp to +-max (our quantizers; infinities also saturate)
  kNonFinite  // e4m3fn: NaN; e5m2: infinity (IEEE-style conversion)
};

namespace detail {
// Decode tables, indexed by code; constant-initialised from the format definitions, so they are valid
// before any dynamic initialiser runs.
const float* fp8_e4m3fn_decode_table();
const float* fp8_e5m2_decode_table();
const float* e8m0_decode_table();
extern const float kFp4E2M1Values[16];

// Round-to-nearest-even encode of |f| (finite, not NaN) into a minifloat grid with M mantissa bits and
// minimum normal exponent emin; returns the unsigned code, which may exceed the format's max code.
template <int M, int Emin>
inline uint32_t minifloat_magnitude_code(uint32_t abs_bits) {
  if (abs_bits == 0) return 0;
  int e = static_cast<int>(abs_bits >> 23) - 127;
  if (e < -126) return 0;  // fp32 subnormals are far below every minifloat's range
  if (e > 64) return 0xffffu;  // certainly overflows
  const uint32_t man = (abs_bits & 0x7fffffu) | 0x800000u;
  const int qe = (e < Emin ? Emin : e) - M;  // exponent of the target quantum
  const int shift = 23 - (e - qe);
  uint32_t q;
  if (shift >= 25) {
    q = 0;  // below half the smallest subnormal
  } else {
    q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
  }
  if (e < Emin) return q;  // subnormal (q == 2^M is the smallest normal, which the code layout gives for free)
  return (static_cast<uint32_t>(e - Emin) << M) + q;  // == ((e + bias - 1) << M) + q
}
}  // namespace detail

inline float fp8_e4m3fn_to_float(fp8_e4m3fn_t v) { return detail::fp8_e4m3fn_decode_table()[v.bits]; }
inline float fp8_e5m2_to_float(fp8_e5m2_t v) { return detail::fp8_e5m2_decode_table()[v.bits]; }
inline float e8m0_to_float(e8m0_t v) { return detail::e8m0_decode_table()[v.bits]; }
// Decodes one fp4 e2m1 nibble (the low 4 bits of `nibble`).
inline float fp4_e2m1_to_float(uint8_t nibble) { return detail::kFp4E2M1Values[nibble & 0xf]; }

inline fp8_e4m3fn_t float_to_fp8_e4m3fn(float f, Overflow overflow = Overflow::kSaturate) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8_e4m3fn_t{static_cast<uint8_t>(sign | 0x7f)};  // NaN
  const uint32_t code = a == 0x7f800000u ? 0xffffu : detail::minifloat_magnitude_code<3, -6>(a);
  if (code > 0x7e) return fp8_e4m3fn_t{static_cast<uint8_t>(sign | (overflow == Overflow::kSaturate ? 0x7e : 0x7f))};
  return fp8_e4m3fn_t{static_cast<uint8_t>(sign | code)};
}

inline fp8_e5m2_t float_to_fp8_e5m2(float f, Overflow overflow = Overflow::kSaturate) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp8_e5m2_t{static_cast<uint8_t>(sign | 0x7e)};  // quiet NaN
  const uint32_t code = a == 0x7f800000u ? 0xffffu : detail::minifloat_magnitude_code<2, -14>(a);
  if (code > 0x7b) return fp8_e5m2_t{static_cast<uint8_t>(sign | (overflow == Overflow::kSaturate ? 0x7b : 0x7c))};
  return fp8_e5m2_t{static_cast<uint8_t>(sign | code)};
}

// Encodes to an fp4 e2m1 nibble (RNE, saturating to +-6; NaN encodes as +0 since the format has none).
inline uint8_t float_to_fp4_e2m1(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 28) & 0x8u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;
  const uint32_t code = a == 0x7f800000u ? 0xffffu : detail::minifloat_magnitude_code<1, 0>(a);
  return static_cast<uint8_t>(sign | (code > 0x7 ? 0x7 : code));
}

// One byte of the fp4_e2m1x2 layout: `lo` (the even-indexed value) in bits 0-3, `hi` in bits 4-7.
inline uint8_t pack_fp4_e2m1x2(uint8_t lo, uint8_t hi) { return static_cast<uint8_t>((lo & 0xf) | (hi << 4)); }

// Symmetric int8: round to nearest even, clamp to [-127, 127]; NaN encodes as 0.
inline int8_t float_to_int8(float f) {
  if (!(f == f)) return 0;
  const float c = f > 127.f ? 127.f : (f < -127.f ? -127.f : f);
  // Adding and subtracting 1.5 * 2^23 rounds |c| < 2^22 to an integer, ties to even (default FP mode).
  const float r = (c + 12582912.f) - 12582912.f;
  return static_cast<int8_t>(r);
}

// Bulk conversions (vectorized where the CPU allows; identical results to the scalar codecs). `src`
// and `dst` must not overlap; n counts values; nothing is retained.
void bf16_to_float_n(const bf16_t* src, float* dst, size_t n);
void float_to_bf16_n(const float* src, bf16_t* dst, size_t n);
void fp16_to_float_n(const fp16_t* src, float* dst, size_t n);
void float_to_fp16_n(const float* src, fp16_t* dst, size_t n);

// Scaled bulk encoders (the quantizers' hot path): dst[i] = <scalar encoder>(fl32(src[i] * mul)),
// saturating. With mul a power of two the product is exact wherever the result is not zero.
void float_to_fp8_e4m3fn_n(const float* src, float mul, fp8_e4m3fn_t* dst, size_t n);
void float_to_fp8_e5m2_n(const float* src, float mul, fp8_e5m2_t* dst, size_t n);
// n must be even: value 2i goes to the low nibble of dst[i], value 2i+1 to the high nibble.
void float_to_fp4_e2m1x2_n(const float* src, float mul, uint8_t* dst, size_t n);
// dst[i] = float_to_int8(fl32(src[i] / div)): the fp32 quotient, then RNE and clamp to +-127.
void float_to_int8_n(const float* src, float div, int8_t* dst, size_t n);

// Scaled bulk decoders: dst[i] = fl32(decode(src[i]) * mul). fp4: n values from n/2 bytes (n even).
void fp8_e4m3fn_to_float_n(const fp8_e4m3fn_t* src, float mul, float* dst, size_t n);
void fp8_e5m2_to_float_n(const fp8_e5m2_t* src, float mul, float* dst, size_t n);
void fp4_e2m1x2_to_float_n(const uint8_t* src, float mul, float* dst, size_t n);

}  // namespace genbridge
