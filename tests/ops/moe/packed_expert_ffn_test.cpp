// moe/expert_ffn with packed expert weights (ExpertWeights::packed) gives the bits of the same call on the
// unpacked views, for every batch size (1 to 16+ rows per expert, the GEMV and GEMM paths of the unpacked
// kernel), an expert range split, a SwiGLU clamp and every CPU target; packed copies that do not match the
// views are refused with the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "genbridge/ops/moe/expert_ffn.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

constexpr int64_t kE = 8, kK = 2, kH = 80, kI = 56;

struct Experts {
  std::vector<OwnedTensor> own;
  std::vector<ops::ExpertWeights> plain, packed;
  std::vector<std::unique_ptr<ops::PackedExpertWeights>> packs;
  explicit Experts(DType dt = DType::kBF16) {
    for (int64_t e = 0; e < kE; ++e) {
      own.emplace_back(dt, std::vector<int64_t>{kI, kH});
      own.emplace_back(dt, std::vector<int64_t>{kI, kH});
      own.emplace_back(dt, std::vector<int64_t>{kH, kI});
      for (int i = 0; i < 3; ++i) fill_uniform(own[own.size() - 3 + i].view(), 100 + 3 * e + i, -0.2f, 0.2f);
      plain.push_back({own[3 * e].view(), own[3 * e + 1].view(), own[3 * e + 2].view()});
    }
    if (dt != DType::kBF16) return;
    for (const ops::ExpertWeights& w : plain) {
      auto p = ops::pack_expert_weights(w);
      EXPECT_TRUE(p.ok()) << p.status().to_string();
      packs.push_back(std::make_unique<ops::PackedExpertWeights>(std::move(*p)));
      packed.push_back(w);
      packed.back().packed = packs.back().get();
    }
  }
};

// Token t's experts: (t, t + 1 + t / kE) mod kE, so that every expert gets a share and the rows per expert grow
// with T.
OwnedTensor route(int64_t T) {
  OwnedTensor ids(DType::kI32, {T, kK});
  int32_t* p = static_cast<int32_t*>(ids.data());
  for (int64_t t = 0; t < T; ++t) {
    p[t * kK] = static_cast<int32_t>(t % kE);
    p[t * kK + 1] = static_cast<int32_t>((t + 1 + t / kE) % kE);
    if (p[t * kK + 1] == p[t * kK]) p[t * kK + 1] = static_cast<int32_t>((p[t * kK] + 1) % kE);
  }
  return ids;
}

TEST(PackedExpertFfn, packed_weights_give_the_unpacked_bits_at_every_batch_size_and_target) {
  Experts ex;
  for_each_cpu_target([&](const std::string&) {
    for (int64_t T : {1, 2, 5, 8, 17, 40, 64, 150}) {
      for (float limit : {ops::kNoSwigluLimit, 0.05f}) {
        OwnedTensor x(DType::kBF16, {T, kH}), ids = route(T);
        fill_uniform(x.view(), 5 + T, -2.f, 2.f);
        OwnedTensor want(DType::kF32, {T, kK, kH}), got(DType::kF32, {T, kK, kH});
        ASSERT_TRUE(ops::expert_ffn(x.view(), ids.view(), ex.plain, 0, kE, want.view(), limit).ok());
        // The packed call in two expert ranges, as two FFN ranks would compute it.
        std::span<const ops::ExpertWeights> pk(ex.packed);
        ASSERT_TRUE(ops::expert_ffn(x.view(), ids.view(), pk.subspan(0, 3), 0, 3, got.view(), limit).ok());
        ASSERT_TRUE(ops::expert_ffn(x.view(), ids.view(), pk.subspan(3), 3, kE, got.view(), limit).ok());
        ASSERT_EQ(std::memcmp(want.data(), got.data(), static_cast<size_t>(T * kK * kH) * sizeof(float)), 0)
            << "T " << T << " limit " << limit;
      }
    }
  });
}

TEST(PackedExpertFfn, packed_copies_that_do_not_match_the_weights_are_refused) {
  Experts ex;
  OwnedTensor x(DType::kBF16, {4, kH}), ids = route(4), out(DType::kF32, {4, kK, kH});
  // A packed copy of another shape: expert 2's gate packed from a [kI, kI - 8, kH] slice.
  auto wrong = ops::pack_expert_weights({ex.own[0].view().slice0(0, kI - 8), ex.own[1].view(), ex.own[2].view()});
  ASSERT_TRUE(wrong.ok());
  std::vector<ops::ExpertWeights> w = ex.packed;
  w[2].packed = &*wrong;
  EXPECT_EQ(ops::expert_ffn(x.view(), ids.view(), w, 0, kE, out.view()).message(),
            "expert_ffn: experts[2].packed->gate holds [48, 80] but w_gate is [56, 80]");
  // Packed copies beside fp32 weights.
  Experts f32(DType::kF32);
  std::vector<ops::ExpertWeights> wf = f32.plain;
  wf[0].packed = ex.packs[0].get();
  EXPECT_EQ(ops::expert_ffn(x.view(), ids.view(), wf, 0, kE, out.view()).message(),
            "expert_ffn: experts[0].packed is given but the weights are fp32; only bf16 weights are packed");
  EXPECT_EQ(ops::pack_expert_weights(f32.plain[0]).status().message(),
            "pack_weights: w has dtype fp32; only bf16 weights are packed");
}

}  // namespace
}  // namespace genbridge::testing
