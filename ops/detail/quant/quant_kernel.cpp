#include "ops/detail/quant/quant_kernel.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "core/vec.h"
#include "core/vec_formats.h"
#include "ops/detail/common/rows.h"

namespace genbridge::ops::detail {
namespace {

// ---------------------------------------------------------------------------------------------------
// Argument checks

std::string dims_string(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// x.shape[:-drop] + tail
std::vector<int64_t> leading_plus(const TensorView& x, int drop, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> d(x.shape(), x.shape() + (x.rank() - drop));
  d.insert(d.end(), tail);
  return d;
}

Status check_shape(const char* op, const char* name, const TensorView& t, const std::vector<int64_t>& want,
                   const std::string& rule) {
  bool same = t.rank() == static_cast<int>(want.size());
  for (int d = 0; same && d < t.rank(); ++d) same = t.dim(d) == want[static_cast<size_t>(d)];
  if (same) return ok_status();
  return invalid_argument(std::string(op) + ": " + name + " has shape " + t.shape_string() + " but must be " +
                          dims_string(want) + " (" + rule + ")");
}

Status check_dtype(const char* op, const char* name, const TensorView& t, DType want, const char* why = nullptr) {
  if (t.dtype() == want) return ok_status();
  std::string m = std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())) + " but must be " +
                  std::string(dtype_name(want));
  if (why) m += std::string(" (") + why + ")";
  return invalid_argument(m);
}

Status check_rank_at_least_1(const char* op, const char* name, const TensorView& t) {
  if (t.rank() >= 1) return ok_status();
  return invalid_argument(std::string(op) + ": " + name +
                          " has rank 0 but must have rank >= 1 (the op works along the last dimension)");
}

Status check_block_size(const char* op, int64_t block) {
  if (block >= 32 && block <= 1024 && block % 32 == 0) return ok_status();
  return invalid_argument(std::string(op) + ": block_size is " + std::to_string(block) +
                          " but must be a multiple of 32 in [32, 1024]");
}

bool is_mx_dtype(DType d) { return d == DType::kFp8E4M3FN || d == DType::kFp8E5M2 || d == DType::kFp4E2M1x2; }

std::string pair_rule(int64_t k, int64_t block) {
  return "leading shape + [ceil(ceil(K / block_size) / 2), 2] for K = " + std::to_string(k) +
         ", block_size = " + std::to_string(block);
}

// ---------------------------------------------------------------------------------------------------
// Vector helpers

typedef uint16_t u16x32 __attribute__((vector_size(64)));

inline vec::u32x16 vmax(vec::u32x16 a, vec::u32x16 b) { return a > b ? a : b; }
inline u16x32 vmax(u16x32 a, u16x32 b) { return a > b ? a : b; }

// Horizontal maxima: halve the vector until a few lanes remain (max is exact, so the order is free).
inline uint32_t hmax(vec::u32x16 v) {
  typedef uint32_t u32x8 __attribute__((vector_size(32)));
  typedef uint32_t u32x4 __attribute__((vector_size(16)));
  const u32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const u32x8 b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const u32x8 m8 = a > b ? a : b;
  const u32x4 c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3);
  const u32x4 d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const u32x4 m4 = c > d ? c : d;
  return std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
}

inline uint32_t hmax(u16x32 v) {
  typedef uint16_t u16x8 __attribute__((vector_size(16)));
  const vec::u16x16 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const vec::u16x16 hi = __builtin_shufflevector(v, v, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
  const vec::u16x16 m16 = lo > hi ? lo : hi;
  const u16x8 a = __builtin_shufflevector(m16, m16, 0, 1, 2, 3, 4, 5, 6, 7);
  const u16x8 b = __builtin_shufflevector(m16, m16, 8, 9, 10, 11, 12, 13, 14, 15);
  const u16x8 m8 = a > b ? a : b;
  uint32_t m = 0;
  for (int i = 0; i < 8; ++i) m = std::max(m, static_cast<uint32_t>(m8[i]));
  return m;
}

// fp32 bit pattern of max |x[i]| over n elements; any NaN gives a pattern above 0x7f800000 (the
// integer order of |x| bit patterns is the order of the values, with NaN above inf).
inline uint32_t abs_max_bits(const float* x, int64_t n) {
  vec::u32x16 m0{}, m1{};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    vec::u32x16 a, b;
    std::memcpy(&a, x + i, sizeof a);
    std::memcpy(&b, x + i + 16, sizeof b);
    m0 = vmax(m0, a & 0x7fffffffu);
    m1 = vmax(m1, b & 0x7fffffffu);
  }
  uint32_t m = hmax(vmax(m0, m1));
  for (; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  return m;
}

inline uint32_t abs_max_u16(const uint16_t* x, int64_t n) {
  u16x32 m0{}, m1{};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    u16x32 a, b;
    std::memcpy(&a, x + i, sizeof a);
    std::memcpy(&b, x + i + 32, sizeof b);
    m0 = vmax(m0, a & 0x7fff);
    m1 = vmax(m1, b & 0x7fff);
  }
  if (i + 32 <= n) {
    u16x32 a;
    std::memcpy(&a, x + i, sizeof a);
    m0 = vmax(m0, a & 0x7fff);
    i += 32;
  }
  uint32_t m = hmax(vmax(m0, m1));
  for (; i < n; ++i) m = std::max<uint32_t>(m, x[i] & 0x7fffu);
  return m;
}

inline uint32_t abs_max_bits(const bf16_t* x, int64_t n) {
  return abs_max_u16(reinterpret_cast<const uint16_t*>(x), n) << 16;  // bf16 is the top half of fp32
}

inline uint32_t abs_max_bits(const fp16_t* x, int64_t n) {
  const uint32_t h = abs_max_u16(reinterpret_cast<const uint16_t*>(x), n);
  if (h > 0x7c00u) return 0x7fc00000u;
  return std::bit_cast<uint32_t>(fp16_to_float(fp16_t{static_cast<uint16_t>(h)}));
}

// As abs_max_bits, for n a positive multiple of 32 (whole MX blocks): no tail handling.
inline uint32_t abs_max_bits_32n(const float* x, int64_t n) {
  vec::u32x16 m{};
  for (int64_t i = 0; i < n; i += 32) {
    vec::u32x16 a, b;
    std::memcpy(&a, x + i, sizeof a);
    std::memcpy(&b, x + i + 16, sizeof b);
    m = vmax(m, vmax(a & 0x7fffffffu, b & 0x7fffffffu));
  }
  return hmax(m);
}

inline uint32_t abs_max_u16_32n(const uint16_t* x, int64_t n) {
  u16x32 m{};
  for (int64_t i = 0; i < n; i += 32) {
    u16x32 a;
    std::memcpy(&a, x + i, sizeof a);
    m = vmax(m, a & 0x7fff);
  }
  return hmax(m);
}

inline uint32_t abs_max_bits_32n(const bf16_t* x, int64_t n) {
  return abs_max_u16_32n(reinterpret_cast<const uint16_t*>(x), n) << 16;
}

inline uint32_t abs_max_bits_32n(const fp16_t* x, int64_t n) {
  const uint32_t h = abs_max_u16_32n(reinterpret_cast<const uint16_t*>(x), n);
  if (h > 0x7c00u) return 0x7fc00000u;
  return std::bit_cast<uint32_t>(fp16_to_float(fp16_t{static_cast<uint16_t>(h)}));
}

// ---- 16 blocks at once (16-bit inputs): a transposed max-reduction, then the scale rule on 16 lanes ----
// combine<G>(a, b): a and b hold 32/G blocks each with G partial maxima per block; the result holds
// the blocks of a then those of b with G/2 partial maxima each (pairwise maxima of their halves).
template <int G, bool kSecondHalf>
struct CombineIndex {
  static constexpr int at(int lane) {
    const int half = G / 2, per = 32 / G;
    const int block = lane / half, offset = lane % half;
    return (block < per ? 0 : 32) + (block % per) * G + (kSecondHalf ? half : 0) + offset;
  }
};
template <int G, bool S, size_t... I>
inline u16x32 pick(u16x32 a, u16x32 b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, CombineIndex<G, S>::at(static_cast<int>(I))...);
}
template <int G>
inline u16x32 combine(u16x32 a, u16x32 b) {
  constexpr auto kLanes = std::make_index_sequence<32>{};
  return vmax(pick<G, false>(a, b, kLanes), pick<G, true>(a, b, kLanes));
}

// |x| bit-pattern maxima of 16 consecutive whole blocks of 16-bit values, block i in lane i.
inline vec::u16x16 abs_max_u16_16_blocks(const uint16_t* x, int64_t block) {
  u16x32 v[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    const uint16_t* p = x + j * block;
    u16x32 m;  // a register, not v[j]: a memcpy into the array would be split and stall the reload
    std::memcpy(&m, p, sizeof m);
    for (int64_t i = 32; i < block; i += 32) {
      u16x32 a;
      std::memcpy(&a, p + i, sizeof a);
      m = vmax(m, a);
    }
    v[j] = m & 0x7fff;
  }
  u16x32 w[8], y[4], z[2];
  for (int j = 0; j < 8; ++j) w[j] = combine<32>(v[2 * j], v[2 * j + 1]);
  for (int j = 0; j < 4; ++j) y[j] = combine<16>(w[2 * j], w[2 * j + 1]);
  for (int j = 0; j < 2; ++j) z[j] = combine<8>(y[2 * j], y[2 * j + 1]);
  const u16x32 q = combine<4>(z[0], z[1]);
  const u16x32 m = combine<2>(q, q);
  return __builtin_shufflevector(m, m, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// fp32 bit patterns of 16 bf16 / fp16 magnitude patterns (NaN stays NaN, inf stays inf).
inline vec::u32x16 widen_abs_bits(vec::u16x16 h, const bf16_t*) { return __builtin_convertvector(h, vec::u32x16) << 16; }
inline vec::u32x16 widen_abs_bits(vec::u16x16 h, const fp16_t*) {
  fp16_t tmp[16];  // through memory: vec::load is the fast widening (vcvtph2ps where available)
  std::memcpy(tmp, &h, sizeof tmp);
  return vec::as_u32(vec::load(tmp));
}

// mx_scale_code on 16 lanes (same rules; see the scalar version in quant_kernel.h).
template <DType D, MxScaleAlg A>
inline vec::u32x16 mx_scale_codes16(vec::u32x16 ab, bool round_scale) {
  constexpr int kEmax = D == DType::kFp8E4M3FN ? 8 : (D == DType::kFp8E5M2 ? 15 : 2);
  vec::i32x16 code;  // s + 127 before clamping
  if constexpr (A == MxScaleAlg::kOcpFloor) {
    code = std::bit_cast<vec::i32x16>(ab >> 23) - kEmax;
  } else if constexpr (A == MxScaleAlg::kCeil) {
    code = std::bit_cast<vec::i32x16>(ab >> 23) - kEmax - std::bit_cast<vec::i32x16>((ab & 0x7fffffu) > 0x600000u);
  } else {
    constexpr float kInv = D == DType::kFp8E4M3FN ? 1.0f / 448.0f : (D == DType::kFp8E5M2 ? 1.0f / 57344.0f : 1.0f / 6.0f);
    const vec::f32x16 a = vec::as_f32(ab), lo = vec::splat(kMxBiasedExponentAmaxFloor);
    const vec::f32x16 p = (a > lo ? a : lo) * kInv;
    code = std::bit_cast<vec::i32x16>(vec::as_u32(p) >> 23) + (round_scale ? 1 : 0);
  }
  code = code < 0 ? 0 : code;
  code = code > 254 ? 254 : code;
  const vec::u32x16 c = std::bit_cast<vec::u32x16>(code);
  return ab >= 0x7f800000u ? vec::u32x16{} + 0xffu : c;
}

// 2^(127 - code) for an e8m0 code in [0, 254]: the multiplier that divides by the block scale.
inline float inverse_scale(uint8_t code) {
  if (code == 254) return std::bit_cast<float>(0x00400000u);  // 2^-127, an fp32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(254 - code) << 23);
}

// ---------------------------------------------------------------------------------------------------
// dynamic_quant_per_token

template <typename T>
void int8_quant_row(const T* x, int64_t k, float eps, int8_t* q, float* scale) {
  const uint32_t ab = abs_max_bits(x, k);
  const float s = ab > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN()
                                   : std::max(std::bit_cast<float>(ab), eps) / 127.f;
  *scale = s;
  const vec::f32x16 d = vec::splat(s);
  int64_t i = 0;
  for (; i + vec::kLanes <= k; i += vec::kLanes) vec::store_bytes(q + i, vec::encode_int8(vec::load(x + i) / d));
  for (; i < k; ++i) q[i] = float_to_int8(to_f32(x[i]) / s);
}

// ---------------------------------------------------------------------------------------------------
// dynamic_mx_quant

template <DType D>
inline vec::u32x16 mx_encode_finite(vec::f32x16 v) {
  if constexpr (D == DType::kFp8E4M3FN) return vec::encode_fp8_e4m3fn_finite(v);
  if constexpr (D == DType::kFp8E5M2) return vec::encode_fp8_e5m2_finite(v);
  if constexpr (D == DType::kFp4E2M1x2) return vec::encode_fp4_e2m1_finite(v);
}

// Encodes 32 finite values (x * mul) into q (fp4: 16 bytes).
template <typename T, DType D>
[[gnu::always_inline]] inline void mx_encode_32(const T* x, vec::f32x16 m, uint8_t* q) {
  vec::f32x16 lo, hi;
  vec::load32(x, lo, hi);
  const vec::u32x16 a = mx_encode_finite<D>(lo * m), b = mx_encode_finite<D>(hi * m);
  if constexpr (D == DType::kFp4E2M1x2) {
    vec::store_nibble_pairs32(q, a, b);
  } else {
    vec::store_bytes32(q, a, b);
  }
}

// Encodes n finite values of one block (x / 2^s = x * mul) into q: 32 at a time, then scalar.
template <typename T, DType D>
void mx_encode_block(const T* x, int64_t n, float mul, uint8_t* q) {
  constexpr int64_t kQ = D == DType::kFp4E2M1x2 ? 2 : 1;  // values per byte
  const vec::f32x16 m = vec::splat(mul);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) mx_encode_32<T, D>(x + i, m, q + i / kQ);
  if constexpr (D == DType::kFp4E2M1x2) {
    for (; i + 1 < n; i += 2) {
      q[i / 2] = pack_fp4_e2m1x2(float_to_fp4_e2m1(to_f32(x[i]) * mul), float_to_fp4_e2m1(to_f32(x[i + 1]) * mul));
    }
  } else {
    for (; i < n; ++i) {
      const float v = to_f32(x[i]) * mul;
      q[i] = D == DType::kFp8E4M3FN ? float_to_fp8_e4m3fn(v).bits : float_to_fp8_e5m2(v).bits;
    }
  }
}

// One row: q receives K codes (fp4: K / 2 bytes), s receives 2 * pairs scale bytes. Two passes: every
// block's scale first, then every block's codes, so that no block's encode waits on its own reduction
// (the passes are independent streams the core can overlap). Whole blocks take the tail-free amax; only
// a short last block takes the general one.
template <typename T, DType D, MxScaleAlg A>
void mx_quant_row(const T* x, int64_t k, int64_t block, bool round_scale, uint8_t* q, uint8_t* s) {
  constexpr bool kFp4 = D == DType::kFp4E2M1x2;
  constexpr uint8_t kNaN = D == DType::kFp8E4M3FN ? 0x7f : (D == DType::kFp8E5M2 ? 0x7e : 0x00);
  const int64_t nb = mx_num_blocks(k, block), full = k / block;
  int64_t b0 = 0;
  if constexpr (!std::is_same_v<T, float>) {
    for (; b0 + 16 <= full; b0 += 16) {
      const vec::u16x16 h = abs_max_u16_16_blocks(reinterpret_cast<const uint16_t*>(x + b0 * block), block);
      vec::store_bytes(s + b0, mx_scale_codes16<D, A>(widen_abs_bits(h, x), round_scale));
    }
  }
  for (int64_t b = b0; b < full; ++b) s[b] = mx_scale_code<D, A>(abs_max_bits_32n(x + b * block, block), round_scale);
  if (full < nb) s[full] = mx_scale_code<D, A>(abs_max_bits(x + full * block, k - full * block), round_scale);
  if (nb % 2) s[nb] = 0;
  // Pass 2a: ordinary whole blocks, in a loop without calls so the encoder's constants stay in registers
  // (every vector register is caller-saved). Pass 2b: NaN blocks, blocks the bf16 path cannot take, and
  // the short tail.
  constexpr bool kBf16Path = std::is_same_v<T, bf16_t> && vec::kNativeFp16 && (D == DType::kFp8E4M3FN || D == DType::kFp4E2M1x2);
  constexpr int kMinCode = kBf16Path ? 127 - 112 : 0;  // see vec::bf16_scaled_minifloat for the preconditions
  for (int64_t b = 0; b < full; ++b) {
    const uint8_t code = s[b];
    if (code == 0xff || code < kMinCode) continue;
    const int64_t lo = b * block;
    uint8_t* qb = q + (kFp4 ? lo / 2 : lo);
    if constexpr (kBf16Path) {
      const int16_t s_shift = static_cast<int16_t>((code - 127) * 128);
      for (int64_t i = 0; i < block; i += 32) {
        vec::u16x32 u;
        std::memcpy(&u, x + lo + i, sizeof u);
        if constexpr (D == DType::kFp8E4M3FN) {
          vec::store_bytes32(qb + i, vec::encode_bf16_scaled_fp8_e4m3fn(u, s_shift));
        } else {
          vec::store_nibble_pairs32(qb + i / 2, vec::encode_bf16_scaled_fp4_e2m1(u, s_shift));
        }
      }
    } else {
      const vec::f32x16 m = vec::splat(inverse_scale(code));
      for (int64_t i = 0; i < block; i += 32) mx_encode_32<T, D>(x + lo + i, m, qb + (kFp4 ? i / 2 : i));
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t code = s[b];
    if (b < full && code != 0xff && code >= kMinCode) continue;  // done in pass 2a
    const int64_t lo = b * block, n = std::min(block, k - lo);
    uint8_t* qb = q + (kFp4 ? lo / 2 : lo);
    if (code == 0xff) {
      std::memset(qb, kNaN, static_cast<size_t>(kFp4 ? n / 2 : n));
    } else {
      mx_encode_block<T, D>(x + lo, n, inverse_scale(code), qb);
    }
  }
}

template <typename Fn>
void with_mx_alg(MxScaleAlg a, Fn&& fn) {
  switch (a) {
    case MxScaleAlg::kOcpFloor: fn(std::integral_constant<MxScaleAlg, MxScaleAlg::kOcpFloor>{}); return;
    case MxScaleAlg::kCeil: fn(std::integral_constant<MxScaleAlg, MxScaleAlg::kCeil>{}); return;
    case MxScaleAlg::kBiasedExponent: fn(std::integral_constant<MxScaleAlg, MxScaleAlg::kBiasedExponent>{}); return;
  }
  GB_CHECK(false, "with_mx_alg: unknown scale_alg (validate before dispatching)");
}

// Calls fn(T{}, std::integral_constant<DType, D>{}) for the input float type and MX dtype.
template <typename Fn>
void with_mx_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::kFp8E4M3FN: fn(std::integral_constant<DType, DType::kFp8E4M3FN>{}); return;
    case DType::kFp8E5M2: fn(std::integral_constant<DType, DType::kFp8E5M2>{}); return;
    case DType::kFp4E2M1x2: fn(std::integral_constant<DType, DType::kFp4E2M1x2>{}); return;
    default: GB_CHECK(false, "with_mx_dtype: not an MX element dtype (validate before dispatching)");
  }
}

Status validate_mx_quant(const TensorView& x, const MxQuantConfig& c, const TensorView& q, const TensorView& scale) {
  const char* op = "dynamic_mx_quant";
  const std::string ops = op;
  GB_RETURN_IF_ERROR(check_float_input(op, "x", x));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "x", x));
  GB_RETURN_IF_ERROR(check_block_size(op, c.block_size));
  if (!is_mx_dtype(c.dst)) {
    return invalid_argument(ops + ": dst is " + std::string(dtype_name(c.dst)) +
                            " but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2");
  }
  const int alg = static_cast<int>(c.scale_alg);
  if (alg < 0 || alg > 2) {
    return invalid_argument(ops + ": scale_alg is " + std::to_string(alg) +
                            " but must be 0 (OCP floor), 1 (ceil) or 2 (biased exponent)");
  }
  if (c.scale_alg == MxScaleAlg::kCeil && c.dst == DType::kFp4E2M1x2) {
    return invalid_argument(ops + ": scale_alg is 1 (ceil) but dst is fp4_e2m1x2; the ceil convention is defined "
                            "for FP8 destinations only");
  }
  if (c.round_scale && c.scale_alg != MxScaleAlg::kBiasedExponent) {
    return invalid_argument(ops + ": round_scale is set but scale_alg is " + std::to_string(alg) +
                            "; round_scale applies to scale_alg 2 (biased exponent) only");
  }
  const int64_t k = x.dim(-1);
  const bool fp4 = c.dst == DType::kFp4E2M1x2;
  if (fp4 && k % 2) {
    return invalid_argument(ops + ": x's last dimension is " + std::to_string(k) +
                            " but must be even for fp4_e2m1x2 (two values per byte)");
  }
  GB_RETURN_IF_ERROR(check_dtype(op, "q", q, c.dst, "config.dst"));
  GB_RETURN_IF_ERROR(check_shape(op, "q", q, leading_plus(x, 1, {fp4 ? k / 2 : k}),
                                 fp4 ? "x's shape with the last dimension halved: two fp4 values per byte"
                                     : "x's shape"));
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(x, 1, {mx_scale_pairs(k, c.block_size), 2}),
                                 "x's " + pair_rule(k, c.block_size)));
  return check_host_data(op, "scale", scale);
}

// Scale bytes of row r: 2 * pairs bytes at (j / 2) * stride(-2) + (j % 2) * stride(-1).
bool pair_layout_contiguous(const TensorView& s) { return s.stride(-1) == 1 && (s.dim(-2) <= 1 || s.stride(-2) == 2); }

void scatter_pairs(const TensorView& s, int64_t r, const uint8_t* bytes, int64_t pairs) {
  uint8_t* base = s.data_as<uint8_t>() + row_offset(s, 2, r);
  for (int64_t j = 0; j < 2 * pairs; ++j) base[(j / 2) * s.stride(-2) + (j % 2) * s.stride(-1)] = bytes[j];
}

// ---------------------------------------------------------------------------------------------------
// mx_dequant

Status validate_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block, const TensorView& y) {
  const char* op = "mx_dequant";
  if (!is_mx_dtype(q.dtype())) {
    return invalid_argument(std::string(op) + ": q has dtype " + std::string(dtype_name(q.dtype())) +
                            " but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "q", q));
  GB_RETURN_IF_ERROR(check_block_size(op, block));
  GB_RETURN_IF_ERROR(check_float_input(op, "y", y));
  const bool fp4 = q.dtype() == DType::kFp4E2M1x2;
  const int64_t k = fp4 ? 2 * q.dim(-1) : q.dim(-1);
  GB_RETURN_IF_ERROR(check_shape(op, "y", y, leading_plus(q, 1, {k}),
                                 fp4 ? "q's shape with the last dimension doubled: two fp4 values per byte"
                                     : "q's shape"));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(q, 1, {mx_scale_pairs(k, block), 2}),
                                 "q's " + pair_rule(k, block)));
  return check_host_data(op, "scale", scale);
}

// ---------------------------------------------------------------------------------------------------
// normalize_mx_scale_layout

Status validate_normalize(const TensorView& scale, const TensorView& out) {
  const char* op = "normalize_mx_scale_layout";
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kE8M0));
  if (scale.rank() != 2) {
    return invalid_argument(std::string(op) + ": scale has rank " + std::to_string(scale.rank()) +
                            " but must have rank 2 ([M, N], one byte per 32-element block)");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "scale", scale));
  GB_RETURN_IF_ERROR(check_dtype(op, "out", out, DType::kE8M0));
  const int64_t n = scale.dim(1);
  GB_RETURN_IF_ERROR(check_shape(op, "out", out, {scale.dim(0), (n + 1) / 2, 2},
                                 "[M, ceil(N / 2), 2] for scale [M, N] = " + scale.shape_string()));
  return check_host_data(op, "out", out);
}

}  // namespace

Status run_dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale) {
  const char* op = "dynamic_quant_per_token";
  GB_RETURN_IF_ERROR(check_float_input(op, "x", x));
  GB_RETURN_IF_ERROR(check_rank_at_least_1(op, "x", x));
  if (!std::isfinite(eps) || !(eps > 0.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(eps));
    return invalid_argument(std::string(op) + ": eps is " + text + " but must be finite and > 0");
  }
  GB_RETURN_IF_ERROR(check_dtype(op, "q", q, DType::kI8));
  GB_RETURN_IF_ERROR(check_shape(op, "q", q, leading_plus(x, 0, {}), "x's shape"));
  GB_RETURN_IF_ERROR(check_host_data(op, "q", q));
  GB_RETURN_IF_ERROR(check_dtype(op, "scale", scale, DType::kF32));
  GB_RETURN_IF_ERROR(check_shape(op, "scale", scale, leading_plus(x, 1, {}), "x's shape without its last dimension"));
  GB_RETURN_IF_ERROR(check_host_data(op, "scale", scale));

  const int64_t k = x.dim(-1);
  const int64_t rows = k == 0 ? 0 : x.numel() / k;
  if (rows == 0) {
    // K = 0 with rows: every row is all-zero (empty), so scale = eps / 127 and there is no q to write.
    const int64_t n = scale.numel();
    for (int64_t r = 0; r < n; ++r) scale.data_as<float>()[row_offset(scale, 0, r)] = eps / 127.f;
    return ok_status();
  }
  const bool x_fast = x.stride(-1) == 1, q_fast = q.stride(-1) == 1;
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(x_fast ? 0 : static_cast<size_t>(k));
    std::vector<int8_t> qbuf(q_fast ? 0 : static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      int8_t* qr = q_fast ? q.data_as<int8_t>() + row_offset(q, 1, r) : qbuf.data();
      float* sr = scale.data_as<float>() + row_offset(scale, 0, r);
      if (x_fast) {
        with_float_dtype(x.dtype(), [&](auto tag) {
          int8_quant_row(x.data_as<const decltype(tag)>() + row_offset(x, 1, r), k, eps, qr, sr);
        });
      } else {
        load_row_f32(x, 1, r, k, xbuf.data());
        int8_quant_row(xbuf.data(), k, eps, qr, sr);
      }
      if (!q_fast) {
        int8_t* base = q.data_as<int8_t>() + row_offset(q, 1, r);
        for (int64_t i = 0; i < k; ++i) base[i * q.stride(-1)] = qbuf[static_cast<size_t>(i)];
      }
    }
  });
  return ok_status();
}

Status run_dynamic_mx_quant(const TensorView& x, const MxQuantConfig& c, const TensorView& q, const TensorView& scale) {
  GB_RETURN_IF_ERROR(validate_mx_quant(x, c, q, scale));
  const int64_t k = x.dim(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(k, 1);
  if (rows == 0 || k == 0) return ok_status();  // nothing to write: no blocks, no elements
  const bool fp4 = c.dst == DType::kFp4E2M1x2;
  const int64_t q_bytes = fp4 ? k / 2 : k, pairs = mx_scale_pairs(k, c.block_size);
  const bool x_fast = x.stride(-1) == 1, q_fast = q.stride(-1) == 1 || q_bytes <= 1,
             s_fast = pair_layout_contiguous(scale);
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(x_fast ? 0 : static_cast<size_t>(k));
    std::vector<uint8_t> qbuf(q_fast ? 0 : static_cast<size_t>(q_bytes));
    std::vector<uint8_t> sbuf(s_fast ? 0 : static_cast<size_t>(2 * pairs));
    with_mx_dtype(c.dst, [&](auto dst) {
     with_mx_alg(c.scale_alg, [&](auto alg) {
      constexpr DType D = decltype(dst)::value;
      constexpr MxScaleAlg A = decltype(alg)::value;
      for (int64_t r = r0; r < r1; ++r) {
        uint8_t* qr = q_fast ? q.data_as<uint8_t>() + row_offset(q, 1, r) : qbuf.data();
        uint8_t* sr = s_fast ? scale.data_as<uint8_t>() + row_offset(scale, 2, r) : sbuf.data();
        if (x_fast) {
          with_float_dtype(x.dtype(), [&](auto tag) {
            mx_quant_row<decltype(tag), D, A>(x.data_as<const decltype(tag)>() + row_offset(x, 1, r), k, c.block_size,
                                              c.round_scale, qr, sr);
          });
        } else {
          load_row_f32(x, 1, r, k, xbuf.data());
          mx_quant_row<float, D, A>(xbuf.data(), k, c.block_size, c.round_scale, qr, sr);
        }
        if (!q_fast) {
          uint8_t* base = q.data_as<uint8_t>() + row_offset(q, 1, r);
          for (int64_t i = 0; i < q_bytes; ++i) base[i * q.stride(-1)] = qbuf[static_cast<size_t>(i)];
        }
        if (!s_fast) scatter_pairs(scale, r, sbuf.data(), pairs);
      }
     });
    });
  });
  return ok_status();
}

Status run_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block, const TensorView& y) {
  GB_RETURN_IF_ERROR(validate_mx_dequant(q, scale, block, y));
  const int64_t k = y.dim(-1), q_bytes = q.dim(-1);
  const int64_t rows = y.numel() / std::max<int64_t>(k, 1);
  if (rows == 0 || k == 0) return ok_status();
  const int64_t nb = mx_num_blocks(k, block);
  genbridge::detail::parallel_for(rows, k, [&](int64_t r0, int64_t r1) {
    std::vector<float> ybuf(static_cast<size_t>(k));
    std::vector<uint8_t> qbuf(static_cast<size_t>(q_bytes));
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* qr = q.data_as<const uint8_t>() + row_offset(q, 1, r);
      if (q.stride(-1) != 1) {
        for (int64_t i = 0; i < q_bytes; ++i) qbuf[static_cast<size_t>(i)] = qr[i * q.stride(-1)];
        qr = qbuf.data();
      }
      const uint8_t* sr = scale.data_as<const uint8_t>() + row_offset(scale, 2, r);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * block, n = std::min(block, k - lo);
        const float mul = e8m0_to_float(e8m0_t{sr[(b / 2) * scale.stride(-2) + (b % 2) * scale.stride(-1)]});
        float* out = ybuf.data() + lo;
        switch (q.dtype()) {
          case DType::kFp8E4M3FN:
            fp8_e4m3fn_to_float_n(reinterpret_cast<const fp8_e4m3fn_t*>(qr + lo), mul, out, static_cast<size_t>(n));
            break;
          case DType::kFp8E5M2:
            fp8_e5m2_to_float_n(reinterpret_cast<const fp8_e5m2_t*>(qr + lo), mul, out, static_cast<size_t>(n));
            break;
          default: fp4_e2m1x2_to_float_n(qr + lo / 2, mul, out, static_cast<size_t>(n)); break;
        }
      }
      store_row_f32(y, 1, r, k, ybuf.data());
    }
  });
  return ok_status();
}

Status run_normalize_mx_scale_layout(const TensorView& scale, const TensorView& out) {
  GB_RETURN_IF_ERROR(validate_normalize(scale, out));
  const int64_t m = scale.dim(0), n = scale.dim(1), pairs = (n + 1) / 2;
  const uint8_t* src = scale.data_as<const uint8_t>();
  uint8_t* dst = out.data_as<uint8_t>();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < 2 * pairs; ++j) {
      const uint8_t v = j < n ? src[r * scale.stride(0) + j * scale.stride(1)] : uint8_t{0};
      dst[r * out.stride(0) + (j / 2) * out.stride(1) + (j % 2) * out.stride(2)] = v;
    }
  }
  return ok_status();
}

}  // namespace genbridge::ops::detail
