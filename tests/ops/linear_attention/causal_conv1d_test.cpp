// Contract test for linear_attention/causal_conv1d; runs unchanged in every target build.
#include "genbridge/ops/linear_attention/causal_conv1d.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/linear_attention/linear_attention_ref.h"
#include "ops/linear_attention/gdn_harness.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

struct Problem {
  int64_t C = 40, K = 4;
  std::vector<int> q_lens = {5};
  std::vector<int> slots = {0};
  int64_t num_slots = 1;
  DType x = DType::kBF16, w = DType::kBF16, state = DType::kBF16, y = DType::kBF16;
  bool fresh = false;
  uint64_t seed = 1;
};

struct Data {
  Problem p;
  SeqBatchTensors batch;
  int64_t T;
  OwnedTensor x, weight, state, y;
  explicit Data(const Problem& pr)
      : p(pr),
        batch(pr.q_lens, pr.slots),
        T(batch.num_tokens()),
        x(pr.x, {T, pr.C}),
        weight(pr.w, {pr.C, pr.K}),
        state(pr.state, {pr.num_slots, pr.K - 1, pr.C}),
        y(pr.y, {T, pr.C}) {
    fill_uniform(x.view(), p.seed, -3.f, 3.f);
    fill_uniform(weight.view(), p.seed + 1, -1.f, 1.f);
    if (!p.fresh) fill_uniform(state.view(), p.seed + 2, -3.f, 3.f);
  }
  Status run() {
    return ops::causal_conv1d(x.view(), weight.view(), state.view(), batch.state_indices(), batch.query_start_loc(),
                              y.view());
  }
};

// The contract's fp32 formula for every sequence of `d` (state before the call in `state0`): y and the new states.
void fp32_formula(Data& d, const std::vector<double>& state0, std::vector<float>& y, std::vector<float>& state) {
  const Problem& p = d.p;
  const auto x = to_doubles(d.x.view()), w = to_doubles(d.weight.view());
  const int64_t H = p.K - 1;
  y.assign(static_cast<size_t>(d.T * p.C), 0.f);
  state.assign(state0.begin(), state0.end());
  for (int64_t s = 0; s < d.batch.num_seqs(); ++s) {
    const int64_t r0 = d.batch.starts[s], len = d.batch.starts[s + 1] - r0, slot = d.batch.slots[s];
    if (len == 0) continue;
    std::vector<float> xp(static_cast<size_t>((H + len) * p.C));
    for (int64_t i = 0; i < H * p.C; ++i) xp[i] = static_cast<float>(state0[slot * H * p.C + i]);
    for (int64_t i = 0; i < len * p.C; ++i) xp[H * p.C + i] = static_cast<float>(x[r0 * p.C + i]);
    for (int64_t t = 0; t < len; ++t)
      for (int64_t c = 0; c < p.C; ++c) {
        float acc = 0.0f;
        for (int64_t j = 0; j < p.K; ++j) acc = acc + static_cast<float>(w[c * p.K + j]) * xp[(t + j) * p.C + c];
        const float v = acc / (1.0f + std::exp(-acc));
        y[(r0 + t) * p.C + c] = p.y == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v;
      }
    for (int64_t i = 0; i < H * p.C; ++i) {
      const float v = xp[len * p.C + i];
      state[slot * H * p.C + i] = p.state == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v;
    }
  }
}

void check(const Problem& p) {
  Data d(p);
  const std::vector<double> state0 = to_doubles(d.state.view());
  const auto x_before = d.x.bytes();
  ASSERT_TRUE(d.run().ok());
  EXPECT_EQ(d.x.bytes(), x_before);
  std::vector<float> want_y, want_state;
  fp32_formula(d, state0, want_y, want_state);
  const auto got_y = to_doubles(d.y.view()), got_state = to_doubles(d.state.view());
  for (size_t i = 0; i < want_y.size(); ++i) ASSERT_EQ(static_cast<float>(got_y[i]), want_y[i]) << "y " << i;
  for (size_t i = 0; i < want_state.size(); ++i) ASSERT_EQ(static_cast<float>(got_state[i]), want_state[i]) << "state " << i;
  // fp64 reference: each sum's K fp32 products and adds, silu's few steps, then y's rounding.
  const auto x = to_doubles(d.x.view()), w = to_doubles(d.weight.view());
  const int64_t H = p.K - 1;
  for (int64_t s = 0; s < d.batch.num_seqs(); ++s) {
    const int64_t r0 = d.batch.starts[s], r1 = d.batch.starts[s + 1], slot = d.batch.slots[s];
    std::vector<double> st(state0.begin() + slot * H * p.C, state0.begin() + (slot + 1) * H * p.C), y;
    ref::causal_conv1d(rows_of(x, p.C, r0, r1), r1 - r0, p.C, w, p.K, st, y);
    for (int64_t i = 0; i < (r1 - r0) * p.C; ++i) {
      double abs_sum = 0;
      const int64_t t = i / p.C, c = i % p.C;
      for (int64_t j = 0; j < p.K; ++j) {
        const int64_t xi = t + j;  // index into history ++ x
        const double xv = xi < H ? state0[slot * H * p.C + xi * p.C + c] : x[(r0 + xi - H) * p.C + c];
        abs_sum += std::abs(w[c * p.K + j] * xv);
      }
      const double want = y[i];
      ASSERT_NEAR(got_y[r0 * p.C + i], want, 2 * (p.K + 8) * 0x1p-24 * (abs_sum + std::abs(want)) +
                                                 rounding_bound(p.y, want) + 1e-30)
          << "seq " << s << " element " << i;
    }
    for (int64_t i = 0; i < H * p.C; ++i)
      ASSERT_NEAR(got_state[slot * H * p.C + i], st[i], rounding_bound(p.state, st[i]) + 0x1p-24 * std::abs(st[i]));
  }
}

TEST(CausalConv1d, matches_the_fp32_formula_and_fp64_reference) {
  for (DType x : {DType::kF32, DType::kBF16})
    for (DType st : {DType::kF32, DType::kBF16}) {
      Problem p;
      p.x = x, p.w = x, p.state = st, p.y = x == DType::kF32 ? DType::kBF16 : DType::kF32;
      p.C = 300;  // more than one channel block, and a 16-lane tail
      p.q_lens = {1, 2, 70, 0, 3};
      p.slots = {3, 0, 4, 1, 2};
      p.num_slots = 5;
      check(p);
    }
}

TEST(CausalConv1d, kernel_sizes_2_to_8) {
  for (int64_t K = 2; K <= 8; ++K) {
    Problem p;
    p.K = K, p.C = 33;
    p.q_lens = {1, 2, static_cast<int>(K), 40};
    p.slots = {0, 1, 2, 3};
    p.num_slots = 4;
    SCOPED_TRACE("K " + std::to_string(K));
    check(p);
  }
}

TEST(CausalConv1d, fresh_state_and_long_prompt) {
  Problem p;
  p.fresh = true, p.C = 64, p.q_lens = {64 * 3 + 17};
  check(p);
}

// Prefill in one call == the same prompt in several calls (decode steps included), bit for bit (fp32 state).
TEST(CausalConv1d, continues_state_across_calls) {
  Problem p;
  p.state = DType::kF32, p.C = 48, p.q_lens = {100};
  Data whole(p);
  Data parts(p);
  ASSERT_TRUE(whole.run().ok());
  int64_t r0 = 0;
  for (int part : {1, 2, 40, 1, 1, 50, 5}) {
    std::vector<int32_t> si = {0}, qsl = {0, part};
    auto rows = [&](OwnedTensor& t, DType dt) {
      return TensorView(static_cast<char*>(t.data()) + r0 * p.C * dtype_size(dt), dt, {part, p.C});
    };
    ASSERT_TRUE(ops::causal_conv1d(rows(parts.x, p.x), parts.weight.view(), parts.state.view(),
                                   TensorView(si.data(), DType::kI32, {1}), TensorView(qsl.data(), DType::kI32, {2}),
                                   rows(parts.y, p.y))
                    .ok());
    r0 += part;
  }
  EXPECT_EQ(parts.y.bytes(), whole.y.bytes());
  EXPECT_EQ(parts.state.bytes(), whole.state.bytes());
}

TEST(CausalConv1d, each_sequence_as_if_alone_and_any_thread_count) {
  Problem p;
  p.C = 520, p.q_lens = {70, 1, 0, 5, 130};
  p.slots = {3, 1, 0, 4, 2};
  p.num_slots = 5;
  set_num_threads(1);
  Data all(p);
  ASSERT_TRUE(all.run().ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    Data d(p);
    ASSERT_TRUE(d.run().ok());
    EXPECT_EQ(d.y.bytes(), all.y.bytes());
    EXPECT_EQ(d.state.bytes(), all.state.bytes());
  }
  set_num_threads(0);
  for (size_t s = 0; s < p.q_lens.size(); ++s) {
    Data alone(p);
    const int64_t r0 = all.batch.starts[s], len = p.q_lens[s];
    std::vector<int32_t> si = {p.slots[s]}, qsl = {0, static_cast<int32_t>(len)};
    auto rows = [&](OwnedTensor& t, DType dt) { return static_cast<char*>(t.data()) + r0 * p.C * dtype_size(dt); };
    ASSERT_TRUE(ops::causal_conv1d(TensorView(rows(alone.x, p.x), p.x, {len, p.C}), alone.weight.view(),
                                   alone.state.view(), TensorView(si.data(), DType::kI32, {1}),
                                   TensorView(qsl.data(), DType::kI32, {2}),
                                   TensorView(rows(alone.y, p.y), p.y, {len, p.C}))
                    .ok());
    EXPECT_EQ(std::memcmp(rows(alone.y, p.y), rows(all.y, p.y), len * p.C * dtype_size(p.y)), 0) << s;
    const size_t slot_bytes = (p.K - 1) * p.C * dtype_size(p.state);
    EXPECT_EQ(std::memcmp(static_cast<char*>(alone.state.data()) + p.slots[s] * slot_bytes,
                          static_cast<char*>(all.state.data()) + p.slots[s] * slot_bytes, slot_bytes),
              0)
        << s;
  }
}

TEST(CausalConv1d, strided_rows_and_hostile_sizes) {
  // x rows with padding; y rows with padding.
  Problem p;
  p.C = 20, p.x = DType::kF32, p.y = DType::kF32, p.q_lens = {6};
  Data d(p);
  ASSERT_TRUE(d.run().ok());
  Data e(p);
  std::vector<float> xs(6 * 32), ys(6 * 32, 7.f);
  for (int64_t t = 0; t < 6; ++t)
    std::memcpy(&xs[t * 32], e.x.view().data_as<float>() + t * 20, 20 * sizeof(float));
  std::vector<int32_t> si = {0}, qsl = {0, 6};
  ASSERT_TRUE(ops::causal_conv1d(TensorView::strided(xs.data(), DType::kF32, {6, 20}, {32, 1}), e.weight.view(),
                                 e.state.view(), TensorView(si.data(), DType::kI32, {1}),
                                 TensorView(qsl.data(), DType::kI32, {2}),
                                 TensorView::strided(ys.data(), DType::kF32, {6, 20}, {32, 1}))
                  .ok());
  for (int64_t t = 0; t < 6; ++t)
    EXPECT_EQ(std::memcmp(&ys[t * 32], d.y.view().data_as<float>() + t * 20, 20 * sizeof(float)), 0);
  for (int64_t C : {1, 15, 16, 17, 257}) {
    Problem h;
    h.C = C, h.q_lens = {0, 1, 3};
    h.slots = {2, 0, 1};
    h.num_slots = 3;
    check(h);
  }
  Problem empty;
  empty.q_lens = {};
  empty.slots = {};
  Data z(empty);
  EXPECT_TRUE(z.run().ok());
}

TEST(CausalConv1d, invalid_arguments) {
  Problem p;
  p.C = 8, p.q_lens = {2, 1};
  p.slots = {1, 0};
  p.num_slots = 2;
  Data d(p);
  fill_uniform(d.y.view(), 9);
  const auto y_before = d.y.bytes(), state_before = d.state.bytes();
  std::vector<int32_t> si = {1, 0}, qsl = {0, 2, 3};
  const TensorView siv(si.data(), DType::kI32, {2}), qslv(qsl.data(), DType::kI32, {3});
  const TensorView x = d.x.view(), w = d.weight.view(), st = d.state.view(), y = d.y.view();
  auto expect_error = [&](const std::string& message, const TensorView& xx, const TensorView& ww, const TensorView& ss,
                          const TensorView& ii, const TensorView& ll, const TensorView& yy) {
    const Status status = ops::causal_conv1d(xx, ww, ss, ii, ll, yy);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_EQ(status.message(), message);
    EXPECT_EQ(d.y.bytes(), y_before) << message;
    EXPECT_EQ(d.state.bytes(), state_before) << message;
  };
  std::vector<float> f32(1024);
  std::vector<uint16_t> h16(1024);
  std::vector<int32_t> si_bad = {2, 0}, si_dup = {1, 1}, qsl_bad = {0, 3, 2};
  expect_error("causal_conv1d: conv_state has dtype fp16 but must be bf16 or fp32 (the state's dtype)", x, w,
               TensorView(h16.data(), DType::kF16, {2, 3, 8}), siv, qslv, y);
  expect_error("causal_conv1d: conv_state has shape [2, 4, 8] but must be [num_slots >= 1, 3, 8] ([num_slots, K - 1, C])",
               x, w, TensorView(h16.data(), DType::kBF16, {2, 4, 8}), siv, qslv, y);
  expect_error("causal_conv1d: conv_state is not contiguous; state slots must be contiguous", x, w,
               TensorView::strided(h16.data(), DType::kBF16, {2, 3, 8}, {48, 16, 1}), siv, qslv, y);
  expect_error("causal_conv1d: state_indices[0] is 2 but must be in [0, 2) (the state's slots)", x, w, st,
               TensorView(si_bad.data(), DType::kI32, {2}), qslv, y);
  expect_error("causal_conv1d: state_indices[1] is 1, as is state_indices[0]; each sequence needs its own state slot", x,
               w, st, TensorView(si_dup.data(), DType::kI32, {2}), qslv, y);
  expect_error("causal_conv1d: query_start_loc[2] = 2 is less than query_start_loc[1] = 3; it must be non-decreasing",
               x, w, st, siv, TensorView(qsl_bad.data(), DType::kI32, {3}), y);
  expect_error("causal_conv1d: the kernel size K = weight.dim(1) is 9 but must be in [2, 8]", x,
               TensorView(f32.data(), DType::kBF16, {8, 9}), st, siv, qslv, y);
  expect_error("causal_conv1d: the kernel size K = weight.dim(1) is 1 but must be in [2, 8]", x,
               TensorView(f32.data(), DType::kBF16, {8, 1}), st, siv, qslv, y);
  expect_error("causal_conv1d: weight has shape [7, 4] but must be [8, K] (x's channels C, kernel size K)", x,
               TensorView(f32.data(), DType::kBF16, {7, 4}), st, siv, qslv, y);
  expect_error("causal_conv1d: x has dtype fp16 but must be fp32 or bf16", TensorView(h16.data(), DType::kF16, {3, 8}),
               w, st, siv, qslv, y);
  expect_error("causal_conv1d: y has shape [3, 7] but must be [3, 8] (x's shape [T, C])", x, w, st, siv, qslv,
               TensorView(f32.data(), DType::kF32, {3, 7}));
  expect_error("causal_conv1d: y overlaps x in memory; outputs must not alias inputs", x, w, st, siv, qslv,
               TensorView(x.data(), DType::kBF16, {3, 8}));
  expect_error("causal_conv1d: y overlaps conv_state in memory; outputs must not alias inputs", x, w, st, siv, qslv,
               TensorView(st.data(), DType::kBF16, {3, 8}));
  expect_error("causal_conv1d: x has stride 2 along its last dimension but must have unit stride there (contiguous rows)",
               TensorView::strided(f32.data(), DType::kBF16, {3, 8}, {16, 2}), w, st, siv, qslv, y);
}

}  // namespace
}  // namespace genbridge::testing
