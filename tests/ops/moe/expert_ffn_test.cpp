// Contract test for moe/expert_ffn; runs unchanged in every target build.
#include "genbridge/ops/moe/expert_ffn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/activation/silu_and_mul.h"
#include "genbridge/ops/linear/linear.h"
#include "ops/common/moe/moe_ref.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

// A routed batch: x [T, H], ids [T, k] (distinct experts per token, drawn from [0, E)), stacked
// weights w_gate/w_up [E, I, H] and w_down [E, H, I].
struct Batch {
  int64_t T, k, E, H, I;
  OwnedTensor x, ids, wg, wu, wd;
  Batch(int64_t T_, int64_t k_, int64_t E_, int64_t H_, int64_t I_, DType xd = DType::kBF16, DType wdt = DType::kBF16,
        uint64_t seed = 1)
      : T(T_), k(k_), E(E_), H(H_), I(I_), x(xd, {T_, H_}), ids(DType::kI32, {T_, k_}), wg(wdt, {E_, I_, H_}),
        wu(wdt, {E_, I_, H_}), wd(wdt, {E_, H_, I_}) {
    fill_uniform(x.view(), seed, -2.f, 2.f);
    const float s = 1.0f / std::sqrt(static_cast<float>(H));
    fill_uniform(wg.view(), seed + 1, -2 * s, 2 * s);
    fill_uniform(wu.view(), seed + 2, -2 * s, 2 * s);
    fill_uniform(wd.view(), seed + 3, -1.f / std::sqrt(static_cast<float>(std::max<int64_t>(I, 1))),
                 1.f / std::sqrt(static_cast<float>(std::max<int64_t>(I, 1))));
    route(seed + 4);
  }
  // Fresh distinct random experts per token.
  void route(uint64_t seed) {
    std::mt19937_64 rng(seed);
    int32_t* p = ids.view().data_as<int32_t>();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) all[e] = static_cast<int32_t>(e);
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < k; ++j) p[t * k + j] = all[j];
    }
  }
  int32_t id(int64_t t, int64_t j) { return ids.view().data_as<int32_t>()[t * k + j]; }
  Status run(const TensorView& out, int64_t begin, int64_t end, float limit = ops::kNoSwigluLimit) {
    return ops::expert_ffn(x.view(), ids.view(), wg.view(), wu.view(), wd.view(), begin, end, out, limit);
  }
};

// Checks every slot of `out` routed into [begin, end) against the fp64 oracle (with the SwiGLU clamp at
// `limit`); `clamped` (when not null) accumulates the oracle's count of clamped gates above, ups above and
// ups below.
int64_t check_against_reference(Batch& b, const TensorView& out, int64_t begin, int64_t end, double limit = INFINITY,
                                int64_t* clamped = nullptr) {
  const std::vector<double> x = to_doubles(b.x.view()), wg = to_doubles(b.wg.view()), wu = to_doubles(b.wu.view()),
                            wd = to_doubles(b.wd.view()), got = to_doubles(out);
  std::vector<double> ref(static_cast<size_t>(b.H)), sens(static_cast<size_t>(b.H));
  const double rel = dot_error_bound(std::max(b.H, b.I), 1.0) + 16 * 0x1p-24;
  int64_t bad = 0;
  for (int64_t t = 0; t < b.T; ++t) {
    for (int64_t j = 0; j < b.k; ++j) {
      const int64_t e = b.id(t, j);
      if (e < begin || e >= end) continue;
      ref::swiglu_expert(&x[t * b.H], &wg[e * b.I * b.H], &wu[e * b.I * b.H], &wd[e * b.H * b.I], b.H, b.I, ref.data(),
                         sens.data(), limit, clamped);
      for (int64_t h = 0; h < b.H; ++h) {
        const double g = got[(t * b.k + j) * b.H + h];
        const double tol = rel * sens[h] + rounding_bound(out.dtype(), ref[h]);
        if (!(std::abs(g - ref[h]) <= tol)) {
          if (bad < 5) ADD_FAILURE() << "out[" << t << ", " << j << ", " << h << "] = " << g << ", fp64 " << ref[h];
          ++bad;
        }
      }
    }
  }
  return bad;
}

struct Shape {
  int64_t T, k, E, H, I;
};

class ExpertFfnContract : public ::testing::TestWithParam<std::tuple<DType, DType, DType>> {};

TEST_P(ExpertFfnContract, matches_fp64_reference) {
  const auto [xd, wdt, od] = GetParam();
  // Decode-sized, sizes not multiples of 16, and groups of more than one row block with K > one K block.
  for (Shape s : {Shape{1, 2, 4, 64, 48}, Shape{5, 4, 8, 100, 37}, Shape{70, 2, 2, 1100, 40}}) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " k=" + std::to_string(s.k) + " E=" + std::to_string(s.E) +
                 " H=" + std::to_string(s.H) + " I=" + std::to_string(s.I));
    Batch b(s.T, s.k, s.E, s.H, s.I, xd, wdt);
    OwnedTensor out(od, {s.T, s.k, s.H});
    const auto x0 = b.x.bytes(), ids0 = b.ids.bytes(), g0 = b.wg.bytes(), u0 = b.wu.bytes(), d0 = b.wd.bytes();
    const Status st = b.run(out.view(), 0, s.E);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(check_against_reference(b, out.view(), 0, s.E), 0);
    EXPECT_EQ(b.x.bytes(), x0) << "x was mutated";
    EXPECT_EQ(b.ids.bytes(), ids0) << "topk_ids was mutated";
    EXPECT_TRUE(b.wg.bytes() == g0 && b.wu.bytes() == u0 && b.wd.bytes() == d0) << "weights were mutated";
  }
}

// DeepSeek-V4's swiglu_limit: a limit inside the range of g and u (|g|, |u| reach ~2.5 here) clamps gates from
// above and ups on both sides, and every slot still matches the clamped fp64 oracle.
TEST_P(ExpertFfnContract, swiglu_limit_matches_clamped_fp64_reference) {
  const auto [xd, wdt, od] = GetParam();
  for (Shape s : {Shape{1, 2, 4, 64, 48}, Shape{5, 4, 8, 100, 37}, Shape{70, 2, 2, 1100, 40}}) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " I=" + std::to_string(s.I));
    Batch b(s.T, s.k, s.E, s.H, s.I, xd, wdt);
    OwnedTensor out(od, {s.T, s.k, s.H});
    ASSERT_TRUE(b.run(out.view(), 0, s.E, 0.75f).ok());
    int64_t clamped[3] = {0, 0, 0};
    EXPECT_EQ(check_against_reference(b, out.view(), 0, s.E, 0.75, clamped), 0);
    EXPECT_GT(clamped[0], 0) << "no gate above the limit";
    EXPECT_GT(clamped[1], 0) << "no up above the limit";
    EXPECT_GT(clamped[2], 0) << "no up below -limit";
  }
}

INSTANTIATE_TEST_SUITE_P(dtypes, ExpertFfnContract,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return "x_" + std::string(dtype_name(std::get<0>(info.param))) + "_w_" +
                                  std::string(dtype_name(std::get<1>(info.param))) + "_out_" +
                                  std::string(dtype_name(std::get<2>(info.param)));
                         });

// Slots routed outside the range, or to a negative "no expert" id, keep their bytes.
TEST(ExpertFfn, slots_outside_the_range_are_untouched) {
  Batch b(6, 3, 8, 64, 32);
  b.ids.view().data_as<int32_t>()[4] = -1;
  OwnedTensor out(DType::kF32, {6, 3, 64});
  fill_uniform(out.view(), 99);
  const auto before = out.bytes();
  ASSERT_TRUE(b.run(out.view(), 2, 5).ok());
  const float* o = out.view().data_as<float>();
  const float* o0 = reinterpret_cast<const float*>(before.data());
  int64_t written = 0;
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < 3; ++j) {
      const int32_t e = b.id(t, j);
      const bool mine = e >= 2 && e < 5;
      written += mine;
      EXPECT_EQ(mine, std::memcmp(o + (t * 3 + j) * 64, o0 + (t * 3 + j) * 64, 64 * sizeof(float)) != 0)
          << "slot " << t << ", " << j << " (expert " << e << ")";
    }
  EXPECT_GT(written, 0);
  EXPECT_EQ(check_against_reference(b, out.view(), 2, 5), 0);
}

// Computing [0, E) at once equals [0, E/2) then [E/2, E) (two FFN ranks) and any other split, with
// global or rank-local stacked weights and with per-expert views.
TEST(ExpertFfn, expert_range_split_is_bit_identical) {
  Batch b(9, 4, 8, 96, 40);
  OwnedTensor whole(DType::kBF16, {9, 4, 96}), split(DType::kBF16, {9, 4, 96}), local(DType::kBF16, {9, 4, 96}),
      views(DType::kBF16, {9, 4, 96});
  ASSERT_TRUE(b.run(whole.view(), 0, 8).ok());
  for (int64_t cut : {1, 4, 7}) {
    ASSERT_TRUE(b.run(split.view(), 0, cut).ok());
    ASSERT_TRUE(b.run(split.view(), cut, 8).ok());
    EXPECT_EQ(whole.bytes(), split.bytes()) << "split at " << cut;
  }
  // Rank-local weights: slices [4, 8) of the stacked tensors, as an FFN rank would hold them.
  auto tail = [](OwnedTensor& w, int64_t d1, int64_t d2) {
    return TensorView(static_cast<bf16_t*>(w.data()) + 4 * d1 * d2, DType::kBF16, {4, d1, d2});
  };
  ASSERT_TRUE(b.run(local.view(), 0, 4).ok());
  ASSERT_TRUE(ops::expert_ffn(b.x.view(), b.ids.view(), tail(b.wg, 40, 96), tail(b.wu, 40, 96), tail(b.wd, 96, 40), 4,
                              8, local.view())
                  .ok());
  EXPECT_EQ(whole.bytes(), local.bytes());
  // Per-expert views (how a memory-mapped checkpoint's separate expert tensors are passed).
  std::vector<ops::ExpertWeights> experts;
  for (int64_t e = 0; e < 8; ++e) {
    experts.push_back({TensorView(static_cast<bf16_t*>(b.wg.data()) + e * 40 * 96, DType::kBF16, {40, 96}),
                       TensorView(static_cast<bf16_t*>(b.wu.data()) + e * 40 * 96, DType::kBF16, {40, 96}),
                       TensorView(static_cast<bf16_t*>(b.wd.data()) + e * 96 * 40, DType::kBF16, {96, 40})});
  }
  ASSERT_TRUE(ops::expert_ffn(b.x.view(), b.ids.view(), experts, 0, 8, views.view()).ok());
  EXPECT_EQ(whole.bytes(), views.bytes());
}

// A token's slot bits do not depend on the other tokens in the batch (routed to the same or other
// experts), on its position, nor on the thread count.
TEST(ExpertFfn, batch_invariant_token_alone_vs_inside_batch) {
  const int64_t T = 23, k = 4, E = 8, H = 200, I = 72;
  Batch one(1, k, E, H, I, DType::kBF16, DType::kBF16, 5);
  OwnedTensor alone(DType::kBF16, {1, k, H});
  set_num_threads(1);
  ASSERT_TRUE(one.run(alone.view(), 0, E).ok());
  const size_t row_bytes = static_cast<size_t>(H) * 2, slot_bytes = static_cast<size_t>(k * H) * 2;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    for (int64_t pos : {int64_t{0}, int64_t{7}, T - 1}) {
      Batch b(T, k, E, H, I, DType::kBF16, DType::kBF16, 5);  // same weights (same seeds)
      b.route(1000 + pos);
      fill_uniform(b.x.view(), 2000 + pos);
      std::memcpy(static_cast<char*>(b.x.data()) + pos * row_bytes, one.x.data(), row_bytes);
      std::memcpy(b.ids.view().data_as<int32_t>() + pos * k, one.ids.data(), k * sizeof(int32_t));
      OwnedTensor out(DType::kBF16, {T, k, H});
      ASSERT_TRUE(b.run(out.view(), 0, E).ok());
      EXPECT_EQ(0, std::memcmp(static_cast<char*>(out.data()) + pos * slot_bytes, alone.data(), slot_bytes))
          << "token at " << pos << " with " << threads << " threads";
    }
  }
  set_num_threads(0);
}

// Every token routed to one expert (a hot expert with several row blocks) and the same token alone.
TEST(ExpertFfn, batch_invariant_with_a_hot_expert) {
  const int64_t T = 150, H = 1040, I = 24;  // > 1 row block and > 1 K block in both passes
  Batch b(T, 1, 2, H, I);
  for (int64_t t = 0; t < T; ++t) b.ids.view().data_as<int32_t>()[t] = 1;
  OwnedTensor all(DType::kF32, {T, 1, H});
  ASSERT_TRUE(b.run(all.view(), 0, 2).ok());
  for (int64_t t : {int64_t{0}, int64_t{77}, T - 1}) {
    OwnedTensor one(DType::kF32, {1, 1, H});
    ASSERT_TRUE(ops::expert_ffn(b.x.view().slice0(t, t + 1), b.ids.view().slice0(t, t + 1), b.wg.view(), b.wu.view(),
                                b.wd.view(), 0, 2, one.view())
                    .ok());
    EXPECT_EQ(0, std::memcmp(one.data(), all.view().data_as<float>() + t * H, H * sizeof(float))) << "token " << t;
  }
}

TEST(ExpertFfn, bit_identical_across_thread_counts) {
  Batch b(40, 4, 8, 256, 96);
  OwnedTensor ref(DType::kF32, {40, 4, 256});
  set_num_threads(1);
  ASSERT_TRUE(b.run(ref.view(), 0, 8).ok());
  for (int threads : {2, 3, 5}) {
    set_num_threads(threads);
    OwnedTensor out(DType::kF32, {40, 4, 256});
    ASSERT_TRUE(b.run(out.view(), 0, 8).ok());
    EXPECT_EQ(ref.bytes(), out.bytes()) << threads << " threads";
  }
  set_num_threads(0);
}

// A dense (or shared) SwiGLU MLP as expert_ffn with one expert equals linear(gate) and linear(up) into
// one [T, 2I] buffer, silu_and_mul, linear(down), bit for bit.
TEST(ExpertFfn, one_expert_equals_linear_silu_and_mul_linear) {
  const int64_t T = 7, H = 160, I = 56;
  Batch b(T, 1, 1, H, I);
  for (int64_t t = 0; t < T; ++t) b.ids.view().data_as<int32_t>()[t] = 0;
  OwnedTensor ffn(DType::kBF16, {T, 1, H}), gate_up(DType::kF32, {T, 2 * I}), act(DType::kF32, {T, I}),
      dense(DType::kBF16, {T, H});
  ASSERT_TRUE(b.run(ffn.view(), 0, 1).ok());
  const TensorView gate = TensorView::strided(gate_up.data(), DType::kF32, {T, I}, {2 * I, 1});
  const TensorView up = TensorView::strided(static_cast<float*>(gate_up.data()) + I, DType::kF32, {T, I}, {2 * I, 1});
  ASSERT_TRUE(ops::linear(b.x.view(), TensorView(b.wg.data(), DType::kBF16, {I, H}), gate).ok());
  ASSERT_TRUE(ops::linear(b.x.view(), TensorView(b.wu.data(), DType::kBF16, {I, H}), up).ok());
  ASSERT_TRUE(ops::silu_and_mul(gate_up.view(), act.view()).ok());
  ASSERT_TRUE(ops::linear(act.view(), TensorView(b.wd.data(), DType::kBF16, {H, I}), dense.view()).ok());
  EXPECT_EQ(0, std::memcmp(ffn.data(), dense.data(), static_cast<size_t>(T * H) * 2));
}

// The clamp is applied in fp32 to the fp32 projections, before the activation: a dense expert with a limit
// equals linear (gate and up), min / clamp in fp32, silu_and_mul, linear (down), bit for bit.
TEST(ExpertFfn, swiglu_limit_equals_linear_clamp_silu_and_mul_linear) {
  const int64_t T = 7, H = 160, I = 56;
  const float limit = 0.5f;
  Batch b(T, 1, 1, H, I);
  for (int64_t t = 0; t < T; ++t) b.ids.view().data_as<int32_t>()[t] = 0;
  OwnedTensor ffn(DType::kBF16, {T, 1, H}), gate_up(DType::kF32, {T, 2 * I}), act(DType::kF32, {T, I}),
      dense(DType::kBF16, {T, H});
  ASSERT_TRUE(b.run(ffn.view(), 0, 1, limit).ok());
  const TensorView gate = TensorView::strided(gate_up.data(), DType::kF32, {T, I}, {2 * I, 1});
  const TensorView up = TensorView::strided(static_cast<float*>(gate_up.data()) + I, DType::kF32, {T, I}, {2 * I, 1});
  ASSERT_TRUE(ops::linear(b.x.view(), TensorView(b.wg.data(), DType::kBF16, {I, H}), gate).ok());
  ASSERT_TRUE(ops::linear(b.x.view(), TensorView(b.wu.data(), DType::kBF16, {I, H}), up).ok());
  int64_t above = 0, below = 0;
  float* gu = static_cast<float*>(gate_up.data());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      float& g = gu[t * 2 * I + i];
      float& u = gu[t * 2 * I + I + i];
      above += (g > limit) + (u > limit);
      below += u < -limit;
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
  }
  EXPECT_GT(above, 0);
  EXPECT_GT(below, 0);
  ASSERT_TRUE(ops::silu_and_mul(gate_up.view(), act.view()).ok());
  ASSERT_TRUE(ops::linear(act.view(), TensorView(b.wd.data(), DType::kBF16, {H, I}), dense.view()).ok());
  EXPECT_EQ(0, std::memcmp(ffn.data(), dense.data(), static_cast<size_t>(T * H) * 2));
}

// +inf (the default) clamps nothing: the unclamped bits, per-expert and stacked forms alike; a limit above
// every |g| and |u| gives the same bits too.
TEST(ExpertFfn, infinite_swiglu_limit_gives_the_unclamped_bits) {
  Batch b(19, 4, 8, 96, 40);
  OwnedTensor def(DType::kBF16, {19, 4, 96}), inf(DType::kBF16, {19, 4, 96}), big(DType::kBF16, {19, 4, 96}),
      views(DType::kBF16, {19, 4, 96});
  ASSERT_TRUE(ops::expert_ffn(b.x.view(), b.ids.view(), b.wg.view(), b.wu.view(), b.wd.view(), 0, 8, def.view()).ok());
  ASSERT_TRUE(b.run(inf.view(), 0, 8, std::numeric_limits<float>::infinity()).ok());
  ASSERT_TRUE(b.run(big.view(), 0, 8, 1e30f).ok());
  EXPECT_EQ(def.bytes(), inf.bytes());
  EXPECT_EQ(def.bytes(), big.bytes());
  std::vector<ops::ExpertWeights> experts;
  for (int64_t e = 0; e < 8; ++e) {
    experts.push_back({TensorView(static_cast<bf16_t*>(b.wg.data()) + e * 40 * 96, DType::kBF16, {40, 96}),
                       TensorView(static_cast<bf16_t*>(b.wu.data()) + e * 40 * 96, DType::kBF16, {40, 96}),
                       TensorView(static_cast<bf16_t*>(b.wd.data()) + e * 96 * 40, DType::kBF16, {96, 40})});
  }
  ASSERT_TRUE(ops::expert_ffn(b.x.view(), b.ids.view(), experts, 0, 8, views.view(), ops::kNoSwigluLimit).ok());
  EXPECT_EQ(def.bytes(), views.bytes());
  // And a finite limit is batch-invariant and split-invariant like the rest of the op.
  OwnedTensor whole(DType::kBF16, {19, 4, 96}), split(DType::kBF16, {19, 4, 96});
  ASSERT_TRUE(b.run(whole.view(), 0, 8, 0.5f).ok());
  ASSERT_TRUE(b.run(split.view(), 0, 3, 0.5f).ok());
  ASSERT_TRUE(b.run(split.view(), 3, 8, 0.5f).ok());
  EXPECT_EQ(whole.bytes(), split.bytes());
  EXPECT_NE(whole.bytes(), def.bytes());
}

TEST(ExpertFfn, strided_x_ids_and_out) {
  const int64_t T = 6, k = 2, E = 4, H = 80, I = 24;
  Batch b(T, k, E, H, I, DType::kF32);
  OwnedTensor ref(DType::kF32, {T, k, H});
  ASSERT_TRUE(b.run(ref.view(), 0, E).ok());
  // x with every other column, ids transposed in memory, out with padded rows.
  OwnedTensor xs(DType::kF32, {T, 2 * H}), ids_t(DType::kI32, {k, T}), outs(DType::kF32, {T, k, H + 8});
  const TensorView x = TensorView::strided(xs.data(), DType::kF32, {T, H}, {2 * H, 2});
  const TensorView ids = TensorView::strided(ids_t.data(), DType::kI32, {T, k}, {1, T});
  const TensorView out = TensorView::strided(outs.data(), DType::kF32, {T, k, H}, {k * (H + 8), H + 8, 1});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) x.data_as<float>()[t * 2 * H + 2 * h] = b.x.view().data_as<float>()[t * H + h];
    for (int64_t j = 0; j < k; ++j) ids.data_as<int32_t>()[t + j * T] = b.id(t, j);
  }
  ASSERT_TRUE(ops::expert_ffn(x, ids, b.wg.view(), b.wu.view(), b.wd.view(), 0, E, out).ok());
  EXPECT_EQ(to_doubles(out), to_doubles(ref.view()));
}

TEST(ExpertFfn, empty_inputs) {
  Batch b(3, 2, 4, 32, 16);
  OwnedTensor out(DType::kF32, {3, 2, 32});
  fill_uniform(out.view(), 3);
  const auto before = out.bytes();
  EXPECT_TRUE(b.run(out.view(), 2, 2).ok());  // empty range
  EXPECT_TRUE(ops::expert_ffn(TensorView(b.x.data(), DType::kBF16, {0, 32}), TensorView(b.ids.data(), DType::kI32, {0, 2}),
                              b.wg.view(), b.wu.view(), b.wd.view(), 0, 4, TensorView(out.data(), DType::kF32, {0, 2, 32}))
                  .ok());
  for (int64_t i = 0; i < 6; ++i) b.ids.view().data_as<int32_t>()[i] = 3;
  EXPECT_TRUE(b.run(out.view(), 0, 3).ok());  // nothing routed into the range
  EXPECT_EQ(out.bytes(), before);
  // I = 0: every routed slot is an empty sum.
  OwnedTensor g0(DType::kBF16, {4, 0, 32}), d0(DType::kBF16, {4, 32, 0});
  ASSERT_TRUE(ops::expert_ffn(b.x.view(), b.ids.view(), g0.view(), g0.view(), d0.view(), 0, 4, out.view()).ok());
  for (double v : to_doubles(out.view())) EXPECT_EQ(v, 0.0);
}

TEST(ExpertFfn, invalid_arguments) {
  Batch b(2, 2, 4, 64, 32);
  OwnedTensor out(DType::kF32, {2, 2, 64});
  fill_uniform(out.view(), 7);
  const auto before = out.bytes();
  const TensorView x = b.x.view(), ids = b.ids.view(), wg = b.wg.view(), wu = b.wu.view(), wd = b.wd.view(),
                   o = out.view();
  auto expect_error = [&](const std::string& message, const Status& st) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(out.bytes(), before) << "out written on error: " << message;
  };
  auto call = [&](const TensorView& xv, const TensorView& iv, const TensorView& g, const TensorView& u,
                  const TensorView& d, int64_t b0, int64_t b1, const TensorView& ov) {
    return ops::expert_ffn(xv, iv, g, u, d, b0, b1, ov);
  };
  std::vector<int64_t> i64(64);
  expect_error("expert_ffn: x has rank 3 but must have rank 2 ([T, H])",
               call(TensorView(b.x.data(), DType::kBF16, {1, 2, 64}), ids, wg, wu, wd, 0, 4, o));
  expect_error("expert_ffn: topk_ids has dtype int64 but must be int32",
               call(x, TensorView(i64.data(), DType::kI64, {2, 2}), wg, wu, wd, 0, 4, o));
  expect_error("expert_ffn: topk_ids has shape [3, 2] but must be [2, 2] ([T, k] with T = x's rows)",
               call(x, TensorView(b.ids.data(), DType::kI32, {3, 2}), wg, wu, wd, 0, 4, o));
  expect_error("expert_ffn: expert range [3, 1) is invalid; it must satisfy 0 <= expert_begin <= expert_end",
               call(x, ids, wg, wu, wd, 3, 1, o));
  expect_error("expert_ffn: expert range [-1, 2) is invalid; it must satisfy 0 <= expert_begin <= expert_end",
               call(x, ids, wg, wu, wd, -1, 2, o));
  expect_error("expert_ffn: out has shape [2, 2, 63] but must be [2, 2, 64] ([T, k, H] from x [T, H] and topk_ids [T, k])",
               call(x, ids, wg, wu, wd, 0, 4, TensorView(out.data(), DType::kF32, {2, 2, 63})));
  expect_error("expert_ffn: out has dtype int64 but must be fp32, fp16 or bf16",
               call(x, ids, wg, wu, wd, 0, 4, TensorView(i64.data(), DType::kI64, {2, 2, 64})));
  expect_error("expert_ffn: w_gate has rank 2 but must have rank 3 ([E_w, I, H])",
               call(x, ids, TensorView(b.wg.data(), DType::kBF16, {32, 64}), wu, wd, 0, 4, o));
  expect_error("expert_ffn: w_up has shape [4, 32, 63] but must be [4, 32, 64] ([E_w, I, H] with H = x's last "
               "dimension and E_w, I from w_gate)",
               call(x, ids, wg, TensorView(b.wu.data(), DType::kBF16, {4, 32, 63}), wd, 0, 4, o));
  expect_error("expert_ffn: w_down has shape [4, 32, 64] but must be [4, 64, 32] ([E_w, H, I] with H = x's last "
               "dimension and E_w, I from w_gate)",
               call(x, ids, wg, wu, TensorView(b.wd.data(), DType::kBF16, {4, 32, 64}), 0, 4, o));
  expect_error("expert_ffn: w_down has dtype fp16 but must have w_gate's dtype bf16",
               call(x, ids, wg, wu, TensorView(b.wd.data(), DType::kF16, {4, 64, 32}), 0, 4, o));
  expect_error("expert_ffn: w_gate has stride 2 along its last dimension but must have unit stride there (contiguous "
               "rows)",
               call(x, ids, TensorView::strided(b.wg.data(), DType::kBF16, {4, 32, 64}, {0, 0, 2}), wu, wd, 0, 4, o));
  expect_error("expert_ffn: w_gate holds 4 experts but the expert range [2, 5) needs exactly 3 (the range's own "
               "experts) or at least 5 (all experts up to the range's end)",
               call(x, ids, wg, wu, wd, 2, 5, o));
  expect_error("expert_ffn: out overlaps x in memory; outputs must not alias inputs",
               call(TensorView(out.data(), DType::kF32, {2, 64}), ids, wg, wu, wd, 0, 4, o));
  // Per-expert form.
  std::vector<ops::ExpertWeights> experts(2, ops::ExpertWeights{TensorView(b.wg.data(), DType::kBF16, {32, 64}),
                                                                TensorView(b.wu.data(), DType::kBF16, {32, 64}),
                                                                TensorView(b.wd.data(), DType::kBF16, {64, 32})});
  expect_error("expert_ffn: 2 expert weight sets given for expert range [0, 3); exactly one per expert in the range is "
               "required",
               ops::expert_ffn(x, ids, experts, 0, 3, o));
  experts[1].w_up = TensorView(b.wu.data(), DType::kBF16, {31, 64});
  expect_error("expert_ffn: experts[1].w_up has shape [31, 64] but must be [32, 64] ([I, H] with H = x's last "
               "dimension and I = experts[0].w_gate's rows)",
               ops::expert_ffn(x, ids, experts, 0, 2, o));
  experts[1].w_up = TensorView(b.wu.data(), DType::kF32, {32, 64});
  expect_error("expert_ffn: experts[1].w_up has dtype fp32 but must have experts[0].w_gate's dtype bf16",
               ops::expert_ffn(x, ids, experts, 0, 2, o));
  // swiglu_limit: > 0 or +inf, both forms.
  expect_error("expert_ffn: swiglu_limit is 0 but must be > 0 (+inf: no clamp)",
               ops::expert_ffn(x, ids, wg, wu, wd, 0, 4, o, 0.0f));
  expect_error("expert_ffn: swiglu_limit is -10 but must be > 0 (+inf: no clamp)",
               ops::expert_ffn(x, ids, wg, wu, wd, 0, 4, o, -10.0f));
  expect_error("expert_ffn: swiglu_limit is -inf but must be > 0 (+inf: no clamp)",
               ops::expert_ffn(x, ids, wg, wu, wd, 0, 4, o, -std::numeric_limits<float>::infinity()));
  expect_error("expert_ffn: swiglu_limit is nan but must be > 0 (+inf: no clamp)",
               ops::expert_ffn(x, ids, experts, 0, 2, o, std::numeric_limits<float>::quiet_NaN()));
}

}  // namespace
}  // namespace genbridge::testing
