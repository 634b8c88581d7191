// Contract test for linear_attention/gated_delta_rule; runs unchanged in every target build.
#include "genbridge/ops/linear_attention/gated_delta_rule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/linear_attention/gdn_gating.h"
#include "ops/common/linear_attention/linear_attention_ref.h"
#include "ops/linear_attention/gdn_harness.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

// The header's rel-L2 bound of each output row block (one token, one value head) and of each final state
// head against the fp64 per-token recurrence, for fp32 outputs (bf16 outputs add their rounding, 2^-8
// relative). accuracy_at_qwen35_head_size measures the worst row (8.8e-5 at T = 1024) and the mean.
constexpr double kBoundF32 = 3e-4;
constexpr double kBoundBf16Out = 3e-4 + 0x1p-8;
// The mean row rel-L2 at Qwen3.5's head size (measured 6.0e-7 at T = 1024): catches a systematic error
// that the worst-row bound, sized for rows whose output nearly cancels, would let through.
constexpr double kMeanBound = 3e-6;

struct Problem {
  int64_t nk = 2, nv = 4, dk = 32, dv = 32;
  std::vector<int> q_lens = {3};
  std::vector<int> slots = {0};
  int64_t num_slots = 1;
  DType in = DType::kBF16, out = DType::kF32;
  bool fresh = false;  // zero initial states
  uint64_t seed = 1;
};

struct Data {
  Problem p;
  SeqBatchTensors batch;
  int64_t T;
  OwnedTensor q, k, v, g, beta, state, out;
  float scale;
  explicit Data(const Problem& pr)
      : p(pr),
        batch(pr.q_lens, pr.slots),
        T(batch.num_tokens()),
        q(pr.in, {T, pr.nk, pr.dk}),
        k(pr.in, {T, pr.nk, pr.dk}),
        v(pr.in, {T, pr.nv, pr.dv}),
        g(DType::kF32, {T, pr.nv}),
        beta(DType::kF32, {T, pr.nv}),
        state(DType::kF32, {pr.num_slots, pr.nv, pr.dk, pr.dv}),
        out(pr.out, {T, pr.nv, pr.dv}),
        scale(1.0f / std::sqrt(static_cast<float>(pr.dk))) {
    fill_uniform(q.view(), p.seed, -1.f, 1.f);
    fill_uniform(k.view(), p.seed + 1, -1.f, 1.f);
    fill_uniform(v.view(), p.seed + 2, -1.f, 1.f);
    if (!p.fresh) fill_uniform(state.view(), p.seed + 3, -0.5f, 0.5f);
    // Qwen3.5-like gates: A_log = log(U(1, 16)), small dt_bias, a and b spread around 0.
    OwnedTensor a(DType::kF32, {T, p.nv}), b(DType::kF32, {T, p.nv}), A_log(DType::kF32, {p.nv}),
        dt_bias(DType::kF32, {p.nv});
    fill_uniform(a.view(), p.seed + 4, -4.f, 4.f);
    fill_uniform(b.view(), p.seed + 5, -4.f, 4.f);
    fill_uniform(A_log.view(), p.seed + 6, 1.f, 16.f);
    for (int64_t h = 0; h < p.nv; ++h) A_log.view().data_as<float>()[h] = std::log(A_log.view().data_as<float>()[h]);
    fill_uniform(dt_bias.view(), p.seed + 7, -0.5f, 0.5f);
    EXPECT_TRUE(ops::gdn_gating(a.view(), b.view(), A_log.view(), dt_bias.view(), g.view(), beta.view()).ok());
  }
  Status run() {
    return ops::gated_delta_rule(q.view(), k.view(), v.view(), g.view(), beta.view(), state.view(),
                                 batch.state_indices(), batch.query_start_loc(), scale, out.view());
  }
};

// The fp64 per-token recurrence of every sequence of `d` from `state_before`: outputs [T][nv][dv] and the
// final states [num_slots][nv][dk][dv].
void reference(Data& d, const std::vector<double>& state_before, std::vector<double>& out,
               std::vector<double>& state_after) {
  const Problem& p = d.p;
  const auto q = to_doubles(d.q.view()), k = to_doubles(d.k.view()), v = to_doubles(d.v.view());
  const auto g = to_doubles(d.g.view()), beta = to_doubles(d.beta.view());
  out.assign(static_cast<size_t>(d.T * p.nv * p.dv), 0.0);
  state_after = state_before;
  const int64_t slot_elems = p.nv * p.dk * p.dv;
  for (int64_t s = 0; s < d.batch.num_seqs(); ++s) {
    const int64_t r0 = d.batch.starts[s], r1 = d.batch.starts[s + 1];
    std::vector<double> st(state_after.begin() + d.batch.slots[s] * slot_elems,
                           state_after.begin() + (d.batch.slots[s] + 1) * slot_elems);
    std::vector<double> o;
    ref::gated_delta_rule(rows_of(q, p.nk * p.dk, r0, r1), rows_of(k, p.nk * p.dk, r0, r1),
                          rows_of(v, p.nv * p.dv, r0, r1), rows_of(g, p.nv, r0, r1), rows_of(beta, p.nv, r0, r1),
                          r1 - r0, p.nk, p.nv, p.dk, p.dv, d.scale, st, o);
    std::copy(st.begin(), st.end(), state_after.begin() + d.batch.slots[s] * slot_elems);
    std::copy(o.begin(), o.end(), out.begin() + r0 * p.nv * p.dv);
  }
}

// Runs `p` and checks outputs and states against the fp64 reference; returns the worst output rel-L2.
// `slack` widens the bounds for hostile shapes (a handful of terms per sum: rows whose output nearly cancels).
double check_against_reference(const Problem& p, double slack = 1.0) {
  Data d(p);
  const std::vector<double> before = to_doubles(d.state.view());
  EXPECT_TRUE(d.run().ok());
  std::vector<double> want_out, want_state;
  reference(d, before, want_out, want_state);
  const auto got = to_doubles(d.out.view()), got_state = to_doubles(d.state.view());
  const double bound = slack * (p.out == DType::kBF16 ? kBoundBf16Out : kBoundF32);
  double worst = 0;
  for (int64_t r = 0; r < d.T * p.nv; ++r) {
    const double e = rel_l2(got, want_out, r * p.dv, (r + 1) * p.dv);
    worst = std::max(worst, e);
    EXPECT_LE(e, bound) << "token " << r / p.nv << " head " << r % p.nv;
  }
  for (int64_t h = 0; h < p.num_slots * p.nv; ++h) {
    EXPECT_LE(rel_l2(got_state, want_state, h * p.dk * p.dv, (h + 1) * p.dk * p.dv), slack * kBoundF32) << "state head " << h;
  }
  return worst;
}

TEST(GatedDeltaRule, matches_fp64_reference) {
  for (int64_t group : {1, 2, 4}) {
    Problem p;
    p.nk = 2, p.nv = 2 * group, p.dk = 64, p.dv = 48;
    p.q_lens = {1, 5, 70, 0, 64};
    p.slots = {4, 0, 2, 1, 5};
    p.num_slots = 6;
    SCOPED_TRACE("group " + std::to_string(group));
    check_against_reference(p);
  }
}

TEST(GatedDeltaRule, dtypes_and_fresh_state) {
  for (DType in : {DType::kF32, DType::kBF16})
    for (DType out : {DType::kF32, DType::kBF16}) {
      Problem p;
      p.in = in, p.out = out, p.fresh = true;
      p.q_lens = {9, 1};
      p.slots = {1, 0};
      p.num_slots = 2;
      check_against_reference(p);
    }
}

TEST(GatedDeltaRule, prompt_longer_than_chunks) {
  Problem p;
  p.nk = 1, p.nv = 2, p.dk = 128, p.dv = 128;
  p.q_lens = {static_cast<int>(3 * ops::kGatedDeltaRuleChunk + 17)};
  p.fresh = true;
  check_against_reference(p);
}

// The test's fp32 per-token formula (the contract's steps and order; this file is built with -ffp-contract=off).
void token_formula(std::vector<float> q, std::vector<float> k, const float* v, float g, float b, float scale,
                   int64_t dk, int64_t dv, float* S, float* out) {
  float sk = 0.0f, sq = 0.0f;
  for (int64_t i = 0; i < dk; ++i) sk = sk + k[i] * k[i], sq = sq + q[i] * q[i];
  const float nk = std::sqrt(sk + 1e-6f), nq = std::sqrt(sq + 1e-6f);
  for (int64_t i = 0; i < dk; ++i) k[i] = k[i] / nk, q[i] = (q[i] / nq) * scale;
  const float a = std::exp(g);
  for (int64_t c = 0; c < dv; ++c) {
    float u = 0.0f;
    for (int64_t i = 0; i < dk; ++i) u = u + (a * S[i * dv + c]) * k[i];
    const float delta = b * (v[c] - u);
    float o = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      S[i * dv + c] = a * S[i * dv + c] + k[i] * delta;
      o = o + S[i * dv + c] * q[i];
    }
    out[c] = o;
  }
}

TEST(GatedDeltaRule, decode_is_the_fp32_per_token_formula_bit_for_bit) {
  Problem p;
  p.nk = 2, p.nv = 4, p.dk = 128, p.dv = 80;  // 80: four 16-column blocks of one kind, one of another
  p.q_lens = {1, 1, 1};
  p.slots = {2, 0, 1};
  p.num_slots = 3;
  p.in = DType::kF32;
  Data d(p);
  std::vector<float> state(d.state.view().numel());
  std::memcpy(state.data(), d.state.data(), state.size() * sizeof(float));
  ASSERT_TRUE(d.run().ok());
  const float* q = d.q.view().data_as<float>();
  const float* k = d.k.view().data_as<float>();
  const float* v = d.v.view().data_as<float>();
  std::vector<float> o(static_cast<size_t>(p.dv));
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t h = 0; h < p.nv; ++h) {
      const int64_t j = h / (p.nv / p.nk);
      const std::vector<float> qv(q + (s * p.nk + j) * p.dk, q + (s * p.nk + j + 1) * p.dk);
      const std::vector<float> kv(k + (s * p.nk + j) * p.dk, k + (s * p.nk + j + 1) * p.dk);
      float* S = state.data() + (p.slots[s] * p.nv + h) * p.dk * p.dv;
      token_formula(qv, kv, v + (s * p.nv + h) * p.dv, d.g.view().data_as<float>()[s * p.nv + h],
                    d.beta.view().data_as<float>()[s * p.nv + h], d.scale, p.dk, p.dv, S, o.data());
      ASSERT_EQ(std::memcmp(o.data(), d.out.view().data_as<float>() + (s * p.nv + h) * p.dv, o.size() * 4), 0)
          << "seq " << s << " head " << h;
    }
  EXPECT_EQ(std::memcmp(state.data(), d.state.data(), state.size() * sizeof(float)), 0) << "state";
}

// Splits rows [0, T) of `whole` into calls of `parts` tokens (one sequence in slot 0) and returns outputs.
std::vector<double> run_in_parts(const Problem& whole_problem, const std::vector<int>& parts, std::vector<double>& state) {
  Data whole(whole_problem);
  const int64_t nk = whole_problem.nk, nv = whole_problem.nv, dk = whole_problem.dk, dv = whole_problem.dv;
  std::vector<double> out;
  int64_t r0 = 0;
  for (int part : parts) {
    auto sub = [&](OwnedTensor& t, int64_t width, DType dt) {
      return TensorView(static_cast<char*>(t.data()) + r0 * width * dtype_size(dt), dt, {part, width});
    };
    std::vector<int32_t> si = {0}, qsl = {0, part};
    const TensorView q = sub(whole.q, nk * dk, whole_problem.in).reshaped({part, nk, dk});
    const TensorView k = sub(whole.k, nk * dk, whole_problem.in).reshaped({part, nk, dk});
    const TensorView v = sub(whole.v, nv * dv, whole_problem.in).reshaped({part, nv, dv});
    const TensorView o = sub(whole.out, nv * dv, whole_problem.out).reshaped({part, nv, dv});
    EXPECT_TRUE(ops::gated_delta_rule(q, k, v, sub(whole.g, nv, DType::kF32), sub(whole.beta, nv, DType::kF32),
                                      whole.state.view(), TensorView(si.data(), DType::kI32, {1}),
                                      TensorView(qsl.data(), DType::kI32, {2}), whole.scale, o)
                    .ok());
    r0 += part;
  }
  out = to_doubles(whole.out.view());
  state = to_doubles(whole.state.view());
  return out;
}

// Worst rel-L2 of an output row block (one token, one value head) at Qwen3.5's head size, for the chunked
// form (one call of T tokens) and for the per-token form (T calls of one token), printed for the header's bound.
TEST(GatedDeltaRule, accuracy_at_qwen35_head_size) {
  for (int T : {64, 256, 1024}) {
    for (bool fresh : {true, false}) {
      Problem p;
      p.nk = 1, p.nv = 4, p.dk = 128, p.dv = 128;
      p.q_lens = {T};
      p.fresh = fresh;
      p.seed = 100 + T;
      Data d(p);
      const std::vector<double> before = to_doubles(d.state.view());
      ASSERT_TRUE(d.run().ok());
      std::vector<double> want, want_state;
      reference(d, before, want, want_state);
      const auto chunked = to_doubles(d.out.view());
      std::vector<double> state_after;
      std::vector<int> ones(T, 1);
      const auto per_token = run_in_parts(p, ones, state_after);
      double worst_chunked = 0, worst_token = 0, sum_chunked = 0;
      for (int64_t r = 0; r < T * p.nv; ++r) {
        const double e = rel_l2(chunked, want, r * p.dv, (r + 1) * p.dv);
        worst_chunked = std::max(worst_chunked, e);
        sum_chunked += e;
        worst_token = std::max(worst_token, rel_l2(per_token, want, r * p.dv, (r + 1) * p.dv));
      }
      std::printf("gated_delta_rule accuracy T=%d %s state: chunked worst %.3g mean %.3g, per-token worst %.3g\n", T,
                  fresh ? "fresh" : "random", worst_chunked, sum_chunked / (T * p.nv), worst_token);
      EXPECT_LE(worst_chunked, kBoundF32);
      EXPECT_LE(worst_token, kBoundF32);
      EXPECT_LE(sum_chunked / (T * p.nv), kMeanBound);
    }
  }
}

TEST(GatedDeltaRule, continues_state_across_calls) {
  Problem p;
  p.nk = 1, p.nv = 2, p.dk = 64, p.dv = 64;
  p.q_lens = {200};
  std::vector<double> s1, s2, s3;
  const auto one = run_in_parts(p, {200}, s1);
  const auto split = run_in_parts(p, {64, 37, 1, 90, 1, 1, 6}, s2);
  const auto decode_after = run_in_parts(p, {195, 1, 1, 1, 1, 1}, s3);
  for (int64_t r = 0; r < 200 * p.nv; ++r) {
    EXPECT_LE(rel_l2(split, one, r * p.dv, (r + 1) * p.dv), 2 * kBoundF32) << r;
    EXPECT_LE(rel_l2(decode_after, one, r * p.dv, (r + 1) * p.dv), 2 * kBoundF32) << r;
  }
  EXPECT_LE(rel_l2(s2, s1, 0, s1.size()), 2 * kBoundF32);
  EXPECT_LE(rel_l2(s3, s1, 0, s1.size()), 2 * kBoundF32);
}

TEST(GatedDeltaRule, each_sequence_as_if_alone) {
  Problem p;
  p.nk = 2, p.nv = 4, p.dk = 32, p.dv = 48;
  p.q_lens = {70, 1, 0, 5, 130};
  p.slots = {3, 1, 0, 4, 2};
  p.num_slots = 5;
  Data all(p);
  ASSERT_TRUE(all.run().ok());
  for (size_t s = 0; s < p.q_lens.size(); ++s) {
    Data alone(p);  // same inputs and states; only sequence s is run
    const int64_t r0 = all.batch.starts[s], len = p.q_lens[s];
    std::vector<int32_t> si = {p.slots[s]}, qsl = {0, static_cast<int32_t>(len)};
    auto rows = [&](OwnedTensor& t, int64_t width, DType dt) {
      return static_cast<char*>(t.data()) + r0 * width * dtype_size(dt);
    };
    ASSERT_TRUE(ops::gated_delta_rule(
                    TensorView(rows(alone.q, p.nk * p.dk, p.in), p.in, {len, p.nk, p.dk}),
                    TensorView(rows(alone.k, p.nk * p.dk, p.in), p.in, {len, p.nk, p.dk}),
                    TensorView(rows(alone.v, p.nv * p.dv, p.in), p.in, {len, p.nv, p.dv}),
                    TensorView(rows(alone.g, p.nv, DType::kF32), DType::kF32, {len, p.nv}),
                    TensorView(rows(alone.beta, p.nv, DType::kF32), DType::kF32, {len, p.nv}), alone.state.view(),
                    TensorView(si.data(), DType::kI32, {1}), TensorView(qsl.data(), DType::kI32, {2}), alone.scale,
                    TensorView(rows(alone.out, p.nv * p.dv, p.out), p.out, {len, p.nv, p.dv}))
                    .ok());
    const size_t row_bytes = static_cast<size_t>(p.nv * p.dv) * dtype_size(p.out);
    EXPECT_EQ(std::memcmp(rows(alone.out, p.nv * p.dv, p.out), rows(all.out, p.nv * p.dv, p.out), len * row_bytes), 0)
        << "sequence " << s;
    const size_t slot_bytes = static_cast<size_t>(p.nv * p.dk * p.dv) * 4;
    EXPECT_EQ(std::memcmp(static_cast<char*>(alone.state.data()) + p.slots[s] * slot_bytes,
                          static_cast<char*>(all.state.data()) + p.slots[s] * slot_bytes, slot_bytes),
              0)
        << "state of sequence " << s;
  }
}

TEST(GatedDeltaRule, bit_identical_across_thread_counts) {
  Problem p;
  p.nk = 2, p.nv = 8, p.dk = 64, p.dv = 64;
  p.q_lens = {100, 1, 1, 33};
  p.slots = {0, 1, 2, 3};
  p.num_slots = 4;
  set_num_threads(1);
  Data d1(p);
  ASSERT_TRUE(d1.run().ok());
  for (int threads : {2, 3, 5}) {
    set_num_threads(threads);
    Data d(p);
    ASSERT_TRUE(d.run().ok());
    EXPECT_EQ(d.out.bytes(), d1.out.bytes()) << threads;
    EXPECT_EQ(d.state.bytes(), d1.state.bytes()) << threads;
  }
  set_num_threads(0);
}

TEST(GatedDeltaRule, hostile_sizes) {
  for (auto [dk, dv] : {std::pair<int64_t, int64_t>{1, 1}, {3, 17}, {17, 3}, {16, 129}}) {
    Problem p;
    p.nk = 1, p.nv = 3, p.dk = dk, p.dv = dv;
    p.q_lens = {0, 2, 1, 65};
    p.slots = {0, 1, 2, 3};
    p.num_slots = 4;
    SCOPED_TRACE(std::to_string(dk) + " x " + std::to_string(dv));
    check_against_reference(p, 10.0);
  }
  Problem empty;
  empty.q_lens = {};
  empty.slots = {};
  Data d(empty);
  EXPECT_TRUE(d.run().ok());
  Problem zeros;
  zeros.q_lens = {0, 0};
  zeros.slots = {1, 0};
  zeros.num_slots = 2;
  Data z(zeros);
  const auto before = z.state.bytes();
  EXPECT_TRUE(z.run().ok());
  EXPECT_EQ(z.state.bytes(), before);
}

TEST(GatedDeltaRule, invalid_arguments) {
  Problem p;
  p.q_lens = {2, 1};
  p.slots = {1, 0};
  p.num_slots = 3;
  Data d(p);
  fill_uniform(d.out.view(), 9);
  const auto out_before = d.out.bytes(), state_before = d.state.bytes();
  const TensorView q = d.q.view(), k = d.k.view(), v = d.v.view(), g = d.g.view(), beta = d.beta.view(),
                   state = d.state.view(), out = d.out.view();
  std::vector<int32_t> si = {1, 0}, qsl = {0, 2, 3};
  const TensorView siv(si.data(), DType::kI32, {2}), qslv(qsl.data(), DType::kI32, {3});
  auto expect_error = [&](const std::string& message, const TensorView& qq, const TensorView& kk, const TensorView& vv,
                          const TensorView& gg, const TensorView& bb, const TensorView& ss, const TensorView& ii,
                          const TensorView& ll, float scale, const TensorView& oo) {
    const Status st = ops::gated_delta_rule(qq, kk, vv, gg, bb, ss, ii, ll, scale, oo);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(d.out.bytes(), out_before) << "out written on error: " << message;
    EXPECT_EQ(d.state.bytes(), state_before) << "state written on error: " << message;
  };
  const float sc = d.scale;
  std::vector<float> f32(4096);
  std::vector<uint16_t> bf(4096);
  expect_error("gated_delta_rule: state has dtype bf16 but must be fp32 (the state's dtype)", q, k, v, g, beta,
               TensorView(bf.data(), DType::kBF16, {3, 4, 32, 32}), siv, qslv, sc, out);
  expect_error(
      "gated_delta_rule: state has shape [3, 4, 32, 16] but must be [num_slots >= 1, 4, 32, 32] ([num_slots, nv, dk, dv])",
      q, k, v, g, beta, TensorView(f32.data(), DType::kF32, {3, 4, 32, 16}), siv, qslv, sc, out);
  expect_error("gated_delta_rule: state is not contiguous; state slots must be contiguous", q, k, v, g, beta,
               TensorView::strided(d.state.data(), DType::kF32, {2, 4, 32, 32}, {8192, 1024, 32, 1}), siv, qslv, sc,
               out);
  std::vector<int32_t> si_bad = {1, 3}, si_dup = {0, 0}, qsl_bad0 = {1, 2, 3}, qsl_dec = {0, 2, 1}, qsl_end = {0, 1, 2};
  expect_error("gated_delta_rule: state_indices[1] is 3 but must be in [0, 3) (the state's slots)", q, k, v, g, beta,
               state, TensorView(si_bad.data(), DType::kI32, {2}), qslv, sc, out);
  expect_error("gated_delta_rule: state_indices[1] is 0, as is state_indices[0]; each sequence needs its own state slot",
               q, k, v, g, beta, state, TensorView(si_dup.data(), DType::kI32, {2}), qslv, sc, out);
  expect_error("gated_delta_rule: query_start_loc[0] is 1 but must be 0", q, k, v, g, beta, state, siv,
               TensorView(qsl_bad0.data(), DType::kI32, {3}), sc, out);
  expect_error(
      "gated_delta_rule: query_start_loc[2] = 1 is less than query_start_loc[1] = 2; it must be non-decreasing", q, k,
      v, g, beta, state, siv, TensorView(qsl_dec.data(), DType::kI32, {3}), sc, out);
  expect_error("gated_delta_rule: query_start_loc[2] is 2 but must equal the number of query tokens 3", q, k, v, g,
               beta, state, siv, TensorView(qsl_end.data(), DType::kI32, {3}), sc, out);
  expect_error("gated_delta_rule: query_start_loc has shape [2] but must be [3] (num_seqs + 1)", q, k, v, g, beta,
               state, siv, TensorView(qsl.data(), DType::kI32, {2}), sc, out);
  expect_error("gated_delta_rule: state_indices has dtype fp32 but must be int32", q, k, v, g, beta, state,
               TensorView(f32.data(), DType::kF32, {2}), qslv, sc, out);
  expect_error("gated_delta_rule: scale is 0 but must be finite and > 0", q, k, v, g, beta, state, siv, qslv, 0.f, out);
  expect_error("gated_delta_rule: scale is nan but must be finite and > 0", q, k, v, g, beta, state, siv, qslv, NAN,
               out);
  expect_error(
      "gated_delta_rule: v has shape [3, 3, 32] but must be [3, nv, dv] with dv >= 1 and nv a positive multiple of nk "
      "= 2 (grouped values)",
      q, k, TensorView(v.data(), DType::kBF16, {3, 3, 32}), g, beta, state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: k has shape [3, 2, 16] but must be [3, 2, 32] (q's shape [T, nk, dk])", q,
               TensorView(k.data(), DType::kBF16, {3, 2, 16}), v, g, beta, state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: q has dtype fp16 but must be fp32 or bf16", TensorView(bf.data(), DType::kF16, {3, 2, 32}),
               k, v, g, beta, state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: g has dtype bf16 but must be fp32", q, k, v, TensorView(bf.data(), DType::kBF16, {3, 4}),
               beta, state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: beta has shape [3, 2] but must be [3, 4] ([T, nv])", q, k, v, g,
               TensorView(f32.data(), DType::kF32, {3, 2}), state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: out has shape [3, 4, 16] but must be [3, 4, 32] (v's shape [T, nv, dv])", q, k, v, g,
               beta, state, siv, qslv, sc, TensorView(f32.data(), DType::kF32, {3, 4, 16}));
  expect_error("gated_delta_rule: q has shape [3, 0, 32] but nk and dk must be >= 1",
               TensorView(q.data(), DType::kBF16, {3, 0, 32}), k, v, g, beta, state, siv, qslv, sc, out);
  expect_error("gated_delta_rule: out overlaps v in memory; outputs must not alias inputs", q, k, v, g, beta, state,
               siv, qslv, sc, TensorView(v.data(), DType::kBF16, {3, 4, 32}));
  expect_error("gated_delta_rule: state overlaps g in memory; outputs must not alias inputs", q, k, v, g, beta,
               TensorView(g.data(), DType::kF32, {3, 4, 32, 32}), siv, qslv, sc, out);
  expect_error("gated_delta_rule: q has stride 2 along its last dimension but must have unit stride there (contiguous rows)",
               TensorView::strided(q.data(), DType::kBF16, {3, 2, 16}, {64, 32, 2}),
               TensorView(k.data(), DType::kBF16, {3, 2, 16}), v, g, beta,
               TensorView(f32.data(), DType::kF32, {1, 4, 16, 32}), siv, qslv, sc, out);
}

}  // namespace
}  // namespace genbridge::testing
