// Contract test for moe/moe_combine; runs unchanged in every target build.
#include "genbridge/ops/moe/moe_combine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/moe/expert_ffn.h"
#include "genbridge/ops/moe/topk_router.h"
#include "support/each_cpu_target.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

struct Inputs {
  int64_t T, k, H;
  OwnedTensor eo, w, shared, gate;
  Inputs(int64_t T_, int64_t k_, int64_t H_, DType d, uint64_t seed = 1)
      : T(T_), k(k_), H(H_), eo(d, {T_, k_, H_}), w(DType::kF32, {T_, k_}), shared(d, {T_, H_}), gate(DType::kF32, {T_, 1}) {
    fill_uniform(eo.view(), seed, -3.f, 3.f);
    fill_uniform(w.view(), seed + 1, 0.f, 1.f);
    fill_uniform(shared.view(), seed + 2, -3.f, 3.f);
    fill_uniform(gate.view(), seed + 3, -4.f, 4.f);
  }
};

// The contract's arithmetic, written out in scalar fp32 (this file is built with -ffp-contract=off too).
std::vector<float> expected(Inputs& in, bool with_shared, bool with_gate) {
  const std::vector<double> eo = to_doubles(in.eo.view()), w = to_doubles(in.w.view()),
                            sh = to_doubles(in.shared.view()), g = to_doubles(in.gate.view());
  std::vector<float> out(static_cast<size_t>(in.T * in.H));
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t h = 0; h < in.H; ++h) {
      float acc = 0.f;
      for (int64_t j = 0; j < in.k; ++j) {
        const float p = static_cast<float>(w[t * in.k + j]) * static_cast<float>(eo[(t * in.k + j) * in.H + h]);
        acc = acc + p;
      }
      if (with_shared) {
        const float s = with_gate ? 1.0f / (1.0f + std::exp(-static_cast<float>(g[t]))) : 1.0f;
        const float p = s * static_cast<float>(sh[t * in.H + h]);
        acc = acc + p;
      }
      out[t * in.H + h] = acc;
    }
  return out;
}

void check_slot_order_bits() {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int mode = 0; mode < 3; ++mode) {
      Inputs in(13, 8, 100, d);
      OwnedTensor out(DType::kF32, {13, 100});
      const TensorView sv = in.shared.view(), gv = in.gate.view();
      const auto eo0 = in.eo.bytes(), w0 = in.w.bytes();
      ASSERT_TRUE(ops::moe_combine(in.eo.view(), in.w.view(), out.view(), mode >= 1 ? &sv : nullptr,
                                   mode == 2 ? &gv : nullptr)
                      .ok());
      const std::vector<float> want = expected(in, mode >= 1, mode == 2);
      EXPECT_EQ(0, std::memcmp(out.data(), want.data(), want.size() * sizeof(float)))
          << dtype_name(d) << " mode " << mode;
      EXPECT_EQ(in.eo.bytes(), eo0);
      EXPECT_EQ(in.w.bytes(), w0);
    }
  }
}

TEST(MoeCombine, slot_order_fp32_sum_bit_exact) { check_slot_order_bits(); }

// The same scalar bits whichever CPU target runs the vectorised sum (H = 100: whole 16-lane blocks and a tail).
TEST(MoeCombine, slot_order_fp32_sum_bit_exact_on_every_cpu_target) {
  for_each_cpu_target([](const std::string&) { check_slot_order_bits(); });
}

// Against the exact (fp64) weighted sum, and rounded once to a bf16 output.
TEST(MoeCombine, matches_fp64_reference) {
  Inputs in(9, 4, 2048, DType::kBF16);
  OwnedTensor out(DType::kBF16, {9, 2048});
  const TensorView sv = in.shared.view(), gv = in.gate.view();
  ASSERT_TRUE(ops::moe_combine(in.eo.view(), in.w.view(), out.view(), &sv, &gv).ok());
  const std::vector<double> eo = to_doubles(in.eo.view()), w = to_doubles(in.w.view()), sh = to_doubles(sv),
                            g = to_doubles(gv), got = to_doubles(out.view());
  for (int64_t t = 0; t < 9; ++t)
    for (int64_t h = 0; h < 2048; ++h) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < 4; ++j) {
        s += w[t * 4 + j] * eo[(t * 4 + j) * 2048 + h];
        a += std::abs(w[t * 4 + j] * eo[(t * 4 + j) * 2048 + h]);
      }
      const double gs = 1.0 / (1.0 + std::exp(-g[t])) * sh[t * 2048 + h];
      s += gs;
      a += std::abs(gs);
      ASSERT_NEAR(got[t * 2048 + h], s, 12 * 0x1p-24 * a + rounding_bound(DType::kBF16, s)) << t << ", " << h;
    }
}

// The attention side of AFD combines what the FFN ranks return; routed with the real router and
// computed on two expert ranges, the result equals the monolithic run bit for bit.
TEST(MoeCombine, afd_split_ranks_equal_monolithic) {
  const int64_t T = 11, E = 8, k = 2, H = 64, I = 32;
  OwnedTensor x(DType::kBF16, {T, H}), logits(DType::kF32, {T, E}), ids(DType::kI32, {T, k}), w(DType::kF32, {T, k}),
      wg(DType::kBF16, {E, I, H}), wu(DType::kBF16, {E, I, H}), wd(DType::kBF16, {E, H, I});
  uint64_t seed = 40;
  for (auto* t : {&x, &logits, &wg, &wu, &wd}) fill_uniform(t->view(), ++seed, -0.5f, 0.5f);
  ASSERT_TRUE(ops::topk_router(logits.view(), true, ids.view(), w.view()).ok());
  OwnedTensor mono_eo(DType::kBF16, {T, k, H}), afd_eo(DType::kBF16, {T, k, H}), mono(DType::kBF16, {T, H}),
      afd(DType::kBF16, {T, H});
  ASSERT_TRUE(ops::expert_ffn(x.view(), ids.view(), wg.view(), wu.view(), wd.view(), 0, E, mono_eo.view()).ok());
  ASSERT_TRUE(ops::moe_combine(mono_eo.view(), w.view(), mono.view()).ok());
  // Two FFN ranks, each with its own weights slice, writing their slots of the returned buffer.
  for (int64_t f = 0; f < 2; ++f) {
    auto slice = [&](OwnedTensor& t, int64_t a, int64_t b) {
      return TensorView(static_cast<bf16_t*>(t.data()) + f * (E / 2) * a * b, DType::kBF16, {E / 2, a, b});
    };
    ASSERT_TRUE(ops::expert_ffn(x.view(), ids.view(), slice(wg, I, H), slice(wu, I, H), slice(wd, H, I), f * E / 2,
                                (f + 1) * E / 2, afd_eo.view())
                    .ok());
  }
  ASSERT_TRUE(ops::moe_combine(afd_eo.view(), w.view(), afd.view()).ok());
  EXPECT_EQ(mono.bytes(), afd.bytes());
}

TEST(MoeCombine, strided_inputs_and_output) {
  Inputs in(5, 3, 40, DType::kF32);
  OwnedTensor ref(DType::kF32, {5, 40});
  const TensorView sv = in.shared.view();
  ASSERT_TRUE(ops::moe_combine(in.eo.view(), in.w.view(), ref.view(), &sv).ok());
  // expert_out stored [k, T, H] and viewed as [T, k, H]; weights transposed; output rows padded; gate as [T].
  OwnedTensor eo_t(DType::kF32, {3, 5, 40}), w_t(DType::kF32, {3, 5}), out_pad(DType::kF32, {5, 48});
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t j = 0; j < 3; ++j) {
      w_t.view().data_as<float>()[j * 5 + t] = in.w.view().data_as<float>()[t * 3 + j];
      std::memcpy(eo_t.view().data_as<float>() + (j * 5 + t) * 40, in.eo.view().data_as<float>() + (t * 3 + j) * 40, 160);
    }
  const TensorView eo = TensorView::strided(eo_t.data(), DType::kF32, {5, 3, 40}, {40, 200, 1});
  const TensorView w = TensorView::strided(w_t.data(), DType::kF32, {5, 3}, {1, 5});
  const TensorView out = TensorView::strided(out_pad.data(), DType::kF32, {5, 40}, {48, 1});
  ASSERT_TRUE(ops::moe_combine(eo, w, out, &sv).ok());
  EXPECT_EQ(to_doubles(out), to_doubles(ref.view()));
}

TEST(MoeCombine, batch_invariant_and_thread_independent) {
  Inputs in(37, 8, 512, DType::kBF16);
  OwnedTensor all(DType::kF32, {37, 512});
  set_num_threads(1);
  ASSERT_TRUE(ops::moe_combine(in.eo.view(), in.w.view(), all.view()).ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    OwnedTensor again(DType::kF32, {37, 512});
    ASSERT_TRUE(ops::moe_combine(in.eo.view(), in.w.view(), again.view()).ok());
    EXPECT_EQ(all.bytes(), again.bytes());
  }
  set_num_threads(0);
  OwnedTensor one(DType::kF32, {1, 512});
  ASSERT_TRUE(ops::moe_combine(in.eo.view().slice0(20, 21), in.w.view().slice0(20, 21), one.view()).ok());
  EXPECT_EQ(0, std::memcmp(one.data(), all.view().data_as<float>() + 20 * 512, 512 * sizeof(float)));
}

TEST(MoeCombine, empty_inputs) {
  Inputs in(2, 2, 8, DType::kF32);
  OwnedTensor out(DType::kF32, {2, 8});
  fill_uniform(out.view(), 1);
  const auto before = out.bytes();
  EXPECT_TRUE(ops::moe_combine(TensorView(in.eo.data(), DType::kF32, {0, 2, 8}), TensorView(in.w.data(), DType::kF32, {0, 2}),
                               TensorView(out.data(), DType::kF32, {0, 8}))
                  .ok());
  EXPECT_EQ(out.bytes(), before);
  // k = 0: an empty sum.
  ASSERT_TRUE(ops::moe_combine(TensorView(in.eo.data(), DType::kF32, {2, 0, 8}), TensorView(in.w.data(), DType::kF32, {2, 0}),
                               out.view())
                  .ok());
  for (double v : to_doubles(out.view())) EXPECT_EQ(v, 0.0);
}

TEST(MoeCombine, invalid_arguments) {
  Inputs in(2, 4, 16, DType::kF32);
  OwnedTensor out(DType::kF32, {2, 16});
  fill_uniform(out.view(), 2);
  const auto before = out.bytes();
  const TensorView eo = in.eo.view(), w = in.w.view(), o = out.view(), sh = in.shared.view(), g = in.gate.view();
  auto expect_error = [&](const std::string& message, const Status& st) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(out.bytes(), before) << "out written on error: " << message;
  };
  std::vector<int32_t> i32(256);
  expect_error("moe_combine: expert_out has dtype int32 but must be fp32, fp16 or bf16",
               ops::moe_combine(TensorView(i32.data(), DType::kI32, {2, 4, 16}), w, o));
  expect_error("moe_combine: expert_out has rank 2 but must have rank 3 ([T, k, H])",
               ops::moe_combine(TensorView(in.eo.data(), DType::kF32, {8, 16}), w, o));
  expect_error("moe_combine: topk_weights has dtype bf16 but must be fp32",
               ops::moe_combine(eo, TensorView(in.w.data(), DType::kBF16, {2, 4}), o));
  expect_error("moe_combine: topk_weights has shape [2, 3] but must be [2, 4] ([T, k] like expert_out's leading dims)",
               ops::moe_combine(eo, TensorView(in.w.data(), DType::kF32, {2, 3}), o));
  expect_error("moe_combine: out has shape [2, 15] but must be [2, 16] ([T, H] from expert_out [T, k, H])",
               ops::moe_combine(eo, w, TensorView(out.data(), DType::kF32, {2, 15})));
  expect_error("moe_combine: shared_gate is given without shared_out; the gate scales shared_out",
               ops::moe_combine(eo, w, o, nullptr, &g));
  const TensorView bad_shared(in.shared.data(), DType::kF32, {1, 16});
  expect_error("moe_combine: shared_out has shape [1, 16] but must be [2, 16] ([T, H] like out)",
               ops::moe_combine(eo, w, o, &bad_shared));
  const TensorView bad_gate(in.gate.data(), DType::kF32, {1, 2});
  expect_error("moe_combine: shared_gate has shape [1, 2] but must be [2, 1] or [2] (one gate logit per token)",
               ops::moe_combine(eo, w, o, &sh, &bad_gate));
  const TensorView bf16_gate(in.gate.data(), DType::kBF16, {2, 1});
  expect_error("moe_combine: shared_gate has dtype bf16 but must be fp32", ops::moe_combine(eo, w, o, &sh, &bf16_gate));
  expect_error("moe_combine: out overlaps expert_out in memory; outputs must not alias inputs",
               ops::moe_combine(eo, w, TensorView(in.eo.data(), DType::kF32, {2, 16})));
}

}  // namespace
}  // namespace genbridge::testing
