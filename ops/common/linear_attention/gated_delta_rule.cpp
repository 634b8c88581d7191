// linear_attention/gated_delta_rule, one implementation for every target. Work items are (sequence, value
// head) pairs, each walking its own sequence's tokens against its own state, so results do not depend on the
// batch or the thread count. The kernels are compiled once per CPU target (Highway) and vectorise over the
// state's columns (16 lanes side by side, each column's sums over rows in increasing order), so every target
// gives the same bits.
//
// Per token (decode) the state is walked once per column block: a first pass over the block's rows reads
// the state and sums u = (a S)^T k~, a second writes S' = a S + k~ delta^T and sums out = S'^T q~ from the
// block just read (it is in the L1 cache), so the state crosses the memory bus once each way per token.
#ifndef GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_GATED_DELTA_RULE_SHARED_
#define GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_GATED_DELTA_RULE_SHARED_
#include "genbridge/ops/linear_attention/gated_delta_rule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/linear_attention/seq_batch.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"
#endif  // GENBRIDGE_OPS_COMMON_LINEAR_ATTENTION_GATED_DELTA_RULE_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/linear_attention/gated_delta_rule.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// Columns [c, c + NV * 16) of one token's update of S (dk rows of dv floats).
template <int NV>
HWY_INLINE void TokenColumns(float* S, int64_t dk, int64_t dv, int64_t c, const float* kn, const float* qn,
                             const float* v, float a, float b, float* o) {
  const V16 va = Set16(a);
  V16 u[NV];
  GB_UNROLL for (int p = 0; p < NV; ++p) u[p] = Zero16();
  for (int64_t i = 0; i < dk; ++i) {
    const float* row = S + i * dv + c;
    const V16 ki = Set16(kn[i]);
    GB_UNROLL for (int p = 0; p < NV; ++p) u[p] = u[p] + (va * Load16(row + p * kLanes)) * ki;
  }
  V16 delta[NV], acc[NV];
  GB_UNROLL for (int p = 0; p < NV; ++p) {
    delta[p] = Set16(b) * (Load16(v + c + p * kLanes) - u[p]);
    acc[p] = Zero16();
  }
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv + c;
    const V16 ki = Set16(kn[i]), qi = Set16(qn[i]);
    GB_UNROLL for (int p = 0; p < NV; ++p) {
      const V16 s = va * Load16(row + p * kLanes) + ki * delta[p];
      Store16(row + p * kLanes, s);
      acc[p] = acc[p] + s * qi;
    }
  }
  GB_UNROLL for (int p = 0; p < NV; ++p) Store16(o + c + p * kLanes, acc[p]);
}

// One token of the per-token form on S [dk][dv]: kn, qn normalised (qn scaled), v [dv], a = expf(g),
// b = beta; o [dv] receives S'^T qn.
void DeltaRuleToken(float* S, int64_t dk, int64_t dv, const float* kn, const float* qn, const float* v, float a,
                    float b, float* o) {
  int64_t c = 0;
  for (; c + 4 * kLanes <= dv; c += 4 * kLanes) TokenColumns<4>(S, dk, dv, c, kn, qn, v, a, b, o);
  for (; c + kLanes <= dv; c += kLanes) TokenColumns<1>(S, dk, dv, c, kn, qn, v, a, b, o);
  for (; c < dv; ++c) {
    float u = 0.0f;
    for (int64_t i = 0; i < dk; ++i) u = u + (a * S[i * dv + c]) * kn[i];
    const float delta = b * (v[c] - u);
    float acc = 0.0f;
    for (int64_t i = 0; i < dk; ++i) {
      const float s = a * S[i * dv + c] + kn[i] * delta;
      S[i * dv + c] = s;
      acc = acc + s * qn[i];
    }
    o[c] = acc;
  }
}


// ---- the chunked form (q_len > 1) ----
// Every sum below is one chain of fused multiply-adds (Fma16: one rounding on every target) over its inner
// index in increasing order, starting from the value the output held; the register tiles only choose which
// chains run side by side, so the tile shape may differ per target without changing a bit.
constexpr int kTileRows = kParts == 1 ? 4 : kParts == 2 ? 3 : 2;
constexpr int kTileVecs = kParts == 1 ? 4 : 2;

// C[r][c] += sum_p A[r * lda + p] * B[p * ldb + c] for r < R, c in [c0, c0 + 16 NV).
template <int R, int NV>
HWY_INLINE void TileAcc(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t P,
                        int64_t c0) {
  V16 acc[R][NV];
  GB_UNROLL for (int r = 0; r < R; ++r) {
    GB_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = Load16(C + r * ldc + c0 + v * kLanes);
  }
  for (int64_t p = 0; p < P; ++p) {
    V16 b[NV];
    GB_UNROLL for (int v = 0; v < NV; ++v) b[v] = Load16(B + p * ldb + c0 + v * kLanes);
    GB_UNROLL for (int r = 0; r < R; ++r) {
      const V16 a = Set16(A[r * lda + p]);
      GB_UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = Fma16(a, b[v], acc[r][v]);
    }
  }
  GB_UNROLL for (int r = 0; r < R; ++r) {
    GB_UNROLL for (int v = 0; v < NV; ++v) Store16(C + r * ldc + c0 + v * kLanes, acc[r][v]);
  }
}

// C[M][N] += A[M][P] B[P][N] (row strides lda, ldb, ldc), each element one fused chain over p.
void MatAcc(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t M, int64_t P,
            int64_t N) {
  int64_t c = 0;
  for (; c + kTileVecs * kLanes <= N; c += kTileVecs * kLanes) {
    int64_t r = 0;
    for (; r + kTileRows <= M; r += kTileRows) TileAcc<kTileRows, kTileVecs>(A + r * lda, lda, B, ldb, C + r * ldc, ldc, P, c);
    for (; r < M; ++r) TileAcc<1, kTileVecs>(A + r * lda, lda, B, ldb, C + r * ldc, ldc, P, c);
  }
  for (; c + kLanes <= N; c += kLanes) {
    int64_t r = 0;
    for (; r + kTileRows <= M; r += kTileRows) TileAcc<kTileRows, 1>(A + r * lda, lda, B, ldb, C + r * ldc, ldc, P, c);
    for (; r < M; ++r) TileAcc<1, 1>(A + r * lda, lda, B, ldb, C + r * ldc, ldc, P, c);
  }
  for (; c < N; ++c)
    for (int64_t r = 0; r < M; ++r) {
      float acc = C[r * ldc + c];
      for (int64_t p = 0; p < P; ++p) acc = std::fma(A[r * lda + p], B[p * ldb + c], acc);
      C[r * ldc + c] = acc;
    }
}

// One chunk of n tokens on S [dk][dv]. In: kn, qn [n][dk] (normalised, qn scaled), v [n][dv], g, beta [n].
// Out: o [n][dv]; S holds the state after the chunk. `w` is scratch of ChunkScratch(n, dk, dv) floats.
//   Γ_t = expf(g_0 + ... + g_t), D[t][s] = expf(g_{s+1} + ... + g_t) (s <= t; sums in order)
//   X = (I + L)^-1 [beta v | beta Γ kn] with L[t][s] = beta_t D[t][s] kn_t.kn_s (s < t), by forward substitution
//   v_new = X_v - X_k S;  o = (Γ qn) S + (D ⊙ qn kn^T)_{s<=t} v_new;  S <- Γ_{n-1} S + (D_{n-1,s} kn_s)^T v_new
void DeltaRuleChunk(float* S, int64_t dk, int64_t dv, int64_t n, const float* kn, const float* qn, const float* v,
                    const float* g, const float* beta, float* o, float* w) {
  const int64_t nx = dv + dk;  // columns of X: [v part | k part]
  float* kt = w;               // [dk][n]: kn transposed
  float* kk = kt + dk * n;     // [n][n]: kn kn^T, then -L
  float* qk = kk + n * n;      // [n][n]: qn kn^T, then the masked, decayed intra-chunk weights
  float* x = qk + n * n;       // [n][nx]
  float* qg = x + n * nx;      // [n][dk]: Γ qn, then -X_k
  float* kd = qg + n * dk;     // [dk][n]: (D_{n-1,s} kn_s) transposed
  float* gc = kd + dk * n;     // [n]: D[n-1][s]
  float* gam = gc + n;         // [n]
  float acc = 0.0f;
  for (int64_t t = 0; t < n; ++t) acc = acc + g[t], gam[t] = std::exp(acc);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dk; ++i) kt[i * n + t] = kn[t * dk + i];
  for (int64_t i = 0; i < n * n; ++i) kk[i] = 0.0f, qk[i] = 0.0f;
  // Only the lower triangle (s <= t) is used: each block of rows stops at its last row's column, rounded up
  // to whole 16-lane blocks.
  for (int64_t t0 = 0; t0 < n; t0 += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, n - t0);
    const int64_t cols = std::min(n, (t0 + rows + kLanes - 1) / kLanes * kLanes);
    MatAcc(kn + t0 * dk, dk, kt, n, kk + t0 * n, n, rows, dk, cols);
    MatAcc(qn + t0 * dk, dk, kt, n, qk + t0 * n, n, rows, dk, cols);
  }
  // D[t][s] = expf(g_{s+1} + ... + g_t), the sum taken in order from g_{s+1} (not gc_t - gc_s: the difference
  // of two long sums loses the digits of a short one), kept in kd's first column block until used.
  for (int64_t s = 0; s < n; ++s) {
    float sum = 0.0f;
    for (int64_t t = s; t < n; ++t) {
      if (t > s) sum = sum + g[t];
      const float d = std::exp(sum);
      kk[t * n + s] = t > s ? -(beta[t] * (kk[t * n + s] * d)) : 0.0f;
      qk[t * n + s] = qk[t * n + s] * d;
      if (t == n - 1) gc[s] = d;  // D[n-1][s], for the state update
    }
    for (int64_t t = 0; t < s; ++t) kk[t * n + s] = 0.0f, qk[t * n + s] = 0.0f;
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < dv; ++c) x[t * nx + c] = beta[t] * v[t * dv + c];
    const float bg = beta[t] * gam[t];
    for (int64_t i = 0; i < dk; ++i) x[t * nx + dv + i] = bg * kn[t * dk + i];
    for (int64_t i = 0; i < dk; ++i) qg[t * dk + i] = gam[t] * qn[t * dk + i];
  }
  // Forward substitution: X_t += sum_{s<t} (-L[t][s]) X_s, s increasing. Per block of rows [t0, t0 + R):
  // the terms s < t0 (rows already final) in one tile, then each row's own s in [t0, t).
  for (int64_t t0 = 0; t0 < n; t0 += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, n - t0);
    if (t0 > 0) MatAcc(kk + t0 * n, n, x, nx, x + t0 * nx, nx, rows, t0, nx);
    for (int64_t t = t0 + 1; t < t0 + rows; ++t) MatAcc(kk + t * n + t0, n, x + t0 * nx, nx, x + t * nx, nx, 1, t - t0, nx);
  }
  // v_new (in X's v part) = X_v - X_k S.
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < dk; ++i) x[t * nx + dv + i] = -x[t * nx + dv + i];
  MatAcc(x + dv, nx, S, dv, x, nx, n, dk, dv);
  // o = (Γ qn) S, then the intra-chunk part row by row (s <= t).
  for (int64_t i = 0; i < n * dv; ++i) o[i] = 0.0f;
  MatAcc(qg, dk, S, dv, o, dv, n, dk, dv);
  for (int64_t t0 = 0; t0 < n; t0 += kTileRows) {  // s < t0 in one tile, then each row's s in [t0, t]
    const int64_t rows = std::min<int64_t>(kTileRows, n - t0);
    if (t0 > 0) MatAcc(qk + t0 * n, n, x, nx, o + t0 * dv, dv, rows, t0, dv);
    for (int64_t t = t0; t < t0 + rows; ++t) MatAcc(qk + t * n + t0, n, x + t0 * nx, nx, o + t * dv, dv, 1, t - t0 + 1, dv);
  }
  // S <- Γ_{n-1} S + sum_s (D_{n-1,s} kn_s) v_new_s^T.
  for (int64_t s = 0; s < n; ++s)
    for (int64_t i = 0; i < dk; ++i) kd[i * n + s] = gc[s] * kn[s * dk + i];
  const float last = gam[n - 1];
  for (int64_t i = 0; i < dk * dv; ++i) S[i] = last * S[i];
  MatAcc(kd, n, x, nx, S, dv, dk, n, dv);
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(DeltaRuleToken);
HWY_EXPORT(DeltaRuleChunk);
}  // namespace detail
namespace {

using detail::n;
using detail::s;
constexpr const char* kOp = "gated_delta_rule";

Status validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                const TensorView& beta, const TensorView& state, const TensorView& state_indices,
                const TensorView& query_start_loc, float scale, const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "q", q));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "q", q, 3, "[T, nk, dk]"));
  const int64_t T = q.dim(0), nk = q.dim(1), dk = q.dim(2);
  if (nk < 1 || dk < 1) {
    return invalid_argument(s(kOp) + ": q has shape " + q.shape_string() + " but nk and dk must be >= 1");
  }
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "q", q));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "k", k));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "k", k, {T, nk, dk}, "(q's shape [T, nk, dk])"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "k", k));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "v", v));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "v", v, 3, "[T, nv, dv]"));
  const int64_t nv = v.dim(1), dv = v.dim(2);
  if (v.dim(0) != T || nv < 1 || dv < 1 || nv % nk != 0) {
    return invalid_argument(s(kOp) + ": v has shape " + v.shape_string() + " but must be [" + n(T) +
                            ", nv, dv] with dv >= 1 and nv a positive multiple of nk = " + n(nk) + " (grouped values)");
  }
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "v", v));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "g", g, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "g", g, {T, nv}, "([T, nv])"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "beta", beta, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "beta", beta, {T, nv}, "([T, nv])"));
  GB_RETURN_IF_ERROR(
      detail::check_state(kOp, "state", state, {DType::kF32}, {-1, nv, dk, dv}, "([num_slots, nv, dk, dv])"));
  GB_RETURN_IF_ERROR(detail::check_seq_batch(kOp, state_indices, query_start_loc, T, state.dim(0)));
  if (!std::isfinite(scale) || !(scale > 0.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(scale));
    return invalid_argument(s(kOp) + ": scale is " + text + " but must be finite and > 0");
  }
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "out", out, {T, nv, dv}, "(v's shape [T, nv, dv])"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "out", out));
  const std::pair<const char*, const TensorView*> inputs[] = {{"q", &q}, {"k", &k}, {"v", &v}, {"g", &g}, {"beta", &beta}};
  for (const auto& [name, in] : inputs) {
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, name, *in));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "state", state, name, *in));
  }
  return detail::check_no_overlap(kOp, "out", out, "state", state);
}

// x / sqrtf(sum x^2 + 1e-6) (sum in order from +0), times `scale` when scale != 1.
void l2_normalise(float* x, int64_t d, float scale) {
  float ss = 0.0f;
  for (int64_t i = 0; i < d; ++i) ss = ss + x[i] * x[i];
  const float norm = std::sqrt(ss + 1e-6f);
  for (int64_t i = 0; i < d; ++i) x[i] = x[i] / norm;
  if (scale != 1.0f) {
    for (int64_t i = 0; i < d; ++i) x[i] = x[i] * scale;
  }
}

// Scratch floats of DeltaRuleChunk for n tokens.
size_t chunk_scratch_floats(int64_t n, int64_t dk, int64_t dv) {
  return static_cast<size_t>(2 * dk * n + 2 * n * n + n * (dv + dk) + n * dk + 2 * n);
}

}  // namespace

Status gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                        const TensorView& beta, const TensorView& state, const TensorView& state_indices,
                        const TensorView& query_start_loc, float scale, const TensorView& out) {
  GB_RETURN_IF_ERROR(validate(q, k, v, g, beta, state, state_indices, query_start_loc, scale, out));
  const int64_t nk = q.dim(1), dk = q.dim(2), nv = v.dim(1), dv = v.dim(2), group = nv / nk;
  const detail::SeqBatch batch = detail::read_seq_batch(state_indices, query_start_loc);
  const int64_t items = batch.num_seqs() * nv;
  if (items == 0) return ok_status();
  const auto token_kernel = GB_DISPATCH(detail::DeltaRuleToken);
  const auto chunk_kernel = GB_DISPATCH(detail::DeltaRuleChunk);
  float* const state0 = state.data_as<float>();
  const float* const g0 = g.data_as<const float>();
  const float* const beta0 = beta.data_as<const float>();
  constexpr int64_t kC = kGatedDeltaRuleChunk;
  genbridge::detail::parallel_for_dynamic(items, [&](int64_t item) {
    const int64_t sq = item / nv, h = item % nv, j = h / group;
    const int64_t q_len = batch.q_len(sq), row0 = batch.begin[sq];
    if (q_len == 0) return;
    float* S = state0 + (batch.slot[sq] * nv + h) * dk * dv;
    const int64_t rows = q_len == 1 ? 1 : std::min(q_len, kC);
    std::vector<float> kn(static_cast<size_t>(rows * dk)), qn(static_cast<size_t>(rows * dk)),
        vr(static_cast<size_t>(rows * dv)), o(static_cast<size_t>(rows * dv)), gr(static_cast<size_t>(rows)),
        br(static_cast<size_t>(rows));
    std::vector<float> scratch(q_len == 1 ? 0 : chunk_scratch_floats(rows, dk, dv));
    for (int64_t t0 = row0; t0 < row0 + q_len; t0 += rows) {
      const int64_t nt = std::min(rows, row0 + q_len - t0);
      for (int64_t r = 0; r < nt; ++r) {
        const int64_t t = t0 + r;
        detail::load_row_f32(k, 1, t * nk + j, dk, &kn[r * dk]);
        detail::load_row_f32(q, 1, t * nk + j, dk, &qn[r * dk]);
        detail::load_row_f32(v, 1, t * nv + h, dv, &vr[r * dv]);
        l2_normalise(&kn[r * dk], dk, 1.0f);
        l2_normalise(&qn[r * dk], dk, scale);
        gr[r] = g0[t * g.stride(0) + h * g.stride(1)];
        br[r] = beta0[t * beta.stride(0) + h * beta.stride(1)];
      }
      if (q_len == 1) {
        token_kernel(S, dk, dv, kn.data(), qn.data(), vr.data(), std::exp(gr[0]), br[0], o.data());
      } else {
        chunk_kernel(S, dk, dv, nt, kn.data(), qn.data(), vr.data(), gr.data(), br.data(), o.data(), scratch.data());
      }
      for (int64_t r = 0; r < nt; ++r) detail::store_row_f32(out, 1, (t0 + r) * nv + h, dv, &o[r * dv]);
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
