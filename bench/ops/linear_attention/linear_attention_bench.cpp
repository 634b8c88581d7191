// The Gated DeltaNet operators against their roofs (bench/support/bench_util.h), at Qwen3.5-35B-A3B's shapes
// (conv channels 8192 = 2 x 16 key heads x 128 + 32 value heads x 128; nk = 16, nv = 32, dk = dv = 128) and
// a small shape:
//   causal_conv1d, gated_rms_norm, sigmoid_mul    memory roof (mem_frac): bytes read + written per call.
//   gated_delta_rule prefill (one sequence of T)  fp32 compute roof (fma_frac): the FLOPs of the form it
//                                                runs (chunked: per chunk of n and head, 2 x (n (n + 1) dk +
//                                                n(n-1)/2 (dk + dv) + 3 n dk dv + n(n+1)/2 dv) + dk dv), and
//                                                the per-token form on the same tokens (T calls of one
//                                                token, 8 dk dv FLOPs per token and head) for comparison.
//   gated_delta_rule decode (batch of q_len 1)    memory roof on the fp32 state: nv dk dv 4 bytes read and
//                                                written per sequence (+ q, k, v, out rows).
// Working sets of at least half the LLC rotate through copies (cold) and compare with the cold copy.
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "genbridge/ops/activation/sigmoid_mul.h"
#include "genbridge/ops/linear_attention/causal_conv1d.h"
#include "genbridge/ops/linear_attention/gated_delta_rule.h"
#include "genbridge/ops/norm/gated_rms_norm.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

// state_indices = 0..S-1 and query_start_loc for S sequences of q_len tokens.
struct Batch {
  std::vector<int32_t> slots, starts;
  Batch(int64_t seqs, int64_t q_len) {
    for (int64_t s = 0; s <= seqs; ++s) starts.push_back(static_cast<int32_t>(s * q_len));
    for (int64_t s = 0; s < seqs; ++s) slots.push_back(static_cast<int32_t>(s));
  }
  TensorView si() { return TensorView(slots.data(), DType::kI32, {static_cast<int64_t>(slots.size())}); }
  TensorView qsl() { return TensorView(starts.data(), DType::kI32, {static_cast<int64_t>(starts.size())}); }
};

// causal_conv1d: bf16 x, weight, state and y; args (seqs, q_len, channels).
void BM_causal_conv1d(benchmark::State& state) {
  const int64_t seqs = state.range(0), q_len = state.range(1), C = state.range(2), K = 4, T = seqs * q_len;
  Batch batch(seqs, q_len);
  OwnedTensor w(DType::kBF16, {C, K});
  testing::fill_uniform(w.view(), 1, -0.5f, 0.5f);
  struct Io {
    OwnedTensor x, st, y;
  };
  Io first{OwnedTensor(DType::kBF16, {T, C}), OwnedTensor(DType::kBF16, {seqs, K - 1, C}), OwnedTensor(DType::kBF16, {T, C})};
  testing::fill_uniform(first.x.view(), 2);
  const size_t bytes = static_cast<size_t>(2 * T * C * 2 + 2 * seqs * (K - 1) * C * 2 + C * K * 2);
  const bool cold = is_cold(bytes);
  std::vector<Io> io(static_cast<size_t>(cold ? cold_copies(bytes) : 1), first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    Io& b = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::causal_conv1d(b.x.view(), w.view(), b.st.view(), batch.si(), batch.qsl(), b.y.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(cold ? "bf16 cold" : "bf16 warm");
}

// gated_rms_norm: bf16 x, z, y of [rows, 128], fp32 w; args (rows).
void BM_gated_rms_norm(benchmark::State& state) {
  const int64_t rows = state.range(0), D = 128;
  OwnedTensor w(DType::kF32, {D});
  testing::fill_uniform(w.view(), 1, 0.5f, 1.5f);
  struct Io {
    OwnedTensor x, z, y;
  };
  Io first{OwnedTensor(DType::kBF16, {rows, D}), OwnedTensor(DType::kBF16, {rows, D}), OwnedTensor(DType::kBF16, {rows, D})};
  testing::fill_uniform(first.x.view(), 2);
  testing::fill_uniform(first.z.view(), 3);
  const size_t bytes = static_cast<size_t>(3 * rows * D * 2 + D * 4);
  const bool cold = is_cold(bytes);
  std::vector<Io> io(static_cast<size_t>(cold ? cold_copies(bytes) : 1), first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    Io& b = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::gated_rms_norm(b.x.view(), b.z.view(), w.view(), 1e-6f, b.y.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(cold ? "bf16 cold" : "bf16 warm");
}

// sigmoid_mul: bf16 x, gate, y of [tokens, 4096] (16 heads x 256); args (tokens).
void BM_sigmoid_mul(benchmark::State& state) {
  const int64_t T = state.range(0), W = 4096;
  struct Io {
    OwnedTensor x, g, y;
  };
  Io first{OwnedTensor(DType::kBF16, {T, W}), OwnedTensor(DType::kBF16, {T, W}), OwnedTensor(DType::kBF16, {T, W})};
  testing::fill_uniform(first.x.view(), 2);
  testing::fill_uniform(first.g.view(), 3);
  const size_t bytes = static_cast<size_t>(3 * T * W * 2);
  const bool cold = is_cold(bytes);
  std::vector<Io> io(static_cast<size_t>(cold ? cold_copies(bytes) : 1), first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    Io& b = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::sigmoid_mul(b.x.view(), b.g.view(), b.y.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(cold ? "bf16 cold" : "bf16 warm");
}

// FLOPs of the chunked form over T tokens for one head (chunks of 64 from the first token).
double chunked_flops(int64_t T, int64_t dk, int64_t dv) {
  double f = 0;
  for (int64_t t0 = 0; t0 < T; t0 += ops::kGatedDeltaRuleChunk) {
    const double n = static_cast<double>(std::min(ops::kGatedDeltaRuleChunk, T - t0));
    f += 2 * (n * (n + 1) * dk + n * (n - 1) / 2 * (dk + dv) + 3 * n * dk * dv + n * (n + 1) / 2 * dv) + dk * dv;
  }
  return f;
}

struct Gdr {
  int64_t nk, nv, dk, dv;
  OwnedTensor q, k, v, g, beta, out;
  Gdr(int64_t T, int64_t nk_, int64_t nv_, int64_t dk_, int64_t dv_)
      : nk(nk_), nv(nv_), dk(dk_), dv(dv_),
        q(DType::kBF16, {T, nk, dk}), k(DType::kBF16, {T, nk, dk}), v(DType::kBF16, {T, nv, dv}),
        g(DType::kF32, {T, nv}), beta(DType::kF32, {T, nv}), out(DType::kBF16, {T, nv, dv}) {
    testing::fill_uniform(q.view(), 1);
    testing::fill_uniform(k.view(), 2);
    testing::fill_uniform(v.view(), 3);
    testing::fill_uniform(g.view(), 4, -0.5f, -0.01f);
    testing::fill_uniform(beta.view(), 5, 0.1f, 0.9f);
  }
};

// Prefill: one sequence of T tokens; args (T, nk, nv, dk, dv, form: 0 = one call (chunked), 1 = T calls of one token).
void BM_gated_delta_rule_prefill(benchmark::State& state) {
  const int64_t T = state.range(0), nk = state.range(1), nv = state.range(2), dk = state.range(3), dv = state.range(4);
  const bool per_token = state.range(5) == 1;
  Gdr d(T, nk, nv, dk, dv);
  OwnedTensor st(DType::kF32, {1, nv, dk, dv});
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  std::vector<int32_t> si = {0}, qsl = {0, static_cast<int32_t>(T)}, qsl1 = {0, 1};
  const double flops = per_token ? 8.0 * T * nv * dk * dv : chunked_flops(T, dk, dv) * nv;
  run_roofline(state, Work{.flops = flops}, [&](int64_t) {
    Status s;
    if (!per_token) {
      s = ops::gated_delta_rule(d.q.view(), d.k.view(), d.v.view(), d.g.view(), d.beta.view(), st.view(),
                                TensorView(si.data(), DType::kI32, {1}), TensorView(qsl.data(), DType::kI32, {2}),
                                scale, d.out.view());
    } else {
      for (int64_t t = 0; t < T && s.ok(); ++t) {
        s = ops::gated_delta_rule(d.q.view().slice0(t, t + 1), d.k.view().slice0(t, t + 1), d.v.view().slice0(t, t + 1),
                                  d.g.view().slice0(t, t + 1), d.beta.view().slice0(t, t + 1), st.view(),
                                  TensorView(si.data(), DType::kI32, {1}), TensorView(qsl1.data(), DType::kI32, {2}),
                                  scale, d.out.view().slice0(t, t + 1));
      }
    }
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
  state.SetLabel(per_token ? "per-token form (T calls)" : "chunked form");
}

// Decode: `seqs` sequences of one token; args (seqs, nk, nv, dk, dv).
void BM_gated_delta_rule_decode(benchmark::State& state) {
  const int64_t seqs = state.range(0), nk = state.range(1), nv = state.range(2), dk = state.range(3), dv = state.range(4);
  Gdr d(seqs, nk, nv, dk, dv);
  Batch batch(seqs, 1);
  const size_t state_bytes = static_cast<size_t>(seqs * nv * dk * dv * 4);
  const size_t bytes = 2 * state_bytes + static_cast<size_t>(seqs * (2 * nk * dk + 2 * nv * dv) * 2 + seqs * nv * 8);
  const bool cold = is_cold(bytes);
  std::vector<OwnedTensor> states(static_cast<size_t>(cold ? cold_copies(bytes) : 1),
                                  OwnedTensor(DType::kF32, {seqs, nv, dk, dv}));
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    const Status s = ops::gated_delta_rule(d.q.view(), d.k.view(), d.v.view(), d.g.view(), d.beta.view(),
                                           states[static_cast<size_t>(i) % states.size()].view(), batch.si(),
                                           batch.qsl(), scale, d.out.view());
    if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  });
  state.SetLabel(cold ? "fp32 state cold" : "fp32 state warm");
}

BENCHMARK(BM_causal_conv1d)
    ->Name("causal_conv1d")
    ->ArgNames({"seqs", "q_len", "channels"})
    ->Args({1, 512, 8192})
    ->Args({32, 1, 8192})
    ->Args({4, 64, 1024})
    ->UseManualTime();
BENCHMARK(BM_gated_rms_norm)->Name("gated_rms_norm")->ArgNames({"rows"})->Args({32})->Args({32 * 32})->Args({512 * 32})->UseManualTime();
BENCHMARK(BM_sigmoid_mul)->Name("sigmoid_mul")->ArgNames({"tokens"})->Args({1})->Args({32})->Args({512})->UseManualTime();
BENCHMARK(BM_gated_delta_rule_prefill)
    ->Name("gated_delta_rule_prefill")
    ->ArgNames({"T", "nk", "nv", "dk", "dv", "per_token"})
    ->Args({512, 16, 32, 128, 128, 0})
    ->Args({512, 16, 32, 128, 128, 1})
    ->Args({512, 2, 4, 64, 64, 0})
    ->Args({512, 2, 4, 64, 64, 1})
    ->UseManualTime();
BENCHMARK(BM_gated_delta_rule_decode)
    ->Name("gated_delta_rule_decode")
    ->ArgNames({"seqs", "nk", "nv", "dk", "dv"})
    ->Args({1, 16, 32, 128, 128})
    ->Args({8, 16, 32, 128, 128})
    ->Args({32, 16, 32, 128, 128})
    ->Args({8, 2, 4, 64, 64})
    ->UseManualTime();

}  // namespace
}  // namespace genbridge::bench
