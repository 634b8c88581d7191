// Contract test for quant/dynamic_mx_quant; runs unchanged in every target build. On Ascend950 the q and
// scale bytes are compared bit for bit with the fp64 reference (ops/common/quant/quant_ref.h) for every scale
// convention, and the dequantized values are checked against x on every unsaturated element. On
// Ascend910 the provider is the explicit unsupported one and the exact Unimplemented message is checked.
#include "genbridge/ops/quant/dynamic_mx_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/quant/quant_ref.h"
#include "quant_test_util.h"

namespace genbridge::testing {
namespace {

using ops::MxQuantConfig;
using ops::MxScaleAlg;

struct Variant {
  DType dst;
  MxScaleAlg alg;
  bool round_scale;
  const char* name;
};

const Variant kVariants[] = {
    {DType::kFp8E4M3FN, MxScaleAlg::kOcpFloor, false, "e4m3_floor"},
    {DType::kFp8E4M3FN, MxScaleAlg::kCeil, false, "e4m3_ceil"},
    {DType::kFp8E4M3FN, MxScaleAlg::kBiasedExponent, false, "e4m3_biased"},
    {DType::kFp8E4M3FN, MxScaleAlg::kBiasedExponent, true, "e4m3_biased_round"},
    {DType::kFp8E5M2, MxScaleAlg::kOcpFloor, false, "e5m2_floor"},
    {DType::kFp8E5M2, MxScaleAlg::kCeil, false, "e5m2_ceil"},
    {DType::kFp8E5M2, MxScaleAlg::kBiasedExponent, false, "e5m2_biased"},
    {DType::kFp8E5M2, MxScaleAlg::kBiasedExponent, true, "e5m2_biased_round"},
    {DType::kFp4E2M1x2, MxScaleAlg::kOcpFloor, false, "fp4_floor"},
    {DType::kFp4E2M1x2, MxScaleAlg::kBiasedExponent, false, "fp4_biased"},
    {DType::kFp4E2M1x2, MxScaleAlg::kBiasedExponent, true, "fp4_biased_round"},
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

MxQuantConfig config_of(const Variant& v, int64_t block) {
  MxQuantConfig c;
  c.block_size = block;
  c.dst = v.dst;
  c.scale_alg = v.alg;
  c.round_scale = v.round_scale;
  return c;
}

bool is_fp4(DType d) { return d == DType::kFp4E2M1x2; }

// Mantissa bits and minimum normal exponent of the element format: round-to-nearest-even keeps the
// dequantized value within half a quantum, i.e. 2^-(M+1) relative in the normal range and
// 2^(emin-M-1) * scale absolute in the subnormal range.
double rne_bound(DType dst, double x, double scale) {
  const int m = dst == DType::kFp8E4M3FN ? 3 : (dst == DType::kFp8E5M2 ? 2 : 1);
  const int emin = dst == DType::kFp8E4M3FN ? -6 : (dst == DType::kFp8E5M2 ? -14 : 0);
  return std::max(std::abs(x) * std::ldexp(1.0, -(m + 1)), std::ldexp(scale, emin - m - 1));
}

std::vector<int64_t> q_shape(const std::vector<int64_t>& x, DType dst) {
  std::vector<int64_t> s = x;
  if (is_fp4(dst)) s.back() /= 2;
  return s;
}

std::vector<int64_t> scale_shape(const std::vector<int64_t>& x, int64_t block) {
  std::vector<int64_t> s(x.begin(), x.end() - 1);
  s.push_back(ops::mx_scale_pairs(x.back(), block));
  s.push_back(2);
  return s;
}

struct MxRun {
  std::vector<uint8_t> q, scale;
  std::vector<double> deq;  // dequantized in fp64 from q and scale (NaN for NaN scales)
  int64_t unsaturated = 0, saturated = 0;
};

// Runs the op, compares q and scale bytes with the reference bit for bit, checks x unmutated, and
// checks the dequantized values: within the RNE bound of x where |x| / scale <= max(dst), exactly
// +-max * scale where it saturates.
MxRun run_and_check(const TensorView& x, OwnedTensor& x_storage, const MxQuantConfig& c, const TensorView& q,
                    const TensorView& scale) {
  const std::vector<int64_t> shape(x.shape(), x.shape() + x.rank());
  const int64_t k = shape.back(), rows = leading_rows(shape), pairs = ops::mx_scale_pairs(k, c.block_size);
  const auto x_before = x_storage.bytes();
  const Status st = ops::dynamic_mx_quant(x, c, q, scale);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(x_storage.bytes(), x_before) << "x was mutated";

  const std::vector<double> xv = to_doubles(x);
  std::vector<uint8_t> want_q, want_s;
  ref::dynamic_mx_quant(xv, rows, k, c, want_q, want_s);
  MxRun run;
  run.q = logical_bytes(q);
  run.scale = logical_bytes(scale);
  EXPECT_EQ(run.scale, want_s) << "scale bytes differ from the reference";
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want_q.size(); ++i) {
    if (run.q[i] != want_q[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "q bytes differ from the reference; first at byte " << first << ": got "
                    << (first >= 0 ? int{run.q[first]} : 0) << ", want " << (first >= 0 ? int{want_q[first]} : 0);

  const double vmax = ref::mx_max(c.dst);
  run.deq.resize(xv.size());
  int64_t far = 0, wrong_saturation = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t sb = run.scale[static_cast<size_t>(r * pairs * 2 + i / c.block_size)];
      const uint8_t code = is_fp4(c.dst) ? static_cast<uint8_t>(run.q[r * (k / 2) + i / 2] >> (4 * (i % 2)))
                                         : run.q[r * k + i];
      const double x_i = xv[r * k + i];
      const size_t at = static_cast<size_t>(r * k + i);
      if (sb == 0xff) {
        run.deq[at] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      const double s = std::ldexp(1.0, sb - 127);
      const double d = ref::mx_element_value(c.dst, code) * s;
      run.deq[at] = d;
      if (std::abs(x_i) / s > vmax) {
        ++run.saturated;
        wrong_saturation += d != std::copysign(vmax * s, x_i);
      } else {
        ++run.unsaturated;
        far += std::abs(d - x_i) > rne_bound(c.dst, x_i, s);
      }
    }
  }
  EXPECT_EQ(far, 0) << "unsaturated elements further than half a quantum from x";
  EXPECT_EQ(wrong_saturation, 0) << "saturated elements not at +-max * scale";
  return run;
}

// Fresh tensors for one call; q and scale are pre-filled with 0xAA so unwritten bytes show.
struct MxCase {
  OwnedTensor x, q, scale;
  MxCase(DType d, const std::vector<int64_t>& shape, const MxQuantConfig& c)
      : x(d, shape), q(c.dst, q_shape(shape, c.dst)), scale(DType::kE8M0, scale_shape(shape, c.block_size)) {
    std::memset(q.data(), 0xaa, q.bytes().size());
    std::memset(scale.data(), 0xaa, scale.bytes().size());
  }
  MxRun run(const MxQuantConfig& c) { return run_and_check(x.view(), x, c, q.view(), scale.view()); }
};

// ---- the reference comparison over every convention, input dtype, shape and block size ----

class MxQuantContract : public ::testing::TestWithParam<std::tuple<Variant, DType>> {};

TEST_P(MxQuantContract, matches_fp64_reference) {
  GB_REQUIRE_MX();
  const auto [v, d] = GetParam();
  const std::vector<std::vector<int64_t>> shapes{{4, 256}, {2, 3, 512}, {3, 100}, {1, 4096}, {5, 96}};
  uint64_t seed = 1;
  for (const auto& shape : shapes) {
    for (int64_t block : {32, 64, 1024}) {
      SCOPED_TRACE(shape_name(shape) + " block " + std::to_string(block));
      const MxQuantConfig c = config_of(v, block);
      MxCase t(d, shape, c);
      set_values(t.x.view(), wide_range_values(t.x.view().numel(), block, seed++, d));
      const MxRun run = t.run(c);
      EXPECT_GT(run.unsaturated, 0) << "no unsaturated elements: the tolerance check checked nothing";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(conventions, MxQuantContract,
                         ::testing::Combine(::testing::ValuesIn(kVariants),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// ---- edge cases ----

TEST(DynamicMxQuant, all_zero_block) {
  GB_REQUIRE_MX();
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MxQuantConfig c = config_of(v, 32);
    MxCase t(DType::kBF16, {2, 96}, c);
    fill_uniform(t.x.view(), 4);
    for (int i = 0; i < 32; ++i) t.x.view().data_as<bf16_t>()[32 + i] = float_to_bf16(0.f);  // row 0, block 1
    for (int i = 0; i < 96; ++i) t.x.view().data_as<bf16_t>()[96 + i] = float_to_bf16(0.f);   // all of row 1
    const MxRun run = t.run(c);
    const uint8_t zero_scale = run.scale[1];
    EXPECT_NE(zero_scale, 0xff);
    EXPECT_TRUE(std::isfinite(e8m0_to_float(e8m0_t{zero_scale})));
    if (v.alg != MxScaleAlg::kBiasedExponent) {
      EXPECT_EQ(zero_scale, 0) << "an all-zero block takes the smallest scale, 2^-127";
    }
    EXPECT_EQ(run.scale[4], zero_scale);  // row 1, block 0 (row stride: 2 pairs = 4 bytes)
    for (size_t i = 0; i < run.deq.size(); ++i) ASSERT_FALSE(std::isnan(run.deq[i])) << i;
    for (int i = 32; i < 64; ++i) EXPECT_EQ(run.deq[i], 0.0);
    for (int i = 96; i < 192; ++i) EXPECT_EQ(run.deq[i], 0.0);
  }
}

TEST(DynamicMxQuant, block_max_exactly_a_power_of_two) {
  GB_REQUIRE_MX();
  // e4m3fn: emax 8, max 448 = 1.75 * 2^8.
  struct Case {
    float amax;
    MxScaleAlg alg;
    int want_s;
  };
  const Case cases[] = {
      {256.f, MxScaleAlg::kOcpFloor, 0},  {256.f, MxScaleAlg::kCeil, 0},      // 256 / 2^0 <= 448
      {512.f, MxScaleAlg::kOcpFloor, 1},  {512.f, MxScaleAlg::kCeil, 1},      // 512 / 2 = 256
      {3584.f, MxScaleAlg::kOcpFloor, 3}, {3584.f, MxScaleAlg::kCeil, 3},     // 448 * 8: fits exactly
      {1.f, MxScaleAlg::kOcpFloor, -8},   {1.f, MxScaleAlg::kCeil, -8},       // 1 / 2^-8 = 256
      {0.5f, MxScaleAlg::kOcpFloor, -9},  {std::ldexp(1.f, -100), MxScaleAlg::kCeil, -108},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(std::to_string(cs.amax) + " alg " + std::to_string(static_cast<int>(cs.alg)));
    MxQuantConfig c;
    c.scale_alg = cs.alg;
    MxCase t(DType::kF32, {1, 32}, c);
    std::vector<float> v(32);
    for (int i = 0; i < 32; ++i) v[i] = cs.amax * std::ldexp(1.f, -(i % 5)) * (i % 2 ? -1.f : 1.f);
    set_values(t.x.view(), v);
    const MxRun run = t.run(c);
    EXPECT_EQ(run.scale[0], cs.want_s + 127);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(run.deq[i], v[i]) << "powers of two of the scale are exact";
    EXPECT_EQ(run.saturated, 0);
  }
  // The biased-exponent rule at amax = 448: whatever fl32(448 * fl32(1/448)) is, kernel and reference agree,
  // and round_scale moves the scale up by exactly one binade.
  for (bool round : {false, true}) {
    MxQuantConfig c;
    c.scale_alg = MxScaleAlg::kBiasedExponent;
    c.round_scale = round;
    MxCase t(DType::kF32, {1, 32}, c);
    std::vector<float> v(32, 1.f);
    v[7] = 448.f;
    set_values(t.x.view(), v);
    const MxRun run = t.run(c);
    EXPECT_EQ(run.scale[0], ref::mx_scale_byte(448.0, DType::kFp8E4M3FN, MxScaleAlg::kBiasedExponent, round));
  }
  EXPECT_EQ(ref::mx_scale_byte(448.0, DType::kFp8E4M3FN, MxScaleAlg::kBiasedExponent, true),
            ref::mx_scale_byte(448.0, DType::kFp8E4M3FN, MxScaleAlg::kBiasedExponent, false) + 1);
}

TEST(DynamicMxQuant, tail_shorter_than_a_block) {
  GB_REQUIRE_MX();
  struct Case {
    int64_t rows, k, block;
  };
  // K = 100: blocks of 32, 32, 32, 4 (pairs 2, no padding). K = 70: 32, 32, 6 (pairs 2, one padding
  // byte). K = 40 with block 64: one short block (pairs 1, one padding byte).
  for (const Case cs : {Case{3, 100, 32}, Case{2, 70, 32}, Case{2, 40, 64}}) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(std::string(v.name) + " K " + std::to_string(cs.k) + " block " + std::to_string(cs.block));
      const MxQuantConfig c = config_of(v, cs.block);
      MxCase t(DType::kBF16, {cs.rows, cs.k}, c);
      set_values(t.x.view(), wide_range_values(cs.rows * cs.k, 8, 21, DType::kBF16));
      const MxRun run = t.run(c);
      const int64_t nb = ops::mx_num_blocks(cs.k, cs.block), pairs = ops::mx_scale_pairs(cs.k, cs.block);
      for (int64_t r = 0; r < cs.rows; ++r) {
        if (nb % 2) {
          EXPECT_EQ(run.scale[r * pairs * 2 + nb], 0) << "padding byte of row " << r;
        }
        // The tail block's scale depends only on its own elements (the padding counts as zero).
        double amax = 0;
        for (int64_t i = (nb - 1) * cs.block; i < cs.k; ++i) {
          amax = std::max(amax, std::abs(static_cast<double>(bf16_to_float(t.x.view().data_as<bf16_t>()[r * cs.k + i]))));
        }
        EXPECT_EQ(run.scale[r * pairs * 2 + nb - 1], ref::mx_scale_byte(amax, v.dst, v.alg, v.round_scale));
      }
    }
  }
}

TEST(DynamicMxQuant, saturating_block) {
  GB_REQUIRE_MX();
  // With the OCP floor rule, amax / scale lies in [2^emax, 2^(emax+1)) and saturates above max.
  struct Case {
    DType dst;
    float amax;
  };
  for (const Case cs : {Case{DType::kFp8E4M3FN, 500.f}, Case{DType::kFp8E5M2, 60000.f}, Case{DType::kFp4E2M1x2, 7.f}}) {
    SCOPED_TRACE(std::string(dtype_name(cs.dst)));
    MxQuantConfig c;
    c.dst = cs.dst;
    MxCase t(DType::kF32, {2, 64}, c);
    std::vector<float> v(128);
    for (int i = 0; i < 128; ++i) v[i] = (i % 3 ? 0.3f : -0.9f) * cs.amax * static_cast<float>(i % 7 + 1) / 7.f;
    v[5] = cs.amax;
    v[70] = -cs.amax;
    set_values(t.x.view(), v);
    const MxRun run = t.run(c);
    EXPECT_GT(run.saturated, 0);
    EXPECT_GT(run.unsaturated, 0);
    EXPECT_EQ(run.deq[5], ref::mx_max(cs.dst)) << "scale 2^0: the block max saturates to max";
  }
  // The ceil rule never saturates.
  MxQuantConfig c;
  c.scale_alg = MxScaleAlg::kCeil;
  MxCase t(DType::kF32, {1, 64}, c);
  set_values(t.x.view(), wide_range_values(64, 32, 5, DType::kF32));
  EXPECT_EQ(t.run(c).saturated, 0);
}

TEST(DynamicMxQuant, non_finite_block_gets_nan_scale) {
  GB_REQUIRE_MX();
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MxQuantConfig c = config_of(v, 32);
    MxCase t(DType::kF32, {1, 128}, c);
    fill_uniform(t.x.view(), 9);
    t.x.view().data_as<float>()[3] = std::numeric_limits<float>::quiet_NaN();
    t.x.view().data_as<float>()[64 + 31] = -INFINITY;
    const MxRun run = t.run(c);
    EXPECT_EQ(run.scale[0], 0xff);
    EXPECT_NE(run.scale[1], 0xff);
    EXPECT_EQ(run.scale[2], 0xff);
    const uint8_t nan = v.dst == DType::kFp8E4M3FN ? 0x7f : (v.dst == DType::kFp8E5M2 ? 0x7e : 0x00);
    const int64_t per_block = is_fp4(v.dst) ? 16 : 32;
    for (int64_t i = 0; i < per_block; ++i) EXPECT_EQ(run.q[i], is_fp4(v.dst) ? 0 : nan);
    EXPECT_TRUE(std::isnan(run.deq[0]));
    EXPECT_FALSE(std::isnan(run.deq[32]));
  }
}

TEST(DynamicMxQuant, scale_exponent_clamps_to_e8m0_range) {
  GB_REQUIRE_MX();
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MxQuantConfig c = config_of(v, 32);
    MxCase t(DType::kF32, {1, 96}, c);
    std::vector<float> x(96);
    for (int i = 0; i < 32; ++i) x[i] = std::ldexp(1.f + i / 32.f, -140);               // fp32 subnormals
    for (int i = 32; i < 64; ++i) x[i] = std::ldexp(1.f + i / 64.f, 100 + i % 27);     // up to ~2^127
    for (int i = 64; i < 96; ++i) x[i] = (i % 2 ? 1 : -1) * std::numeric_limits<float>::max() / (1 + i % 3);
    set_values(t.x.view(), x);
    const MxRun run = t.run(c);
    if (v.alg != MxScaleAlg::kBiasedExponent) {
      EXPECT_EQ(run.scale[0], 0);
    }
    EXPECT_LE(run.scale[2], 254);
  }
}

// bf16 blocks whose scale exponent s runs from -124 to -109, across -112 where the kernels may switch
// encode strategy, each with bf16 subnormal elements (up to ~2^-126) that must encode exactly as their
// scaled values: zero for s >= -116, non-zero codes below.
TEST(DynamicMxQuant, tiny_bf16_blocks_around_scale_exponent_minus_112) {
  GB_REQUIRE_MX();
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const MxQuantConfig c = config_of(v, 32);
    MxCase t(DType::kBF16, {1, 512}, c);
    std::vector<float> x(512);
    for (int b = 0; b < 16; ++b) {
      const int s_target = -124 + b;
      const int e = s_target + ref::mx_emax(v.dst);  // block max exponent giving about s_target
      for (int i = 0; i < 32; ++i) {
        float val = std::ldexp(1.0f + static_cast<float>(i % 8) / 8.f, e - (i % 11));
        if (i % 3 == 1) val = std::ldexp(static_cast<float>(64 + 2 * i), -133);  // bf16 subnormals
        x[b * 32 + i] = bf16_to_float(float_to_bf16((i % 2 ? -1.f : 1.f) * val));
      }
    }
    set_values(t.x.view(), x);
    const MxRun run = t.run(c);
    if (v.alg != MxScaleAlg::kBiasedExponent) {  // that rule floors amax at 1e-4: its scales are never tiny
      EXPECT_LE(run.scale[0], 127 - 118);
      EXPECT_GE(run.scale[15], 127 - 112);
    }
  }
}

// 64 blocks per row (so the kernels' 16-blocks-at-a-time scale path runs) with designed maxima: zero,
// subnormal, exact powers of two, max(dst) * 2^k and its neighbours, values around the 1e-4 floor of
// the biased-exponent rule, huge values, NaN and infinity; every convention and input dtype.
TEST(DynamicMxQuant, block_maxima_sweep) {
  GB_REQUIRE_MX();
  std::vector<float> maxima{0.f, std::ldexp(1.f, -130), std::ldexp(1.f, -20), 6e-5f, 1e-4f, 1.5e-4f, 1.f, 2.f,
                            3.f, 6.f, 7.f, 448.f, 464.f, 480.f, 500.f, 57344.f, 61440.f, 1e30f, -3.5f, 0.75f};
  for (int k = -12; k <= 12; k += 3) {
    for (float base : {448.f, 57344.f, 6.f}) {
      maxima.push_back(std::ldexp(base, k));
      maxima.push_back(std::nextafter(std::ldexp(base, k), 1e38f));
    }
  }
  maxima.push_back(std::numeric_limits<float>::quiet_NaN());
  maxima.push_back(-INFINITY);
  while (maxima.size() < 64) maxima.push_back(std::ldexp(1.3f, static_cast<int>(maxima.size()) - 40));
  maxima.resize(64);
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(std::string(v.name) + " " + std::string(dtype_name(d)));
      const MxQuantConfig c = config_of(v, 32);
      MxCase t(d, {2, 64 * 32}, c);
      std::vector<float> x(2 * 64 * 32);
      for (int r = 0; r < 2; ++r) {
        for (int b = 0; b < 64; ++b) {
          const float m = maxima[(b + 17 * r) % 64];  // row 1 rotates the maxima across the 16-block groups
          for (int i = 0; i < 32; ++i) {
            const float f = i == (b % 32) ? 1.f : static_cast<float>((i * 7) % 16) / 16.f;
            x[(r * 64 + b) * 32 + i] = round_like((i % 2 ? -1.f : 1.f) * m * f, d);
          }
        }
      }
      set_values(t.x.view(), x);
      t.run(c);
    }
  }
}

TEST(DynamicMxQuant, strided_input_and_outputs) {
  GB_REQUIRE_MX();
  for (const Variant& v : {kVariants[0], kVariants[5], kVariants[8]}) {
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(v.name) + " " + std::string(dtype_name(d)));
      const std::vector<int64_t> shape{2, 3, 160};
      const MxQuantConfig c = config_of(v, 64);  // 3 blocks: 2 pairs, one padding byte per row
      OwnedTensor xs(d, {2 * 2 * 3 * 160 + 64}), qs(v.dst, {2 * 2 * 3 * 160 + 64}), ss(DType::kE8M0, {6 * 4 * 2 * 2 + 64});
      const TensorView x = column_strided(xs, d, shape);
      const TensorView q = column_strided(qs, v.dst, q_shape(shape, v.dst));
      const TensorView s = TensorView::strided(ss.data(), DType::kE8M0, {2, 3, 2, 2},
                                               {3 * 16, 16, 5, 2});
      set_values(x, wide_range_values(x.numel(), 64, 31, d));
      run_and_check(x, xs, c, q, s);
    }
  }
}

TEST(DynamicMxQuant, empty_inputs) {
  GB_REQUIRE_MX();
  MxQuantConfig c;
  {
    MxCase t(DType::kBF16, {0, 64}, c);
    EXPECT_TRUE(ops::dynamic_mx_quant(t.x.view(), c, t.q.view(), t.scale.view()).ok());
  }
  {
    MxCase t(DType::kBF16, {2, 0}, c);  // no blocks: scale [2, 0, 2]
    EXPECT_TRUE(ops::dynamic_mx_quant(t.x.view(), c, t.q.view(), t.scale.view()).ok());
  }
}

std::vector<uint8_t> run_bits(int threads, const Variant& v) {
  set_num_threads(threads);
  const MxQuantConfig c = config_of(v, 32);
  MxCase t(DType::kBF16, {37, 2048}, c);
  set_values(t.x.view(), wide_range_values(37 * 2048, 32, 41, DType::kBF16));
  EXPECT_TRUE(ops::dynamic_mx_quant(t.x.view(), c, t.q.view(), t.scale.view()).ok());
  set_num_threads(0);
  std::vector<uint8_t> out = logical_bytes(t.q.view());
  const auto s = logical_bytes(t.scale.view());
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

TEST(DynamicMxQuant, bit_identical_across_thread_counts) {
  GB_REQUIRE_MX();
  for (const Variant& v : {kVariants[0], kVariants[8]}) {
    const auto one = run_bits(1, v);
    EXPECT_EQ(one, run_bits(2, v));
    EXPECT_EQ(one, run_bits(3, v));
  }
}

TEST(DynamicMxQuant, invalid_arguments) {
  GB_REQUIRE_MX();
  const std::string op = "dynamic_mx_quant";
  OwnedTensor xs(DType::kBF16, {2, 64}), qs(DType::kFp8E4M3FN, {2, 64}), ss(DType::kE8M0, {2, 1, 2});
  fill_uniform(xs.view(), 1);
  fill_bytes(qs.view(), 2);
  fill_bytes(ss.view(), 3);
  const TensorView x = xs.view(), q = qs.view(), s = ss.view();
  auto expect = [&](const std::string& message, TensorView xv, const MxQuantConfig& c, TensorView qv, TensorView sv) {
    const auto q_before = qs.bytes(), s_before = ss.bytes();
    const Status st = ops::dynamic_mx_quant(xv, c, qv, sv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(qs.bytes(), q_before) << "q written on error: " << message;
    EXPECT_EQ(ss.bytes(), s_before) << "scale written on error: " << message;
  };
  const MxQuantConfig ok;
  auto with = [](auto f) {
    MxQuantConfig c;
    f(c);
    return c;
  };
  std::vector<int8_t> i8(128);
  expect(op + ": x has dtype int8 but must be fp32, fp16 or bf16", TensorView(i8.data(), DType::kI8, {2, 64}), ok, q, s);
  expect(op + ": x has rank 0 but must have rank >= 1 (the op works along the last dimension)",
         TensorView(xs.data(), DType::kBF16, {}), ok, q, s);
  for (int64_t b : {0, 16, 48, 2048, -32}) {
    expect(op + ": block_size is " + std::to_string(b) + " but must be a multiple of 32 in [32, 1024]", x,
           with([&](MxQuantConfig& c) { c.block_size = b; }), q, s);
  }
  expect(op + ": dst is int8 but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2", x,
         with([](MxQuantConfig& c) { c.dst = DType::kI8; }), q, s);
  expect(op + ": scale_alg is 7 but must be 0 (OCP floor), 1 (ceil) or 2 (biased exponent)", x,
         with([](MxQuantConfig& c) { c.scale_alg = static_cast<MxScaleAlg>(7); }), q, s);
  OwnedTensor q4s(DType::kFp4E2M1x2, {2, 32});
  const TensorView q4 = q4s.view();
  expect(op + ": scale_alg is 1 (ceil) but dst is fp4_e2m1x2; the ceil convention is defined for FP8 destinations only",
         x, with([](MxQuantConfig& c) { c.dst = DType::kFp4E2M1x2; c.scale_alg = MxScaleAlg::kCeil; }), q4, s);
  expect(op + ": round_scale is set but scale_alg is 0; round_scale applies to scale_alg 2 (biased exponent) only", x,
         with([](MxQuantConfig& c) { c.round_scale = true; }), q, s);
  expect(op + ": x's last dimension is 63 but must be even for fp4_e2m1x2 (two values per byte)",
         TensorView(xs.data(), DType::kBF16, {2, 63}), with([](MxQuantConfig& c) { c.dst = DType::kFp4E2M1x2; }), q4, s);
  expect(op + ": q has dtype fp8_e5m2 but must be fp8_e4m3fn (config.dst)", x, ok,
         TensorView(qs.data(), DType::kFp8E5M2, {2, 64}), s);
  expect(op + ": q has shape [2, 63] but must be [2, 64] (x's shape)", x, ok,
         TensorView(qs.data(), DType::kFp8E4M3FN, {2, 63}), s);
  expect(op + ": q has shape [2, 64] but must be [2, 32] (x's shape with the last dimension halved: two fp4 values "
              "per byte)",
         x, with([](MxQuantConfig& c) { c.dst = DType::kFp4E2M1x2; }), TensorView(qs.data(), DType::kFp4E2M1x2, {2, 64}), s);
  expect(op + ": scale has dtype uint8 but must be e8m0", x, ok, q, TensorView(ss.data(), DType::kU8, {2, 1, 2}));
  expect(op + ": scale has shape [1, 1, 2] but must be [2, 1, 2] (x's leading shape + [ceil(ceil(K / block_size) / 2), "
              "2] for K = 64, block_size = 32)",
         x, ok, q, TensorView(ss.data(), DType::kE8M0, {1, 1, 2}));
  expect(op + ": scale has shape [2, 2] but must be [2, 1, 2] (x's leading shape + [ceil(ceil(K / block_size) / 2), "
              "2] for K = 64, block_size = 32)",
         x, ok, q, TensorView(ss.data(), DType::kE8M0, {2, 2}));
  expect(op + ": x has a null data pointer but 128 elements", TensorView(nullptr, DType::kBF16, {2, 64}), ok, q, s);
  expect(op + ": scale has a null data pointer but 4 elements", x, ok, q, TensorView(nullptr, DType::kE8M0, {2, 1, 2}));
}

// docs/design.md#provider-staging: the Ascend910 tree carries the explicit unsupported provider; on Ascend950 the same
// call works.
TEST(DynamicMxQuant, unsupported_provider) {
  OwnedTensor x(DType::kBF16, {2, 64}), q(DType::kFp8E4M3FN, {2, 64}), s(DType::kE8M0, {2, 1, 2});
  fill_uniform(x.view(), 1);
  std::memset(q.data(), 0xaa, q.bytes().size());
  std::memset(s.data(), 0xaa, s.bytes().size());
  const auto q_before = q.bytes(), s_before = s.bytes();
  const Status st = ops::dynamic_mx_quant(x.view(), MxQuantConfig{}, q.view(), s.view());
  if (ops::build_target() == "Ascend910") {
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(st.message(),
              "dynamic_mx_quant is not supported on Ascend910 (A2/A3): the generation has no FP8/FP4/E8M0 data path; "
              "MX quantization is an Ascend950 capability");
    EXPECT_EQ(q.bytes(), q_before);
    EXPECT_EQ(s.bytes(), s_before);
    // Unsupported means unsupported: invalid arguments get the same answer.
    MxQuantConfig bad;
    bad.block_size = 7;
    EXPECT_EQ(ops::dynamic_mx_quant(x.view(), bad, q.view(), s.view()).code(), StatusCode::kUnimplemented);
  } else {
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

}  // namespace
}  // namespace genbridge::testing
