#pragma once
// Stable operator linear_attention/gated_delta_rule: the gated delta-rule recurrence of a Gated DeltaNet
// layer (Qwen3.5 linear attention) over a chunk of new tokens per sequence, continuing each sequence's
// recurrent state held in a state slot.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// Tokens per chunk of the chunked (prefill) form.
inline constexpr int64_t kGatedDeltaRuleChunk = 64;

// For every sequence s (rows [query_start_loc[s], query_start_loc[s+1]) of q/k/v, consecutive time
// steps), value head h (key head j = h / (nv / nk): grouped values) and its state S = state[state_indices[s],
// h] (dk x dv, S[i][c] at i * dv + c; zeros for a fresh sequence), for each token t in order:
//   k~ = k[t, j] / sqrt(sum k[t, j]^2 + 1e-6),  q~ = scale * q[t, j] / sqrt(sum q[t, j]^2 + 1e-6)
//   S <- exp(g[t, h]) * S;   u = S^T k~;   delta = beta[t, h] * (v[t, h] - u);   S <- S + k~ delta^T
//   out[t, h] = S^T q~
// computed in fp32. A sequence with q_len == 1 runs exactly this per-token form (decode), with these fp32
// steps in this order: the sums of squares over i = 0..dk-1 from +0; k~[i] = k[i] / sqrtf(sum + 1e-6f),
// q~[i] = (q[i] / sqrtf(sum + 1e-6f)) * scale; a = expf(g); per column c, u[c] = sum_i (a * S[i][c]) * k~[i]
// and out[c] = sum_i S'[i][c] * q~[i] over i increasing from +0 (each product and sum rounded, no fused
// multiply-add), S'[i][c] = a * S[i][c] + k~[i] * delta[c]. A sequence with q_len > 1 runs the
// mathematically equal chunked form (chunks of kGatedDeltaRuleChunk tokens from the call's first token,
// within-chunk interactions through the UT transform, one state update per chunk; fused multiply-adds):
// each output row (one token, one value head) agrees with the fp64 per-token recurrence within rel-L2 3e-4
// (measured at dk = dv = 128, T <= 1024, Qwen3.5-like gates: worst row 8.8e-5, mean 6e-7; the fp32
// per-token form's worst row is 7.5e-5 there), and bits differ from the per-token form and with where the
// calls split a prompt.
// The state slot holds the state after the chunk's last token.
//   q, k: [T, nk, dk] fp32/bf16; v: [T, nv, dv] fp32/bf16 (nv a multiple of nk; any strides, unit last);
//   g, beta: [T, nv] fp32 (gdn_gating's); state: [num_slots, nv, dk, dv] fp32, contiguous (the
//   DeviceOperator's state contract; any other shape, dtype or layout is InvalidArgument naming it);
//   state_indices: int32 [S], each in [0, num_slots), distinct; query_start_loc: int32 [S + 1], 0 first,
//   non-decreasing, T last; scale finite > 0 (1/sqrt(dk) for Qwen3.5); out: [T, nv, dv] fp32/bf16, rounded
//   once (RNE). A sequence's rows depend only on its own inputs and state (batch-invariant, bit-identical
//   across thread counts and CPU targets). Validates everything before writing; does not retain views.
Status gated_delta_rule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& g,
                        const TensorView& beta, const TensorView& state, const TensorView& state_indices,
                        const TensorView& query_start_loc, float scale, const TensorView& out);

}  // namespace genbridge::ops
