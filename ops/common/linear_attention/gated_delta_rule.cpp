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

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(DeltaRuleToken);
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
  float* const state0 = state.data_as<float>();
  const float* const g0 = g.data_as<const float>();
  const float* const beta0 = beta.data_as<const float>();
  genbridge::detail::parallel_for_dynamic(items, [&](int64_t item) {
    const int64_t sq = item / nv, h = item % nv, j = h / group;
    const int64_t q_len = batch.q_len(sq), row0 = batch.begin[sq];
    if (q_len == 0) return;
    float* S = state0 + (batch.slot[sq] * nv + h) * dk * dv;
    std::vector<float> kn(static_cast<size_t>(dk)), qn(static_cast<size_t>(dk)), vr(static_cast<size_t>(dv)),
        o(static_cast<size_t>(dv));
    for (int64_t t = row0; t < row0 + q_len; ++t) {
      detail::load_row_f32(k, 1, t * nk + j, dk, kn.data());
      detail::load_row_f32(q, 1, t * nk + j, dk, qn.data());
      detail::load_row_f32(v, 1, t * nv + h, dv, vr.data());
      l2_normalise(kn.data(), dk, 1.0f);
      l2_normalise(qn.data(), dk, scale);
      const float a = std::exp(g0[t * g.stride(0) + h * g.stride(1)]);
      const float b = beta0[t * beta.stride(0) + h * beta.stride(1)];
      token_kernel(S, dk, dv, kn.data(), qn.data(), vr.data(), a, b, o.data());
      detail::store_row_f32(out, 1, t * nv + h, dv, o.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
