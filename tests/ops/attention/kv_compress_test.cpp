// Contract tests for attention/kv_compress (DeepSeek-V4's compressor) against the fp64 reference; runs
// unchanged in every target build.
#include "mla_harness.h"

#include "genbridge/core/threading.h"
#include "genbridge/ops/attention/kv_compress.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

struct Inputs {
  int64_t ratio, D, rows;
  bool overlap;
  std::vector<float> kv, gate, ape;
  int64_t width() const { return (overlap ? 2 : 1) * D; }
  int64_t windows() const { return (rows - (overlap ? ratio : 0)) / ratio; }
};

Inputs make(int64_t ratio, int64_t D, int64_t windows, bool overlap, uint32_t seed) {
  Inputs in{ratio, D, (windows + (overlap ? 1 : 0)) * ratio, overlap, {}, {}, {}};
  in.kv = random_floats(static_cast<size_t>(in.rows * in.width()), seed, -2.f, 2.f);
  in.gate = random_floats(static_cast<size_t>(in.rows * in.width()), seed + 1, -4.f, 4.f);
  in.ape = random_floats(static_cast<size_t>(ratio * in.width()), seed + 2, -1.f, 1.f);
  return in;
}

// Runs the op on rows [row0, row0 + rows) of `in`.
std::vector<float> run(const Inputs& in, bool has_previous, int64_t row0, int64_t rows, Status* st = nullptr,
                       DType dtype = DType::kF32) {
  const int64_t w = in.width(), windows = (rows - (in.overlap ? in.ratio : 0)) / in.ratio;
  std::vector<float> kv(in.kv.begin() + row0 * w, in.kv.begin() + (row0 + rows) * w);
  std::vector<float> gate(in.gate.begin() + row0 * w, in.gate.begin() + (row0 + rows) * w), ape = in.ape;
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(windows, 0) * in.D + 1), -7.f);
  std::vector<bf16_t> kb(kv.size()), gb(gate.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    kb[i] = float_to_bf16(kv[i]);
    gb[i] = float_to_bf16(gate[i]);
  }
  const bool bf = dtype == DType::kBF16;
  const Status s = ops::kv_compress(
      bf ? TensorView(kb.data(), DType::kBF16, {rows, w}) : TensorView(kv.data(), DType::kF32, {rows, w}),
      bf ? TensorView(gb.data(), DType::kBF16, {rows, w}) : TensorView(gate.data(), DType::kF32, {rows, w}),
      TensorView(ape.data(), DType::kF32, {in.ratio, w}), in.ratio, in.overlap, has_previous,
      TensorView(out.data(), DType::kF32, {std::max<int64_t>(windows, 0), in.D}));
  if (st) *st = s;
  EXPECT_TRUE(s.ok() || st) << s.to_string();
  out.pop_back();
  return out;
}

std::vector<double> as_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(KvCompress, matches_reference_with_and_without_overlap) {
  struct C {
    int64_t ratio, D, windows;
    bool overlap, has_previous;
  };
  for (const C& c : {C{128, 40, 3, false, false}, C{8, 512, 5, false, false}, C{4, 64, 6, true, false},
                     C{4, 512, 3, true, true}, C{4, 24, 1, true, false}}) {
    SCOPED_TRACE("ratio " + std::to_string(c.ratio) + " D " + std::to_string(c.D) + (c.overlap ? " overlap" : ""));
    const Inputs in = make(c.ratio, c.D, c.windows, c.overlap, 10);
    const auto out = run(in, c.has_previous, 0, in.rows);
    const auto want =
        ref::kv_compress(as_double(in.kv), as_double(in.gate), as_double(in.ape), c.ratio, c.D, c.overlap, c.has_previous);
    ASSERT_EQ(out.size(), want.size());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-6 + 2e-6 * std::fabs(want[i])) << i;
  }
}

TEST(KvCompress, one_window_at_a_time_equals_all_at_once) {
  // Decode compresses each window as it completes (with the previous window's rows as the lead); prefill
  // compresses all of them in one call: the same bits.
  for (bool overlap : {false, true}) {
    const int64_t ratio = 4, D = 64, windows = 7;
    const Inputs in = make(ratio, D, windows, overlap, 20);
    const auto all = run(in, false, 0, in.rows);
    for (int64_t k = 0; k < windows; ++k) {
      const int64_t row0 = k * ratio, rows = overlap ? 2 * ratio : ratio;
      const auto one = run(in, k > 0, row0, rows);
      ASSERT_EQ(0, std::memcmp(one.data(), all.data() + k * D, D * sizeof(float))) << "window " << k;
    }
  }
}

TEST(KvCompress, equal_scores_average_and_extreme_scores_select_without_nan) {
  Inputs in = make(4, 32, 2, false, 30);
  std::fill(in.gate.begin(), in.gate.end(), 0.f);
  std::fill(in.ape.begin(), in.ape.end(), 0.f);
  auto out = run(in, false, 0, in.rows);
  for (int64_t d = 0; d < 32; ++d) {
    double mean = 0;
    for (int64_t i = 0; i < 4; ++i) mean += in.kv[i * 32 + d] / 4.0;
    ASSERT_NEAR(out[d], mean, 1e-6);
  }
  // A slot 1e30 above the others takes the whole weight; -inf-like gaps give exact zeros, not NaN.
  for (int64_t d = 0; d < 32; ++d) in.gate[2 * 32 + d] = 1e30f;
  out = run(in, false, 0, in.rows);
  for (int64_t d = 0; d < 32; ++d) ASSERT_EQ(out[d], in.kv[2 * 32 + d]) << d;
}

TEST(KvCompress, bf16_inputs_are_read_exactly) {
  const Inputs in = make(4, 64, 3, true, 40);
  Inputs rounded = in;
  for (float& v : rounded.kv) v = bf16_to_float(float_to_bf16(v));
  for (float& v : rounded.gate) v = bf16_to_float(float_to_bf16(v));
  const auto a = run(in, false, 0, in.rows, nullptr, DType::kBF16), b = run(rounded, false, 0, rounded.rows);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(KvCompress, thread_and_cpu_target_invariant) {
  const Inputs in = make(4, 512, 40, true, 50);
  set_num_threads(1);
  const auto one = run(in, true, 0, in.rows);
  set_num_threads(3);
  const auto three = run(in, true, 0, in.rows);
  set_num_threads(0);
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
  std::vector<float> first;
  for_each_cpu_target([&](const std::string& target) {
    const auto got = run(in, true, 0, in.rows);
    if (first.empty()) first = got;
    EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float))) << target;
  });
}

TEST(KvCompress, invalid_arguments_name_op_value_and_rule) {
  std::vector<float> kv(8 * 64), ape(4 * 64), out(64);
  const TensorView k(kv.data(), DType::kF32, {8, 64});
  Status st = ops::kv_compress(k, k, TensorView(ape.data(), DType::kF32, {4, 64}), 0, true, false,
                               TensorView(out.data(), DType::kF32, {1, 32}));
  EXPECT_EQ(st.message(), "kv_compress: ratio is 0 but must be >= 1");
  st = ops::kv_compress(TensorView(kv.data(), DType::kF32, {6, 64}), TensorView(kv.data(), DType::kF32, {6, 64}),
                        TensorView(ape.data(), DType::kF32, {4, 64}), 4, true, false,
                        TensorView(out.data(), DType::kF32, {1, 32}));
  EXPECT_EQ(st.message(), "kv_compress: kv has 6 rows but must hold whole windows of 4 tokens, the first one the "
                          "previous window's");
  st = ops::kv_compress(k, k, TensorView(ape.data(), DType::kF32, {4, 32}), 4, true, false,
                        TensorView(out.data(), DType::kF32, {1, 32}));
  EXPECT_EQ(st.message(), "kv_compress: ape has dtype fp32 and shape [4, 32] but must be contiguous fp32 [4, 64]");
  st = ops::kv_compress(k, k, TensorView(ape.data(), DType::kF32, {4, 64}), 4, true, false,
                        TensorView(out.data(), DType::kF32, {2, 32}));
  EXPECT_EQ(st.message(), "kv_compress: out has shape [2, 32] but must be [1, 32] (complete windows, D)");
  st = ops::kv_compress(k, TensorView(kv.data(), DType::kF32, {8, 32}), TensorView(ape.data(), DType::kF32, {4, 64}),
                        4, true, false, TensorView(out.data(), DType::kF32, {1, 32}));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("kv_compress: gate"), std::string::npos) << st.message();
  // No complete window: nothing to write, and no error.
  st = ops::kv_compress(TensorView(kv.data(), DType::kF32, {4, 64}), TensorView(kv.data(), DType::kF32, {4, 64}),
                        TensorView(ape.data(), DType::kF32, {4, 64}), 4, true, false,
                        TensorView(out.data(), DType::kF32, {0, 32}));
  EXPECT_TRUE(st.ok()) << st.to_string();
}

}  // namespace
}  // namespace genbridge::testing
