// Contract test for linear/linear; runs unchanged in every target build.
#include "genbridge/ops/linear/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/linear/linear_ref.h"
#include "support/each_cpu_target.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

struct Problem {
  int64_t M, N, K;
};

std::string dtype_tag(DType d) { return std::string(dtype_name(d)); }

// Checks y (any layout) against the fp64 oracle; returns the number of violations.
int64_t check_against_reference(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& y,
                                int64_t M, int64_t N, int64_t K) {
  std::vector<double> ref, abs_sum;
  std::vector<double> bv;
  if (bias) bv = to_doubles(*bias);
  ref::linear(to_doubles(x), to_doubles(w), bias ? &bv : nullptr, M, N, K, ref, abs_sum);
  const std::vector<double> got = to_doubles(y);
  int64_t bad = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    const double tol = dot_error_bound(K, abs_sum[i]) + rounding_bound(y.dtype(), ref[i]);
    if (!(std::abs(got[i] - ref[i]) <= tol)) {
      if (bad < 5) ADD_FAILURE() << "y[" << i / N << ", " << i % N << "] = " << got[i] << ", fp64 " << ref[i];
      ++bad;
    }
  }
  return bad;
}

// Runs linear on fresh seeded contiguous tensors and checks it against the oracle and that inputs are unmutated.
void run_and_check(DType xd, DType wd, DType yd, Problem p, bool with_bias = false, uint64_t seed = 1) {
  OwnedTensor x(xd, {p.M, p.K}), w(wd, {p.N, p.K}), y(yd, {p.M, p.N}), b(DType::kF32, {p.N});
  fill_uniform(x.view(), seed, -2.f, 2.f);
  fill_uniform(w.view(), seed + 1, -0.5f, 0.5f);
  fill_uniform(b.view(), seed + 2, -1.f, 1.f);
  const auto x_before = x.bytes(), w_before = w.bytes(), b_before = b.bytes();
  const TensorView bv = b.view();
  const Status st = ops::linear(x.view(), w.view(), y.view(), with_bias ? &bv : nullptr);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(x.bytes(), x_before) << "x was mutated";
  EXPECT_EQ(w.bytes(), w_before) << "w was mutated";
  EXPECT_EQ(b.bytes(), b_before) << "bias was mutated";
  EXPECT_EQ(check_against_reference(x.view(), w.view(), with_bias ? &bv : nullptr, y.view(), p.M, p.N, p.K), 0);
}

class LinearContract : public ::testing::TestWithParam<std::tuple<DType, DType, DType>> {};

TEST_P(LinearContract, matches_fp64_reference) {
  const auto [xd, wd, yd] = GetParam();
  // Decode (1..8 rows), odd sizes, K tails of every length class, several row blocks and column chunks.
  for (Problem p : {Problem{1, 1, 1}, Problem{1, 64, 2048}, Problem{3, 17, 33}, Problem{8, 100, 256},
                    Problem{37, 29, 1000}, Problem{130, 40, 1000}, Problem{5, 7, 15}}) {
    SCOPED_TRACE("M=" + std::to_string(p.M) + " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K));
    run_and_check(xd, wd, yd, p);
  }
}

INSTANTIATE_TEST_SUITE_P(dtypes, LinearContract,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                                            ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                                            ::testing::Values(DType::kF32, DType::kBF16, DType::kF16)),
                         [](const auto& info) {
                           return "x_" + dtype_tag(std::get<0>(info.param)) + "_w_" +
                                  dtype_tag(std::get<1>(info.param)) + "_y_" + dtype_tag(std::get<2>(info.param));
                         });

TEST(Linear, bias_is_added_once_after_the_reduction) {
  run_and_check(DType::kBF16, DType::kBF16, DType::kF32, {5, 33, 200}, true);
  run_and_check(DType::kF32, DType::kBF16, DType::kBF16, {1, 64, 2048}, true);
  // bias = 0 gives exactly the bias-free result.
  OwnedTensor x(DType::kBF16, {3, 64}), w(DType::kBF16, {10, 64}), b(DType::kBF16, {10}), y0(DType::kF32, {3, 10}),
      y1(DType::kF32, {3, 10});
  fill_uniform(x.view(), 1);
  fill_uniform(w.view(), 2);
  const TensorView bv = b.view();
  ASSERT_TRUE(ops::linear(x.view(), w.view(), y0.view()).ok());
  ASSERT_TRUE(ops::linear(x.view(), w.view(), y1.view(), &bv).ok());
  EXPECT_EQ(y0.bytes(), y1.bytes());
}

// Bits of y = linear(x, w) for contiguous fp32 output, as a vector of floats.
std::vector<float> run_f32(const TensorView& x, const TensorView& w, int64_t M, int64_t N) {
  std::vector<float> y(static_cast<size_t>(M * N), -1.f);
  const Status st = ops::linear(x, w, TensorView(y.data(), DType::kF32, {M, N}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return y;
}

TEST(Linear, strided_input_row_padded_and_column_strided) {
  const int64_t M = 6, N = 19, K = 300;
  OwnedTensor xs(DType::kBF16, {M, 2 * K + 16}), w(DType::kBF16, {N, K}), xc(DType::kBF16, {M, K});
  fill_uniform(w.view(), 7);
  const TensorView padded = TensorView::strided(xs.data(), DType::kBF16, {M, K}, {K + 16, 1});
  const TensorView every_other = TensorView::strided(xs.data(), DType::kBF16, {M, K}, {2 * K + 16, 2});
  for (const TensorView& x : {padded, every_other}) {
    fill_uniform(x, 8);
    for (int64_t i = 0; i < M * K; ++i) {
      xc.view().data_as<bf16_t>()[i] = x.data_as<bf16_t>()[logical_offset(x, i)];
    }
    const std::vector<float> got = run_f32(x, w.view(), M, N);
    EXPECT_EQ(got, run_f32(xc.view(), w.view(), M, N)) << "layout changed the result";
    EXPECT_EQ(check_against_reference(x, w.view(), nullptr, TensorView(const_cast<float*>(got.data()), DType::kF32,
                                                                         {M, N}), M, N, K), 0);
  }
}

TEST(Linear, strided_output_and_column_slice) {
  const int64_t M = 4, N = 9, K = 70;
  OwnedTensor x(DType::kF32, {M, K}), w(DType::kBF16, {N, K}), wide(DType::kBF16, {M, 3 * N});
  fill_uniform(x.view(), 3);
  fill_uniform(w.view(), 4);
  fill_uniform(wide.view(), 5);
  const auto before = wide.bytes();
  // y = the middle third of each row of a [M, 3N] buffer (how the engine writes gate and up side by side).
  const TensorView y = TensorView::strided(static_cast<bf16_t*>(wide.data()) + N, DType::kBF16, {M, N}, {3 * N, 1});
  ASSERT_TRUE(ops::linear(x.view(), w.view(), y).ok());
  EXPECT_EQ(check_against_reference(x.view(), w.view(), nullptr, y, M, N, K), 0);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t c = 0; c < 3 * N; ++c) {
      if (c >= N && c < 2 * N) continue;
      const size_t off = static_cast<size_t>(r * 3 * N + c) * 2;
      EXPECT_EQ(wide.bytes()[off], before[off]) << "wrote outside y at " << r << ", " << c;
      EXPECT_EQ(wide.bytes()[off + 1], before[off + 1]) << "wrote outside y at " << r << ", " << c;
    }
  }
  // A column-strided y gets the same values.
  OwnedTensor ys(DType::kBF16, {M, 2 * N}), yc(DType::kBF16, {M, N});
  const TensorView y2 = TensorView::strided(ys.data(), DType::kBF16, {M, N}, {2 * N, 2});
  ASSERT_TRUE(ops::linear(x.view(), w.view(), y2).ok());
  ASSERT_TRUE(ops::linear(x.view(), w.view(), yc.view()).ok());
  EXPECT_EQ(to_doubles(y2), to_doubles(yc.view()));
}

TEST(Linear, leading_dims_are_flattened) {
  OwnedTensor x(DType::kBF16, {2, 3, 48}), w(DType::kBF16, {5, 48}), y3(DType::kF32, {2, 3, 5});
  fill_uniform(x.view(), 9);
  fill_uniform(w.view(), 10);
  ASSERT_TRUE(ops::linear(x.view(), w.view(), y3.view()).ok());
  const std::vector<float> flat = run_f32(TensorView(x.data(), DType::kBF16, {6, 48}), w.view(), 6, 5);
  EXPECT_EQ(std::vector<double>(flat.begin(), flat.end()), to_doubles(y3.view()));
  // A rank-1 x is one row.
  OwnedTensor y1(DType::kF32, {5});
  ASSERT_TRUE(ops::linear(TensorView(x.data(), DType::kBF16, {48}), w.view(), y1.view()).ok());
  EXPECT_EQ(std::vector<double>(flat.begin(), flat.begin() + 5), to_doubles(y1.view()));
}

TEST(Linear, empty_inputs) {
  OwnedTensor w(DType::kBF16, {8, 16}), x(DType::kBF16, {3, 16}), y(DType::kF32, {3, 8});
  fill_uniform(y.view(), 1);
  const auto before = y.bytes();
  // No rows, no columns: nothing to write.
  EXPECT_TRUE(ops::linear(TensorView(x.data(), DType::kBF16, {0, 16}), w.view(), TensorView(y.data(), DType::kF32, {0, 8})).ok());
  EXPECT_TRUE(ops::linear(x.view(), TensorView(w.data(), DType::kBF16, {0, 16}), TensorView(y.data(), DType::kF32, {3, 0})).ok());
  EXPECT_EQ(y.bytes(), before);
  // K = 0: an empty sum, y = 0 (or the bias).
  ASSERT_TRUE(ops::linear(TensorView(nullptr, DType::kBF16, {3, 0}), TensorView(nullptr, DType::kBF16, {8, 0}), y.view()).ok());
  for (double v : to_doubles(y.view())) EXPECT_EQ(v, 0.0);
  OwnedTensor b(DType::kF32, {8});
  fill_uniform(b.view(), 2);
  const TensorView bv = b.view();
  ASSERT_TRUE(ops::linear(TensorView(nullptr, DType::kBF16, {3, 0}), TensorView(nullptr, DType::kBF16, {8, 0}), y.view(), &bv).ok());
  const std::vector<double> got = to_doubles(y.view()), bias = to_doubles(bv);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(got[i], bias[i % 8]);
}

// Bit-exact results do not depend on how the same values are stored: fp16 weights and fp32 weights holding
// the same values share the fp32 order; against bf16 weights (the pair contract), bf16 input rows and fp32 input
// rows holding the same values give the same bits, on every CPU target (with AVX512_BF16 the bf16 rows take the
// bf16 dot instruction, the fp32 ones too once they are seen to hold bf16 values).
TEST(Linear, weight_dtype_does_not_change_the_arithmetic) {
  const int64_t M = 3, N = 21, K = 333;
  OwnedTensor x(DType::kF32, {M, K}), xb(DType::kBF16, {M, K}), wb(DType::kBF16, {N, K}), wf(DType::kF32, {N, K}),
      wh(DType::kF16, {N, K});
  fill_uniform(x.view(), 1);
  fill_uniform(wb.view(), 2, -1.f, 1.f);
  bool all_exact = true;
  for (int64_t i = 0; i < N * K; ++i) {
    const float v = fp16_to_float(float_to_fp16(bf16_to_float(wb.view().data_as<bf16_t>()[i])));
    wf.view().data_as<float>()[i] = v;
    wh.view().data_as<fp16_t>()[i] = float_to_fp16(v);
    all_exact &= fp16_to_float(wh.view().data_as<fp16_t>()[i]) == v;
  }
  ASSERT_TRUE(all_exact);
  EXPECT_EQ(run_f32(x.view(), wh.view(), M, N), run_f32(x.view(), wf.view(), M, N));
  for (int64_t i = 0; i < M * K; ++i) {
    xb.view().data_as<bf16_t>()[i] = float_to_bf16(x.view().data_as<float>()[i]);
    x.view().data_as<float>()[i] = bf16_to_float(xb.view().data_as<bf16_t>()[i]);
  }
  for_each_cpu_target([&](const std::string& t) {
    EXPECT_EQ(run_f32(xb.view(), wb.view(), M, N), run_f32(x.view(), wb.view(), M, N)) << t;
  });
}

// ---- batch invariance and thread-count independence ----

// A row's output bits alone (M = 1) equal its bits inside a batch of 37 at every position, with other
// random rows around it, for 1, 2 and 3 threads.
TEST(Linear, batch_invariant_row_alone_vs_inside_batch) {
  for (DType xd : {DType::kBF16, DType::kF32}) {
    for (DType yd : {DType::kF32, DType::kBF16}) {
      const int64_t N = 300, K = 1000, B = 37;
      OwnedTensor w(DType::kBF16, {N, K}), row(xd, {1, K}), batch(xd, {B, K});
      fill_uniform(w.view(), 21, -0.5f, 0.5f);
      fill_uniform(row.view(), 22);
      const size_t row_bytes = static_cast<size_t>(K) * dtype_size(xd);
      const size_t out_bytes = static_cast<size_t>(N) * dtype_size(yd);
      OwnedTensor alone(yd, {1, N});
      set_num_threads(1);
      ASSERT_TRUE(ops::linear(row.view(), w.view(), alone.view()).ok());
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        for (int64_t pos = 0; pos < B; ++pos) {
          fill_uniform(batch.view(), 100 + pos);
          std::memcpy(static_cast<char*>(batch.data()) + pos * row_bytes, row.data(), row_bytes);
          OwnedTensor y(yd, {B, N});
          ASSERT_TRUE(ops::linear(batch.view(), w.view(), y.view()).ok());
          ASSERT_EQ(0, std::memcmp(static_cast<const char*>(y.data()) + pos * out_bytes, alone.data(), out_bytes))
              << "row at position " << pos << " of " << B << " with " << threads << " threads differs from M=1 ("
              << dtype_name(xd) << " -> " << dtype_name(yd) << ")";
        }
      }
      set_num_threads(0);
    }
  }
}

// Every decode batch size 1..8 and prefill sizes spanning several row blocks give each row the same bits.
TEST(Linear, batch_invariant_across_batch_sizes) {
  // 600 rows: enough row blocks for whole-width work items (several weight panels each); K = 1100: two
  // K blocks, the second with a 16-lane tail.
  const int64_t N = 200, K = 1100, Mmax = 600;
  OwnedTensor w(DType::kBF16, {N, K}), x(DType::kBF16, {Mmax, K});
  fill_uniform(w.view(), 31, -0.5f, 0.5f);
  fill_uniform(x.view(), 32);
  const std::vector<float> full = run_f32(x.view(), w.view(), Mmax, N);
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 33, 97, 255, 599}) {
    const std::vector<float> part = run_f32(x.view().slice0(Mmax - m, Mmax), w.view(), m, N);
    ASSERT_EQ(0, std::memcmp(part.data(), full.data() + (Mmax - m) * N, part.size() * sizeof(float))) << "M=" << m;
  }
}

TEST(Linear, bit_identical_across_thread_counts) {
  const int64_t M = 37, N = 300, K = 1000;
  OwnedTensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K});
  fill_uniform(x.view(), 41);
  fill_uniform(w.view(), 42);
  set_num_threads(1);
  const std::vector<float> one = run_f32(x.view(), w.view(), M, N);
  for (int threads : {2, 3, 4, 7}) {
    set_num_threads(threads);
    EXPECT_EQ(one, run_f32(x.view(), w.view(), M, N)) << threads << " threads";
  }
  set_num_threads(0);
  EXPECT_EQ(one, run_f32(x.view(), w.view(), M, N));
}

// ---- invalid arguments: exact messages, nothing written ----

TEST(Linear, invalid_arguments) {
  OwnedTensor x(DType::kBF16, {2, 128}), w(DType::kBF16, {8, 128}), y(DType::kF32, {2, 8}), b(DType::kF32, {8});
  fill_uniform(x.view(), 1);
  fill_uniform(w.view(), 2);
  fill_uniform(y.view(), 3);
  const auto y_before = y.bytes();
  auto expect_error = [&](const std::string& message, const TensorView& xv, const TensorView& wv, const TensorView& yv,
                          const TensorView* bv = nullptr) {
    const Status st = ops::linear(xv, wv, yv, bv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(y.bytes(), y_before) << "y written on error: " << message;
  };
  std::vector<int32_t> i32(2 * 128);
  const TensorView xv = x.view(), wv = w.view(), yv = y.view();
  expect_error("linear: x has dtype int32 but must be fp32, fp16 or bf16", TensorView(i32.data(), DType::kI32, {2, 128}),
               wv, yv);
  expect_error("linear: x has a null data pointer but 256 elements", TensorView(nullptr, DType::kBF16, {2, 128}), wv,
               yv);
  expect_error("linear: x has rank 0 but must have rank >= 1 ([..., K])", TensorView(x.data(), DType::kBF16, {}), wv,
               yv);
  expect_error("linear: w has dtype int32 but must be fp32, fp16 or bf16", xv,
               TensorView(i32.data(), DType::kI32, {2, 128}), yv);
  expect_error("linear: w has rank 3 but must have rank 2 ([N, K])", xv, TensorView(w.data(), DType::kBF16, {1, 8, 128}),
               yv);
  expect_error("linear: w has shape [8, 127] but must be [8, 128] ([N, K] with K = x's last dimension)", xv,
               TensorView(w.data(), DType::kBF16, {8, 127}), yv);
  expect_error("linear: w has stride 2 along its last dimension but must have unit stride there (contiguous rows)", xv,
               TensorView::strided(w.data(), DType::kBF16, {4, 128}, {256, 2}),
               TensorView(y.data(), DType::kF32, {2, 4}));
  expect_error("linear: y has dtype int32 but must be fp32, fp16 or bf16", xv, wv,
               TensorView(i32.data(), DType::kI32, {2, 8}));
  expect_error("linear: y has shape [2, 7] but must be [2, 8] (x's leading shape + [N])", xv, wv,
               TensorView(y.data(), DType::kF32, {2, 7}));
  expect_error("linear: y has shape [16] but must be [2, 8] (x's leading shape + [N])", xv, wv,
               TensorView(y.data(), DType::kF32, {16}));
  const TensorView short_bias(b.data(), DType::kF32, {7});
  expect_error("linear: bias has shape [7] but must be [8] ([N] with N = w's first dimension)", xv, wv, yv, &short_bias);
  const TensorView int_bias(i32.data(), DType::kI32, {8});
  expect_error("linear: bias has dtype int32 but must be fp32, fp16 or bf16", xv, wv, yv, &int_bias);
  // y inside x's storage.
  OwnedTensor big(DType::kF32, {4, 128});
  expect_error("linear: y overlaps x in memory; outputs must not alias inputs",
               TensorView(big.data(), DType::kF32, {2, 128}), wv,
               TensorView(static_cast<float*>(big.data()) + 200, DType::kF32, {2, 8}));
  expect_error("linear: y overlaps w in memory; outputs must not alias inputs", xv,
               TensorView(big.data(), DType::kF32, {8, 128}), TensorView(big.data(), DType::kF32, {2, 8}));
  expect_error("linear: x has shape [2, -1] with a negative size or stride; sizes and strides must be >= 0",
               TensorView::strided(x.data(), DType::kBF16, {2, -1}, {128, 1}), wv, yv);
}

}  // namespace
}  // namespace genbridge::testing
