// core/simd: the target list and GENBRIDGE_CPU_TARGET, and the 16-lane layer's primitives on every CPU
// target against the scalar codecs: exact FMA, the contract's pairwise reduction, bf16/fp16 widening
// (every fp16 code) and narrowing (ties, subnormals, overflow, NaN).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/simd/dispatch.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/formats.h"
#include "support/each_cpu_target.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/core/simd_vec16_test.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::simd::HWY_NAMESPACE {

// n must be a multiple of 16. fma[i] = a*b+c; sum[i/16] = reduction of a[i:i+16]; bf/hf: a narrowed;
// wide_b/wide_h: the 16-bit codes widened.
void LayerOps(const float* a, const float* b, const float* c, size_t n, float* fma, float* sum, bf16_t* bf,
              fp16_t* hf, const bf16_t* codes_b, const fp16_t* codes_h, float* wide_b, float* wide_h) {
  for (size_t i = 0; i < n; i += kLanes) {
    const V16 va = Load16(a + i);
    Store16(fma + i, Fma16(va, Load16(b + i), Load16(c + i)));
    sum[i / kLanes] = ReduceAdd16(va);
    Store16(bf + i, va);
    Store16(hf + i, va);
    Store16(wide_b + i, Load16(codes_b + i));
    Store16(wide_h + i, Load16(codes_h + i));
  }
}
const char* TargetNameHere() { return hwy::TargetName(HWY_TARGET); }

}  // namespace genbridge::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::simd {
HWY_EXPORT(LayerOps);
HWY_EXPORT(TargetNameHere);

namespace {

float reduce_contract(const float* v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Inputs that reach every branch: random magnitudes over the whole exponent range, fp16/bf16 rounding ties
// and near-ties, subnormals of fp32/fp16, overflow, infinities, NaNs; 65536 of them so every fp16 code
// appears once as a widening input.
struct Inputs {
  std::vector<float> a, b, c;
  std::vector<bf16_t> codes_b;
  std::vector<fp16_t> codes_h;
};
Inputs make_inputs() {
  constexpr size_t n = 65536;
  Inputs in;
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = any(rng);
    switch (i % 8) {
      case 0: break;                                                 // any bits (NaNs, infinities included)
      case 1: u = (u & 0x807fffffu) | ((100u + u % 60u) << 23); break;  // |x| in [2^-27, 2^33)
      case 2: u = (u & 0xffff0000u) | 0x8000u; break;                 // bf16 tie
      case 3: u = (u & 0xffffe000u) | 0x1000u; break;                 // fp16 tie (normal range and beyond)
      case 4: u = (u & 0x807fffffu) | ((103u + u % 10u) << 23); break;  // fp16 subnormal range
      case 5: u &= 0x807fffffu; break;                               // fp32 subnormal
      case 6: u = (u & 0x8000e000u) | 0x477fe000u; break;            // near fp16 overflow
      default: u = (u & 0x807fffffu) | (127u << 23); break;           // [1, 2)
    }
    in.a.push_back(from_bits(u));
    in.b.push_back(from_bits((any(rng) & 0x807fffffu) | ((110u + any(rng) % 30u) << 23)));
    in.c.push_back(from_bits((any(rng) & 0x807fffffu) | ((100u + any(rng) % 50u) << 23)));
    in.codes_b.push_back(bf16_t{static_cast<uint16_t>(any(rng))});
    in.codes_h.push_back(fp16_t{static_cast<uint16_t>(i)});
  }
  return in;
}

TEST(CpuTarget, lists_scalar_last_and_the_chosen_target_first) {
  const auto avail = cpu_targets_available();
  ASSERT_FALSE(avail.empty());
  // The default build compiles the scalar fallback; a build with -march=native (GENBRIDGE_ARCH_FLAGS) has
  // its baseline target only.
  EXPECT_EQ(avail.back(), cpu_targets_compiled().back());
  ASSERT_TRUE(set_cpu_target("best").ok());
  EXPECT_EQ(cpu_target(), avail.front());
  EXPECT_EQ(cpu_target_line().rfind("cpu target: " + avail.front() + " (available:", 0), 0u) << cpu_target_line();
}

TEST(CpuTarget, best_takes_the_bf16_dot_instruction_only_where_it_computes_at_least_as_fast_as_the_fmas) {
  const double rate = cpu_bf16_dot_rate();
  EXPECT_EQ(cpu_bf16_dot_rate(), rate);  // measured once per process
  const auto avail = cpu_targets_available();
  const auto dot = std::find(avail.begin(), avail.end(), "avx512_bf16");
  ASSERT_EQ(dot != avail.end(), rate > 0) << cpu_target_line();
  ASSERT_TRUE(set_cpu_target("best").ok());
  EXPECT_EQ(cpu_target() == "avx512_bf16", rate >= 1.0) << cpu_target_line();
  if (dot == avail.end()) {
    EXPECT_EQ(cpu_target_line().find("bf16 dot"), std::string::npos) << cpu_target_line();
    return;
  }
  // Listed first where it pays, just below avx512 where it does not; either way it can be asked for by name.
  EXPECT_EQ(dot - avail.begin(), rate >= 1.0 ? 0 : 1) << cpu_target_line();
  EXPECT_NE(cpu_target_line().find(", the bf16 dot instruction at "), std::string::npos) << cpu_target_line();
  ASSERT_TRUE(set_cpu_target("avx512_bf16").ok());
  EXPECT_EQ(cpu_target(), "avx512_bf16");
  ASSERT_TRUE(set_cpu_target("avx512").ok());
  EXPECT_EQ(cpu_target(), "avx512");
  ASSERT_TRUE(set_cpu_target("best").ok());
}

TEST(CpuTarget, restricting_moves_every_dispatch_to_that_target) {
  for (const std::string& t : cpu_targets_available()) {
    ASSERT_TRUE(set_cpu_target(t).ok());
    const std::string hwy_name = HWY_DYNAMIC_DISPATCH(TargetNameHere)();
    const std::string expect = t == "scalar" ? (hwy_name == "SCALAR" ? "SCALAR" : "EMU128") : (t == "avx512" || t == "avx512_bf16") ? "AVX3" : t == "avx2" ? "AVX2"
                               : t == "sse4" ? "SSE4" : t == "neon" ? "NEON" : "?";
    EXPECT_EQ(hwy_name, expect) << t;
  }
  ASSERT_TRUE(set_cpu_target("best").ok());
}

TEST(CpuTarget, an_unknown_or_unavailable_target_is_refused_naming_what_is_available) {
  const Status s = set_cpu_target("avx1024");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("CPU target 'avx1024' is not available here; available: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(cpu_targets_available().back()), std::string::npos);
  ASSERT_TRUE(set_cpu_target("best").ok());
}

TEST(CpuTarget, environment_variable_is_validated) {
  const std::string lowest = cpu_targets_available().back();
  ASSERT_EQ(setenv(kCpuTargetEnv.data(), lowest.c_str(), 1), 0);
  EXPECT_EQ(cpu_target_from_env().value(), lowest);
  ASSERT_EQ(setenv(kCpuTargetEnv.data(), "pentium", 1), 0);
  const auto bad = cpu_target_from_env();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("GENBRIDGE_CPU_TARGET=pentium: not a CPU target this machine can run; available: ", 0),
            0u)
      << bad.status().message();
  ASSERT_EQ(unsetenv(kCpuTargetEnv.data()), 0);
  EXPECT_EQ(cpu_target_from_env().value(), "");
}

TEST(Vec16, every_primitive_gives_the_scalar_bits_on_every_target) {
  const Inputs in = make_inputs();
  const size_t n = in.a.size();
  genbridge::testing::for_each_cpu_target([&](const std::string& target) {
    std::vector<float> fma(n), sum(n / 16), wide_b(n), wide_h(n);
    std::vector<bf16_t> bf(n);
    std::vector<fp16_t> hf(n);
    HWY_DYNAMIC_DISPATCH(LayerOps)(in.a.data(), in.b.data(), in.c.data(), n, fma.data(), sum.data(), bf.data(),
                                   hf.data(), in.codes_b.data(), in.codes_h.data(), wide_b.data(), wide_h.data());
    int bad = 0;
    for (size_t i = 0; i < n && bad < 40; ++i) {
      const float want_fma = std::fma(in.a[i], in.b[i], in.c[i]);
      if (bits(fma[i]) != bits(want_fma) && !(std::isnan(fma[i]) && std::isnan(want_fma))) {
        ADD_FAILURE() << target << " fma(" << in.a[i] << ", " << in.b[i] << ", " << in.c[i] << ")";
        ++bad;
      }
      if (bf[i].bits != float_to_bf16(in.a[i]).bits) {
        ADD_FAILURE() << target << " bf16 of 0x" << std::hex << bits(in.a[i]) << ": 0x" << bf[i].bits;
        ++bad;
      }
      if (hf[i].bits != float_to_fp16(in.a[i]).bits) {
        ADD_FAILURE() << target << " fp16 of 0x" << std::hex << bits(in.a[i]) << ": 0x" << hf[i].bits << " want 0x"
                      << float_to_fp16(in.a[i]).bits;
        ++bad;
      }
      if (bits(wide_b[i]) != bits(bf16_to_float(in.codes_b[i]))) {
        ADD_FAILURE() << target << " bf16 code " << in.codes_b[i].bits;
        ++bad;
      }
      if (bits(wide_h[i]) != bits(fp16_to_float(in.codes_h[i]))) {
        ADD_FAILURE() << target << " fp16 code 0x" << std::hex << in.codes_h[i].bits << " -> 0x" << bits(wide_h[i])
                      << " want 0x" << bits(fp16_to_float(in.codes_h[i]));
        ++bad;
      }
      if (i % 16 == 0) {
        const float want = reduce_contract(&in.a[i]);
        if (bits(sum[i / 16]) != bits(want) && !(std::isnan(want) && std::isnan(sum[i / 16]))) {
          ADD_FAILURE() << target << " reduction of block " << i / 16;
          ++bad;
        }
      }
    }
  });
}

}  // namespace
}  // namespace genbridge::simd
#endif  // HWY_ONCE
