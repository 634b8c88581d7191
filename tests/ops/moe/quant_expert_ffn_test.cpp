// Contract test for moe/quant_expert_ffn; runs unchanged in every target build. Each slot must
// be bit-identical to the composition the contract names (quant_linear, the fp32 SwiGLU formula,
// quant_linear, one rounding), whatever the batch, the expert range split or the CPU target.
#include "genbridge/ops/moe/quant_expert_ffn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

using ops::QuantExpertWeights;
using ops::QuantWeight;
using ops::WeightQuantScheme;

bool has_mx() { return ops::build_target() == std::string_view("Ascend950"); }

struct Owned {
  OwnedTensor data, scale;
  QuantWeight view;
};

Owned quantize(WeightQuantScheme s, int64_t N, int64_t K, uint64_t seed) {
  OwnedTensor w(DType::kBF16, {N, K});
  fill_uniform(w.view(), seed, -0.3f, 0.3f);
  const bool mx = s != WeightQuantScheme::kW8A8;
  Owned o{OwnedTensor(s == WeightQuantScheme::kW8A8    ? DType::kI8
                      : s == WeightQuantScheme::kMxfp8 ? DType::kFp8E4M3FN
                                                       : DType::kFp4E2M1x2,
                      {N, s == WeightQuantScheme::kMxfp4 ? K / 2 : K}),
          OwnedTensor(mx ? DType::kE8M0 : DType::kF32,
                      mx ? std::vector<int64_t>{N, ops::mx_scale_pairs(K, 32), 2} : std::vector<int64_t>{N}),
          {}};
  o.view = {s, o.data.view(), o.scale.view(), K};
  const Status st = ops::quantize_weight(w.view(), o.view);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return o;
}

struct Bank {
  std::vector<Owned> owned;  // 3 per expert
  std::vector<QuantExpertWeights> experts;
  Bank(WeightQuantScheme s, int64_t E, int64_t H, int64_t I) {
    owned.reserve(static_cast<size_t>(3 * E));
    for (int64_t e = 0; e < E; ++e) {
      owned.push_back(quantize(s, I, H, 100 + 3 * e));
      owned.push_back(quantize(s, I, H, 101 + 3 * e));
      owned.push_back(quantize(s, H, I, 102 + 3 * e));
    }
    for (int64_t e = 0; e < E; ++e) {
      experts.push_back({owned[3 * e].view, owned[3 * e + 1].view, owned[3 * e + 2].view});
    }
  }
};

std::vector<WeightQuantScheme> runnable() {
  if (has_mx()) return {WeightQuantScheme::kW8A8, WeightQuantScheme::kMxfp8, WeightQuantScheme::kMxfp4};
  return {WeightQuantScheme::kW8A8};
}

TEST(QuantExpertFfn, each_slot_is_the_contracts_composition_on_every_cpu_target) {
  const int64_t E = 4, H = 64, I = 96, T = 9, k = 2;
  for (WeightQuantScheme s : runnable()) {
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(s)));
    Bank bank(s, E, H, I);
    OwnedTensor x(DType::kBF16, {T, H}), ids(DType::kI32, {T, k});
    fill_uniform(x.view(), 7, -2.f, 2.f);
    auto* idp = reinterpret_cast<int32_t*>(ids.data());
    for (int64_t i = 0; i < T * k; ++i) idp[i] = static_cast<int32_t>((i * 7 + i / 3) % (E + 1)) - (i == 5 ? 5 : 0);
    // The composition, token by token.
    std::vector<bf16_t> want(static_cast<size_t>(T * k * H), float_to_bf16(-1.f));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = idp[t * k + j];
        if (e < 0 || e >= E) continue;
        std::vector<float> g(I), u(I), y(H);
        const TensorView xt = x.view().slice0(t, t + 1);
        ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_gate, TensorView(g.data(), DType::kF32, {1, I})).ok());
        ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_up, TensorView(u.data(), DType::kF32, {1, I})).ok());
        for (int64_t i = 0; i < I; ++i) g[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
        ASSERT_TRUE(ops::quant_linear(TensorView(g.data(), DType::kF32, {1, I}), bank.experts[e].w_down,
                                      TensorView(y.data(), DType::kF32, {1, H}))
                        .ok());
        for (int64_t h = 0; h < H; ++h) want[(t * k + j) * H + h] = float_to_bf16(y[h]);
      }
    }
    for_each_cpu_target([&](const std::string& target) {
      OwnedTensor out(DType::kBF16, {T, k, H}), split(DType::kBF16, {T, k, H});
      for (auto* o : {&out, &split}) {
        auto* p = reinterpret_cast<bf16_t*>(o->data());
        std::fill(p, p + T * k * H, float_to_bf16(-1.f));
      }
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, out.view()).ok());
      EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * 2), 0) << target;
      const std::span<const QuantExpertWeights> all(bank.experts);
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), all.subspan(0, 1), 0, 1, split.view()).ok());
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), all.subspan(1, 3), 1, 4, split.view()).ok());
      EXPECT_EQ(out.bytes(), split.bytes()) << target;
    });
  }
}

// DeepSeek-V4's swiglu_limit in every scheme the build runs: each slot is the composition with the fp32 clamp
// (gate from above, up on both sides) between quant_linear's projections and the activation; +inf, the
// default, gives the unclamped bits.
TEST(QuantExpertFfn, swiglu_limit_clamps_in_fp32_before_the_activation) {
  const int64_t E = 3, H = 64, I = 96, T = 6, k = 2;
  const float limit = 0.5f;
  for (WeightQuantScheme s : runnable()) {
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(s)));
    Bank bank(s, E, H, I);
    OwnedTensor x(DType::kBF16, {T, H}), ids(DType::kI32, {T, k});
    fill_uniform(x.view(), 17, -2.f, 2.f);
    auto* idp = reinterpret_cast<int32_t*>(ids.data());
    for (int64_t i = 0; i < T * k; ++i) idp[i] = static_cast<int32_t>(i % E);
    std::vector<bf16_t> want(static_cast<size_t>(T * k * H));
    int64_t gate_above = 0, up_above = 0, up_below = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = idp[t * k + j];
        std::vector<float> g(I), u(I), y(H);
        const TensorView xt = x.view().slice0(t, t + 1);
        ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_gate, TensorView(g.data(), DType::kF32, {1, I})).ok());
        ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_up, TensorView(u.data(), DType::kF32, {1, I})).ok());
        for (int64_t i = 0; i < I; ++i) {
          gate_above += g[i] > limit;
          up_above += u[i] > limit;
          up_below += u[i] < -limit;
          const float gc = std::min(g[i], limit), uc = std::clamp(u[i], -limit, limit);
          g[i] = (gc / (1.0f + std::exp(-gc))) * uc;
        }
        ASSERT_TRUE(ops::quant_linear(TensorView(g.data(), DType::kF32, {1, I}), bank.experts[e].w_down,
                                      TensorView(y.data(), DType::kF32, {1, H}))
                        .ok());
        for (int64_t h = 0; h < H; ++h) want[(t * k + j) * H + h] = float_to_bf16(y[h]);
      }
    }
    EXPECT_GT(gate_above, 0);
    EXPECT_GT(up_above, 0);
    EXPECT_GT(up_below, 0);
    for_each_cpu_target([&](const std::string& target) {
      OwnedTensor out(DType::kBF16, {T, k, H}), plain(DType::kBF16, {T, k, H}), inf(DType::kBF16, {T, k, H});
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, out.view(), limit).ok());
      EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * 2), 0) << target;
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, plain.view()).ok());
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, inf.view(),
                                        std::numeric_limits<float>::infinity())
                      .ok());
      EXPECT_EQ(plain.bytes(), inf.bytes()) << target;
      EXPECT_NE(plain.bytes(), out.bytes()) << target;
    });
  }
}

// W8A8 runs every expert's projections in shared parallel regions, in items of 256 output columns and
// kernel calls of at most 64 rows: an expert with more than 64 slots, I = 300 (two items, the second partial), and
// every slot checked against its token run alone through quant_linear.
TEST(QuantExpertFfn, w8a8_many_slots_per_expert_and_column_tails) {
  const int64_t E = 3, H = 136, I = 300, T = 75, k = 2;
  Bank bank(WeightQuantScheme::kW8A8, E, H, I);
  OwnedTensor x(DType::kF32, {T, H}), ids(DType::kI32, {T, k});
  fill_uniform(x.view(), 11, -3.f, 3.f);
  auto* idp = reinterpret_cast<int32_t*>(ids.data());
  for (int64_t t = 0; t < T; ++t) {
    idp[t * k] = 0;                                    // expert 0 gets all 75 tokens
    idp[t * k + 1] = static_cast<int32_t>(1 + t % 3);  // 1, 2, and 3 (outside the range: not written)
  }
  std::vector<float> want(static_cast<size_t>(T * k * H), -1.f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = idp[t * k + j];
      if (e >= E) continue;
      std::vector<float> g(I), u(I);
      const TensorView xt = x.view().slice0(t, t + 1);
      ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_gate, TensorView(g.data(), DType::kF32, {1, I})).ok());
      ASSERT_TRUE(ops::quant_linear(xt, bank.experts[e].w_up, TensorView(u.data(), DType::kF32, {1, I})).ok());
      for (int64_t i = 0; i < I; ++i) g[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
      ASSERT_TRUE(ops::quant_linear(TensorView(g.data(), DType::kF32, {1, I}), bank.experts[e].w_down,
                                    TensorView(want.data() + (t * k + j) * H, DType::kF32, {1, H}))
                      .ok());
    }
  }
  for_each_cpu_target([&](const std::string& target) {
    OwnedTensor out(DType::kF32, {T, k, H});
    auto* p = reinterpret_cast<float*>(out.data());
    std::fill(p, p + T * k * H, -1.f);
    ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, out.view()).ok());
    EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0) << target;
  });
}

// The intermediates live in buffers of the calling thread that only grow: a call after a larger one (stale rows
// beyond its own) and calls on several threads at once each give the bits of the same call made alone first.
TEST(QuantExpertFfn, calls_of_any_size_in_any_order_and_on_concurrent_threads_give_their_own_bits) {
  const int64_t E = 4, H = 64, I = 96, k = 2;
  for (WeightQuantScheme s : runnable()) {
    Bank bank(s, E, H, I);
    const std::vector<int64_t> sizes = {200, 3, 57, 1, 200};
    std::vector<OwnedTensor> xs, ids;
    for (size_t c = 0; c < sizes.size(); ++c) {
      const int64_t T = sizes[c];
      xs.emplace_back(DType::kBF16, std::vector<int64_t>{T, H});
      ids.emplace_back(DType::kI32, std::vector<int64_t>{T, k});
      fill_uniform(xs.back().view(), 40 + c, -2.f, 2.f);
      auto* idp = reinterpret_cast<int32_t*>(ids.back().data());
      for (int64_t t = 0; t < T * k; ++t) idp[t] = static_cast<int32_t>((t * 7 + c) % E);
    }
    auto call = [&](size_t c) {  // the output's bytes
      OwnedTensor out(DType::kBF16, {sizes[c], k, H});
      EXPECT_TRUE(ops::quant_expert_ffn(xs[c].view(), ids[c].view(), bank.experts, 0, E, out.view()).ok());
      return out.bytes();
    };
    std::vector<std::vector<std::byte>> want;
    for (size_t c = 0; c < sizes.size(); ++c) want.push_back(call(c));  // large first: later ones reuse its buffers
    for (size_t c = sizes.size(); c-- > 0;) ASSERT_TRUE(call(c) == want[c]) << "call " << c << " (reverse order)";
    std::vector<std::vector<std::byte>> got(sizes.size() * 2);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = call(i % sizes.size()); });
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i % sizes.size()]) << "thread " << i;
  }
}

// Activations quantized before the call (an AFD dispatch carrying int8 codes per token): codes and scales from
// quant/dynamic_quant_per_token of x give every slot the bits of quant_expert_ffn(x), for bf16 and fp32 x, with
// strided codes and scales (rows of [codes | scale] as a dispatch packs them), any expert split and every CPU target.
TEST(QuantExpertFfn, prequantized_int8_rows_give_the_bits_of_the_activations) {
  const int64_t E = 3, H = 136, I = 300, T = 70, k = 2;
  Bank bank(WeightQuantScheme::kW8A8, E, H, I);
  for (DType xt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(std::string(dtype_name(xt)));
    OwnedTensor x(xt, {T, H}), ids(DType::kI32, {T, k});
    fill_uniform(x.view(), 29, -3.f, 3.f);
    auto* idp = reinterpret_cast<int32_t*>(ids.data());
    for (int64_t t = 0; t < T; ++t) {
      idp[t * k] = 0;  // more than 64 slots for expert 0
      idp[t * k + 1] = static_cast<int32_t>(1 + t % 3);
    }
    // Rows of H codes then the fp32 scale (H + 4 bytes, a multiple of 4).
    const int64_t row = H + 4;
    std::vector<std::byte> rows(static_cast<size_t>(T * row));
    const TensorView qx = TensorView::strided(rows.data(), DType::kI8, {T, H}, {row, 1});
    const TensorView sx = TensorView::strided(rows.data() + H, DType::kF32, {T}, {row / 4});
    ASSERT_TRUE(ops::dynamic_quant_per_token(x.view(), ops::kDynamicQuantPerTokenDefaultEps, qx, sx).ok());
    for_each_cpu_target([&](const std::string& target) {
      OwnedTensor want(DType::kBF16, {T, k, H}), got(DType::kBF16, {T, k, H}), split(DType::kBF16, {T, k, H});
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, want.view()).ok());
      ASSERT_TRUE(ops::quant_expert_ffn_prequantized(qx, sx, ids.view(), bank.experts, 0, E, got.view()).ok());
      EXPECT_EQ(got.bytes(), want.bytes()) << target;
      const std::span<const QuantExpertWeights> all(bank.experts);
      ASSERT_TRUE(ops::quant_expert_ffn_prequantized(qx, sx, ids.view(), all.subspan(0, 1), 0, 1, split.view()).ok());
      ASSERT_TRUE(ops::quant_expert_ffn_prequantized(qx, sx, ids.view(), all.subspan(1, 2), 1, 3, split.view()).ok());
      EXPECT_EQ(split.bytes(), want.bytes()) << target;
      // With the swiglu clamp too.
      ASSERT_TRUE(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, E, want.view(), 0.5f).ok());
      ASSERT_TRUE(ops::quant_expert_ffn_prequantized(qx, sx, ids.view(), bank.experts, 0, E, got.view(), 0.5f).ok());
      EXPECT_EQ(got.bytes(), want.bytes()) << target;
    });
  }
}

TEST(QuantExpertFfn, prequantized_invalid_arguments) {
  const int64_t E = 2, H = 64, I = 32, T = 3;
  Bank bank(WeightQuantScheme::kW8A8, E, H, I);
  OwnedTensor qx(DType::kI8, {T, H}), sx(DType::kF32, {T}), ids(DType::kI32, {T, 1}), out(DType::kBF16, {T, 1, H});
  OwnedTensor x(DType::kBF16, {T, H}), s4(DType::kF32, {T + 1});
  EXPECT_EQ(
      ops::quant_expert_ffn_prequantized(x.view(), sx.view(), ids.view(), bank.experts, 0, E, out.view()).message(),
      "quant_expert_ffn_prequantized: qx has dtype bf16 but must be int8");
  EXPECT_EQ(
      ops::quant_expert_ffn_prequantized(qx.view(), s4.view(), ids.view(), bank.experts, 0, E, out.view()).message(),
      "quant_expert_ffn_prequantized: sx has shape [4] but must be [3] ([T]: one scale per row of qx)");
  EXPECT_EQ(
      ops::quant_expert_ffn_prequantized(qx.view(), sx.view(), ids.view(), bank.experts, 0, 1, out.view()).message(),
      "quant_expert_ffn_prequantized: 2 expert weight sets given for expert range [0, 1); exactly one per "
      "expert in the range is required");
  const TensorView over = TensorView(out.data(), DType::kF32, {T});
  EXPECT_EQ(ops::quant_expert_ffn_prequantized(qx.view(), over, ids.view(), bank.experts, 0, E, out.view()).message(),
            "quant_expert_ffn_prequantized: out overlaps sx in memory; outputs must not alias inputs");
  OwnedTensor d(DType::kFp8E4M3FN, {I, H}), sc(DType::kE8M0, {I, 1, 2}), dd(DType::kFp8E4M3FN, {H, I}),
      sd(DType::kE8M0, {H, 1, 2});
  const QuantWeight gate{WeightQuantScheme::kMxfp8, d.view(), sc.view(), H};
  const QuantExpertWeights mx{gate, gate, {WeightQuantScheme::kMxfp8, dd.view(), sd.view(), I}};
  EXPECT_EQ(ops::quant_expert_ffn_prequantized(qx.view(), sx.view(), ids.view(), std::span(&mx, 1), 0, 1, out.view())
                .message(),
            "quant_expert_ffn_prequantized: the experts are mxfp8 but activations quantized int8 per token are the "
            "input of w8a8 experts only");
}

TEST(QuantExpertFfn, invalid_and_unsupported) {
  const int64_t E = 2, H = 64, I = 32;
  Bank bank(WeightQuantScheme::kW8A8, E, H, I);
  OwnedTensor x(DType::kBF16, {3, H}), ids(DType::kI32, {3, 1}), out(DType::kBF16, {3, 1, H});
  EXPECT_EQ(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, 1, out.view()).message(),
            "quant_expert_ffn: 2 expert weight sets given for expert range [0, 1); exactly one per expert in the "
            "range is required");
  OwnedTensor x32(DType::kBF16, {3, 32});
  OwnedTensor out32(DType::kBF16, {3, 1, 32});
  EXPECT_EQ(ops::quant_expert_ffn(x32.view(), ids.view(), bank.experts, 0, 2, out32.view()).message(),
            "quant_expert_ffn: experts[0] does not hold w_gate, w_up [I, H] and w_down [H, I] with H = 32 (x's last "
            "dimension) and I = 32 (experts[0].w_gate's rows)");
  for (const auto& [bad, text] :
       {std::pair<float, const char*>{0.0f, "0"}, {-1.0f, "-1"}, {std::numeric_limits<float>::quiet_NaN(), "nan"}}) {
    EXPECT_EQ(ops::quant_expert_ffn(x.view(), ids.view(), bank.experts, 0, 2, out.view(), bad).message(),
              "quant_expert_ffn: swiglu_limit is " + std::string(text) + " but must be > 0 (+inf: no clamp)");
  }
  if (has_mx()) return;
  OwnedTensor d(DType::kFp8E4M3FN, {I, H}), sc(DType::kE8M0, {I, 1, 2}), dd(DType::kFp8E4M3FN, {H, I}),
      sd(DType::kE8M0, {H, 1, 2});
  const QuantWeight gate{WeightQuantScheme::kMxfp8, d.view(), sc.view(), H};
  const QuantExpertWeights mx{gate, gate, {WeightQuantScheme::kMxfp8, dd.view(), sd.view(), I}};
  const Status st = ops::quant_expert_ffn(x.view(), ids.view(), std::span(&mx, 1), 0, 1, out.view());
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("mxfp8 weights are not supported on Ascend910"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace genbridge::testing
