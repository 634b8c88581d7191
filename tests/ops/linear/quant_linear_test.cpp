// Contract test for linear/quant_linear and quantize_weight; runs unchanged in every target
// build. W8A8 is checked bit for bit against its integer oracle; the MX schemes against the fp64 product
// of the decoded weights (and bit for bit against linear/linear with the decoded fp32 weight, which the
// contract names); every scheme for batch invariance, thread-count independence and the same bits on every
// CPU target. A generation without a scheme's data path returns Unimplemented naming it.
#include "genbridge/ops/linear/quant_linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/threading.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"
#include "ops/common/linear/linear_ref.h"
#include "ops/common/linear/quant_linear_ref.h"
#include "ops/common/quant/quant_ref.h"
#include "support/each_cpu_target.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

using ops::QuantWeight;
using ops::WeightQuantScheme;

bool has_mx() { return ops::build_target() == std::string_view("Ascend950"); }

// A quantized weight with owned storage.
struct OwnedQuantWeight {
  WeightQuantScheme scheme;
  int64_t N, K;
  OwnedTensor data, scale;
  OwnedQuantWeight(WeightQuantScheme s, int64_t n, int64_t k)
      : scheme(s),
        N(n),
        K(k),
        data(s == WeightQuantScheme::kW8A8    ? DType::kI8
             : s == WeightQuantScheme::kMxfp8 ? DType::kFp8E4M3FN
                                              : DType::kFp4E2M1x2,
             {n, s == WeightQuantScheme::kMxfp4 ? k / 2 : k}),
        scale(s == WeightQuantScheme::kW8A8 ? DType::kF32 : DType::kE8M0,
              s == WeightQuantScheme::kW8A8 ? std::vector<int64_t>{n}
                                            : std::vector<int64_t>{n, ops::mx_scale_pairs(k, 32), 2}) {}
  QuantWeight view() { return {scheme, data.view(), scale.view(), K}; }
  template <typename T>
  std::vector<T> data_vec() {
    const auto* p = reinterpret_cast<const T*>(data.data());
    const int64_t n = N * (scheme == WeightQuantScheme::kMxfp4 ? K / 2 : K);
    return std::vector<T>(p, p + n);
  }
  std::vector<uint8_t> scale_bytes() {
    const auto* p = reinterpret_cast<const uint8_t*>(scale.data());
    return std::vector<uint8_t>(p, p + N * ops::mx_scale_pairs(K, 32) * 2);
  }
};

// A dense weight [N, K] quantized with quantize_weight.
OwnedQuantWeight make_weight(WeightQuantScheme s, int64_t N, int64_t K, uint64_t seed,
                             OwnedTensor* dense_out = nullptr) {
  OwnedTensor w(DType::kBF16, {N, K});
  fill_uniform(w.view(), seed, -0.5f, 0.5f);
  OwnedQuantWeight q(s, N, K);
  const Status st = ops::quantize_weight(w.view(), q.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  if (dense_out) *dense_out = w;
  return q;
}

std::vector<WeightQuantScheme> runnable_schemes() {
  if (has_mx()) return {WeightQuantScheme::kW8A8, WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4};
  return {WeightQuantScheme::kW8A8};
}

struct Problem {
  int64_t M, N, K;
};
const Problem kProblems[] = {{1, 1, 32}, {1, 70, 2048}, {3, 17, 96}, {8, 100, 256}, {37, 29, 1000}, {70, 40, 160}};

std::string tag(Problem p) {
  return "M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K);
}

TEST(QuantLinear, w8a8_is_bit_exact_to_the_integer_oracle) {
  for (DType xd : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Problem p : kProblems) {
      SCOPED_TRACE(tag(p) + " x " + std::string(dtype_name(xd)));
      OwnedTensor dense(DType::kBF16, {1});
      OwnedQuantWeight w = make_weight(WeightQuantScheme::kW8A8, p.N, p.K, p.K, &dense);
      // The weight is dynamic_quant_per_token of the dense rows (per output channel).
      std::vector<int8_t> ref_q;
      std::vector<float> ref_s;
      ref::dynamic_quant_per_token(to_doubles(dense.view()), p.N, p.K, ops::kDynamicQuantPerTokenDefaultEps, ref_q,
                                   ref_s);
      ASSERT_EQ(w.data_vec<int8_t>(), ref_q);
      const std::vector<float> sw(reinterpret_cast<const float*>(w.scale.data()),
                                  reinterpret_cast<const float*>(w.scale.data()) + p.N);
      ASSERT_EQ(sw, ref_s);

      OwnedTensor x(xd, {p.M, p.K}), y(DType::kF32, {p.M, p.N});
      fill_uniform(x.view(), p.M + 7, -2.f, 2.f);
      const auto x_before = x.bytes();
      const Status st = ops::quant_linear(x.view(), w.view(), y.view());
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_EQ(x.bytes(), x_before);
      std::vector<float> want;
      ref::w8a8_linear(to_doubles(x.view()), ref_q, ref_s, p.M, p.N, p.K, want);
      ASSERT_EQ(std::memcmp(y.data(), want.data(), want.size() * sizeof(float)), 0);
    }
  }
}

TEST(QuantLinear, mx_matches_fp64_and_linear_on_the_decoded_weight) {
  if (!has_mx()) GTEST_SKIP() << "no MX data path in this build (see unsupported_schemes_are_unimplemented)";
  for (WeightQuantScheme s : {WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4}) {
    const DType element = s == WeightQuantScheme::kMxfp8 ? DType::kFp8E4M3FN : DType::kFp4E2M1x2;
    for (Problem p : kProblems) {
      SCOPED_TRACE(tag(p) + " " + std::string(ops::weight_quant_scheme_name(s)));
      OwnedTensor dense(DType::kBF16, {1});
      OwnedQuantWeight w = make_weight(s, p.N, p.K, p.K + 1, &dense);
      // quantize_weight = dynamic_mx_quant with the scheme's documented scale rule, pair layout.
      ops::MxQuantConfig c;
      c.dst = element;
      c.scale_alg = s == WeightQuantScheme::kMxfp8 ? ops::MxScaleAlg::kCeil : ops::MxScaleAlg::kOcpFloor;
      std::vector<uint8_t> rq, rs;
      ref::dynamic_mx_quant(to_doubles(dense.view()), p.N, p.K, c, rq, rs);
      ASSERT_EQ(w.data_vec<uint8_t>(), rq);
      ASSERT_EQ(w.scale_bytes(), rs);

      for (DType yd : {DType::kF32, DType::kBF16}) {
        OwnedTensor x(DType::kBF16, {p.M, p.K}), y(yd, {p.M, p.N});
        fill_uniform(x.view(), p.M + 3, -2.f, 2.f);
        ASSERT_TRUE(ops::quant_linear(x.view(), w.view(), y.view()).ok());
        std::vector<double> ref, abs_sum;
        ref::linear(to_doubles(x.view()), ref::mx_weight_values(rq, rs, p.N, p.K, element), nullptr, p.M, p.N, p.K, ref,
                    abs_sum);
        const std::vector<double> got = to_doubles(y.view());
        int bad = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          const double tol = dot_error_bound(p.K, abs_sum[i]) + rounding_bound(yd, ref[i]);
          if (!(std::abs(got[i] - ref[i]) <= tol) && bad++ < 5)
            ADD_FAILURE() << i << ": " << got[i] << " vs " << ref[i];
        }
        EXPECT_EQ(bad, 0);
        if (yd != DType::kF32) continue;
        // linear/linear with the decoded fp32 weight gives the same bits (the contract's definition).
        OwnedTensor wf(DType::kF32, {p.N, p.K}), y2(DType::kF32, {p.M, p.N});
        const std::vector<double> wv = ref::mx_weight_values(rq, rs, p.N, p.K, element);
        for (size_t i = 0; i < wv.size(); ++i) reinterpret_cast<float*>(wf.data())[i] = static_cast<float>(wv[i]);
        ASSERT_TRUE(ops::linear(x.view(), wf.view(), y2.view()).ok());
        EXPECT_EQ(y.bytes(), y2.bytes());
      }
    }
  }
}

// Every fp8 / fp4 code under several scales decodes exactly (y = x . w with one-hot x rows is the decoded
// weight itself), through the GEMV (few rows) and GEMM (many rows) paths, on every CPU target.
TEST(QuantLinear, mx_decodes_every_code_exactly_on_every_cpu_target) {
  if (!has_mx()) GTEST_SKIP() << "no MX data path in this build";
  const int64_t N = 8, K = 256;
  const uint8_t kScales[] = {0, 1, 64, 120, 127, 134, 200, 244};  // 448 * 2^117 < FLT_MAX: no inf (0 * inf = NaN)
  for (WeightQuantScheme s : {WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4}) {
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(s)));
    const bool fp4 = s == WeightQuantScheme::kMxfp4;
    OwnedQuantWeight w(s, N, K);
    auto* q = reinterpret_cast<uint8_t*>(w.data.data());
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t i = 0; i < (fp4 ? K / 2 : K); ++i) {
        uint8_t c = static_cast<uint8_t>((i * (fp4 ? 3 : 1) + 37 * n) % 256);
        if (!fp4 && (c & 0x7f) == 0x7f) c = 0;  // NaN codes make the whole output NaN (0 * NaN)
        q[n * (fp4 ? K / 2 : K) + i] = c;
      }
      auto* sc = reinterpret_cast<uint8_t*>(w.scale.data()) + n * 8;
      for (int j = 0; j < 8; ++j) sc[j] = kScales[(j + n) % 8];
    }
    const std::vector<double> want = ref::mx_weight_values(w.data_vec<uint8_t>(), w.scale_bytes(), N, K,
                                                           fp4 ? DType::kFp4E2M1x2 : DType::kFp8E4M3FN);
    for (int64_t M : {int64_t{1}, int64_t{3}, K}) {
      OwnedTensor x(DType::kF32, {M, K});
      std::vector<int64_t> hot(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) {
        hot[m] = M == K ? m : (m * 101 + 5) % K;
        reinterpret_cast<float*>(x.data())[m * K + hot[m]] = 1.f;
      }
      for_each_cpu_target([&](const std::string& target) {
        OwnedTensor y(DType::kF32, {M, N});
        ASSERT_TRUE(ops::quant_linear(x.view(), w.view(), y.view()).ok());
        int bad = 0;
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            const float got = reinterpret_cast<const float*>(y.data())[m * N + n];
            const float exp = static_cast<float>(want[n * K + hot[m]]);
            if (std::memcmp(&got, &exp, 4) != 0 && !(got == 0.f && exp == 0.f) && bad++ < 5) {
              ADD_FAILURE() << target << " M=" << M << " w[" << n << ", " << hot[m] << "]: " << got << " vs " << exp;
            }
          }
        }
      });
    }
  }
}

// Each row's bits do not depend on the other rows, the thread count or the CPU target.
TEST(QuantLinear, batch_invariant_thread_count_and_cpu_target_independent) {
  const int threads = num_threads();
  for (WeightQuantScheme s : runnable_schemes()) {
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(s)));
    const int64_t M = 40, N = 67, K = 352;  // K: 11 blocks of 32 (odd pair count), tails of 16
    OwnedQuantWeight w = make_weight(s, N, K, 5);
    OwnedTensor x(DType::kBF16, {M, K});
    fill_uniform(x.view(), 11, -3.f, 3.f);
    std::vector<std::byte> first;
    for_each_cpu_target([&](const std::string& target) {
      for (int t : {1, 2}) {
        set_num_threads(t);
        OwnedTensor y(DType::kF32, {M, N});
        ASSERT_TRUE(ops::quant_linear(x.view(), w.view(), y.view()).ok());
        if (first.empty()) first = y.bytes();
        EXPECT_EQ(y.bytes(), first) << target << " threads " << t;
        for (int64_t r : {int64_t{0}, int64_t{17}, M - 1}) {  // each row alone, and in a 5-row batch
          OwnedTensor y1(DType::kF32, {1, N}), y5(DType::kF32, {5, N});
          const TensorView xr = x.view().slice0(r, r + 1);
          ASSERT_TRUE(ops::quant_linear(xr, w.view(), y1.view()).ok());
          EXPECT_EQ(std::memcmp(y1.data(), first.data() + r * N * 4, N * 4), 0) << "row " << r;
          const int64_t r0 = std::min<int64_t>(r, M - 5);
          ASSERT_TRUE(ops::quant_linear(x.view().slice0(r0, r0 + 5), w.view(), y5.view()).ok());
          EXPECT_EQ(std::memcmp(y5.data(), first.data() + r0 * N * 4, 5 * N * 4), 0) << "rows " << r0;
        }
      }
    });
  }
  set_num_threads(threads);
}

TEST(QuantLinear, unsupported_schemes_are_unimplemented) {
  if (has_mx()) GTEST_SKIP() << "this build has the MX data path";
  for (WeightQuantScheme s : {WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4}) {
    OwnedQuantWeight w(s, 4, 64);
    OwnedTensor x(DType::kBF16, {1, 64}), y(DType::kF32, {1, 4}), dense(DType::kBF16, {4, 64});
    const Status st = ops::quant_linear(x.view(), w.view(), y.view());
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(st.message(), "quant_linear: " + std::string(ops::weight_quant_scheme_name(s)) +
                                " weights are not supported on Ascend910 (A2/A3): the generation has no data path for "
                                "them (it runs w8a8 only; MX weights are an Ascend950 capability)");
    EXPECT_EQ(ops::quantize_weight(dense.view(), w.view()).code(), StatusCode::kUnimplemented);
  }
}

TEST(QuantLinear, invalid_arguments) {
  OwnedQuantWeight w(WeightQuantScheme::kW8A8, 4, 64);
  OwnedTensor x(DType::kBF16, {2, 64}), y(DType::kF32, {2, 4}), x63(DType::kBF16, {2, 63}), y5(DType::kF32, {2, 5});
  QuantWeight bad_k = w.view();
  bad_k.in_features = 63;
  EXPECT_EQ(ops::quant_linear(x63.view(), w.view(), y.view()).message(),
            "quant_linear: the weight has 64 input features but x's last dimension is 63");
  EXPECT_EQ(ops::quant_linear(x.view(), bad_k, y.view()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ops::quant_linear(x.view(), w.view(), y5.view()).code(), StatusCode::kInvalidArgument);
  QuantWeight none = w.view();
  none.scheme = WeightQuantScheme::kNone;
  EXPECT_EQ(ops::quant_linear(x.view(), none, y.view()).message(),
            "quant_linear: scheme none has no quantized representation (use linear)");
  if (!has_mx()) return;
  // The MX scale must be in the pair layout: a flat [N, K / 32] scale is refused.
  OwnedQuantWeight mx(WeightQuantScheme::kMxfp8, 4, 64);
  OwnedTensor flat(DType::kE8M0, {4, 2});
  QuantWeight f = mx.view();
  f.scale = flat.view();
  const Status st = ops::quant_linear(x.view(), f, y.view());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("pair layout"), std::string::npos) << st.message();
}

// The pair layout quant_linear reads is quant/normalize_mx_scale_layout's: flat per-block scales [N, K / 32]
// normalized give exactly the scale bytes quantize_weight wrote, and the same y.
TEST(QuantLinear, mx_scales_are_normalize_mx_scale_layouts_pair_layout) {
  if (!has_mx()) GTEST_SKIP() << "no MX data path in this build";
  const int64_t N = 5, K = 160;  // 5 blocks: an odd count, so a padding byte per row
  OwnedQuantWeight w = make_weight(WeightQuantScheme::kMxfp8, N, K, 21);
  const std::vector<uint8_t> pair = w.scale_bytes();
  const int64_t pairs = ops::mx_scale_pairs(K, 32), blocks = K / 32;
  OwnedTensor flat(DType::kE8M0, {N, blocks}), normalized(DType::kE8M0, {N, pairs, 2});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < blocks; ++j)
      reinterpret_cast<uint8_t*>(flat.data())[n * blocks + j] = pair[n * pairs * 2 + j];
  ASSERT_TRUE(ops::normalize_mx_scale_layout(flat.view(), normalized.view()).ok());
  EXPECT_EQ(std::memcmp(normalized.data(), pair.data(), pair.size()), 0);
  OwnedTensor x(DType::kBF16, {2, K}), y1(DType::kF32, {2, N}), y2(DType::kF32, {2, N});
  fill_uniform(x.view(), 3);
  QuantWeight wn = w.view();
  wn.scale = normalized.view();
  ASSERT_TRUE(ops::quant_linear(x.view(), w.view(), y1.view()).ok());
  ASSERT_TRUE(ops::quant_linear(x.view(), wn, y2.view()).ok());
  EXPECT_EQ(y1.bytes(), y2.bytes());
}

TEST(QuantLinear, empty_and_zero_k) {
  for (WeightQuantScheme s : runnable_schemes()) {
    OwnedQuantWeight w(s, 3, 0);
    OwnedTensor x(DType::kF32, {2, 0}), y(DType::kF32, {2, 3});
    std::vector<float> ones(6, 1.f);
    std::memcpy(y.data(), ones.data(), 24);
    ASSERT_TRUE(ops::quant_linear(x.view(), w.view(), y.view()).ok());
    for (int i = 0; i < 6; ++i) EXPECT_EQ(reinterpret_cast<float*>(y.data())[i], 0.f);
  }
}

}  // namespace
}  // namespace genbridge::testing
