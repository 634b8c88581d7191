// linear/quant_linear's MX schemes, exhaustively: every fp8 e4m3fn byte (256) and every fp4 e2m1 code (16) under
// every E8M0 scale (256, 0xFF = NaN) with one input row (fp4: also 16), and with 3, 15, 16, 64 and 160 rows on
// the scales around the fast decode's limits, goes through the kernels' fast decodes (the GEMV for few rows, the
// GEMM panels for many: from 16 rows, or past mx_fused_max_rows where a target sets it higher) on every CPU target. Weight row (s, c) holds code c once, at a position that walks over
// whole 64-element blocks, the 16-element chunk after them and the tail (K = 85 / 86), with zeros elsewhere;
// x rows of ones then give y = the decoded weight itself (a -0 comes out +0: the sum starts at +0). Checked
// against the scalar decoder (core/formats tables: fl32(element * 2^(s - 127))), the fp64 reference, and bit
// for bit against linear/linear on the decoded fp32 weight (the contract), NaN payloads included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "ops/common/linear/quant_linear_ref.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

using ops::WeightQuantScheme;

bool has_mx() { return ops::build_target() == std::string_view("Ascend950"); }

uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct Case {
  WeightQuantScheme scheme;
  int64_t K;
  int codes;  // 256 (fp8) or 16 (fp4)
};

// Rows (s, c) for s in `scales`, c < codes, plus one zero row (an odd N: a remainder tile). Row r's code sits at
// k = (37 * c + s) % K.
struct Weight {
  int64_t N, K;
  OwnedTensor data, scale;
  std::vector<uint8_t> q, sc;  // the bytes, for the reference
};

Weight make_weight(const Case& cs, const std::vector<int>& scales) {
  const bool fp4 = cs.scheme == WeightQuantScheme::kMxfp4;
  const int64_t N = static_cast<int64_t>(scales.size()) * cs.codes + 1, K = cs.K;
  const int64_t row_bytes = fp4 ? K / 2 : K, pairs = ops::mx_scale_pairs_of(K);
  Weight w{N,
           K,
           OwnedTensor(fp4 ? DType::kFp4E2M1x2 : DType::kFp8E4M3FN, {N, row_bytes}),
           OwnedTensor(DType::kE8M0, {N, pairs, 2}),
           {},
           {}};
  w.q.assign(static_cast<size_t>(N * row_bytes), 0);
  w.sc.assign(static_cast<size_t>(N * pairs * 2), 0);
  for (size_t si = 0; si < scales.size(); ++si) {
    for (int c = 0; c < cs.codes; ++c) {
      const int64_t r = static_cast<int64_t>(si) * cs.codes + c, k = (37 * c + scales[si]) % K;
      if (fp4) {
        w.q[r * row_bytes + k / 2] = static_cast<uint8_t>(k % 2 ? c << 4 : c);
      } else {
        w.q[r * row_bytes + k] = static_cast<uint8_t>(c);
      }
      for (int64_t j = 0; j < 2 * pairs; ++j) w.sc[r * pairs * 2 + j] = static_cast<uint8_t>(scales[si]);
    }
  }
  std::memcpy(w.data.data(), w.q.data(), w.q.size());
  std::memcpy(w.scale.data(), w.sc.data(), w.sc.size());
  return w;
}

// The scalar decoder's value of row r (its one code; 0 for the zero row).
float scalar_value(const Case& cs, const std::vector<int>& scales, int64_t r) {
  if (r >= static_cast<int64_t>(scales.size()) * cs.codes) return 0.f;
  const int s = scales[r / cs.codes], c = static_cast<int>(r % cs.codes);
  const float e = cs.scheme == WeightQuantScheme::kMxfp4 ? fp4_e2m1_to_float(static_cast<uint8_t>(c))
                                                         : fp8_e4m3fn_to_float(fp8_e4m3fn_t{static_cast<uint8_t>(c)});
  return e * e8m0_to_float(e8m0_t{static_cast<uint8_t>(s)});
}

void check(const Case& cs, const std::vector<int>& scales, std::initializer_list<int64_t> rows) {
  const bool fp4 = cs.scheme == WeightQuantScheme::kMxfp4;
  Weight w = make_weight(cs, scales);
  const int64_t N = w.N, K = w.K;
  const ops::QuantWeight qw{cs.scheme, w.data.view(), w.scale.view(), K};
  // The decoded fp32 weight (scalar decoder) for linear/linear, and the fp64 reference's values.
  const std::vector<double> ref = ref::mx_weight_values(w.q, w.sc, N, K, fp4 ? DType::kFp4E2M1x2 : DType::kFp8E4M3FN);
  OwnedTensor wf(DType::kF32, {N, K});
  auto* wfp = reinterpret_cast<float*>(wf.data());
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t b =
          fp4 ? static_cast<uint8_t>(k % 2 ? w.q[r * (K / 2) + k / 2] >> 4 : w.q[r * (K / 2) + k / 2] & 0xF)
              : w.q[r * K + k];
      const uint8_t s = w.sc[r * ops::mx_scale_pairs_of(K) * 2 + k / 32];
      wfp[r * K + k] = (fp4 ? fp4_e2m1_to_float(b) : fp8_e4m3fn_to_float(fp8_e4m3fn_t{b})) * e8m0_to_float(e8m0_t{s});
      const float rf = static_cast<float>(ref[r * K + k]);
      ASSERT_TRUE(float_bits(rf) == float_bits(wfp[r * K + k]) || (std::isnan(rf) && std::isnan(wfp[r * K + k])))
          << "scalar decoder vs fp64 reference, row " << r << " k " << k;
    }
  }
  for (int64_t M : rows) {
    OwnedTensor x(DType::kF32, {M, K});
    for (int64_t i = 0; i < M * K; ++i) reinterpret_cast<float*>(x.data())[i] = 1.f;
    OwnedTensor want(DType::kF32, {M, N});
    ASSERT_TRUE(ops::linear(x.view(), wf.view(), want.view()).ok());
    for_each_cpu_target([&](const std::string& target) {
      OwnedTensor y(DType::kF32, {M, N});
      ASSERT_TRUE(ops::quant_linear(x.view(), qw, y.view()).ok());
      const auto* yp = reinterpret_cast<const float*>(y.data());
      int bad = 0;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t r = 0; r < N; ++r) {
          const float got = yp[m * N + r], exp = scalar_value(cs, scales, r);
          const bool same =
              float_bits(got) == float_bits(exp) || (got == 0.f && exp == 0.f) || (std::isnan(got) && std::isnan(exp));
          if (!same && bad++ < 5) {
            ADD_FAILURE() << target << " M=" << M << " row " << r << " (scale " << scales[r / cs.codes] << ", code "
                          << r % cs.codes << "): " << got << " vs " << exp;
          }
        }
      }
      EXPECT_EQ(bad, 0);
      // The contract: the bits of linear/linear on the decoded weight (on the same CPU target).
      OwnedTensor y2(DType::kF32, {M, N});
      ASSERT_TRUE(ops::linear(x.view(), wf.view(), y2.view()).ok());
      const auto* y2p = reinterpret_cast<const float*>(y2.data());
      int diff = 0;
      for (int64_t i = 0; i < M * N; ++i) {
        if (float_bits(yp[i]) != float_bits(y2p[i]) && diff++ < 5) {
          ADD_FAILURE() << target << " M=" << M << " row " << i % N << " (scale " << scales[(i % N) / cs.codes]
                        << ", code " << (i % N) % cs.codes << "): bits " << std::hex << float_bits(yp[i])
                        << " vs linear's " << float_bits(y2p[i]) << std::dec;
        }
      }
    });
  }
}

std::vector<int> all_scales() {
  std::vector<int> s(256);
  for (int i = 0; i < 256; ++i) s[i] = i;
  return s;
}
// Scales around the fast fp8 decode's limits (2^(s - 7) normal: s <= 134), the extremes and NaN.
const std::vector<int> kEdgeScales = {0, 1, 7, 8, 100, 127, 133, 134, 135, 136, 200, 254, 255};

TEST(MxGemvExhaustive, fp8_every_byte_every_scale) {
  if (!has_mx()) GTEST_SKIP() << "no MX data path in this build";
  const Case cs{WeightQuantScheme::kMxfp8, 85, 256};  // one 64-block, one 16-chunk, a tail of 5
  check(cs, all_scales(), {1});
  check(cs, kEdgeScales, {3, 15, 16, 64, 160});
}

TEST(MxGemvExhaustive, fp4_every_code_every_scale) {
  if (!has_mx()) GTEST_SKIP() << "no MX data path in this build";
  const Case cs{WeightQuantScheme::kMxfp4, 86, 16};  // two 32-blocks, one 16-chunk, a tail of 6
  check(cs, all_scales(), {1, 16});
  check(cs, kEdgeScales, {3, 15, 64, 160});
}

}  // namespace
}  // namespace genbridge::testing
