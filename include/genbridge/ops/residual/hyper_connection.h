#pragma once
// Stable operators residual/hyper_connection: DeepSeek-V4's manifold-constrained hyper-connections (mHC).
// Each token carries n = hc_mult residual streams [n, H]. Before a block (attention or MoE) hc_pre
// computes, from the streams, the weights that collapse them into the block's input (pre), expand the
// block's output back (post) and mix the streams (comb, made doubly stochastic by Sinkhorn iterations);
// after the block hc_post writes the new streams. hc_head collapses the streams before the final norm.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// The mixing parameters of one mHC site.
struct HyperConnectionParams {
  float norm_eps = 1e-6f;       // the unweighted RMSNorm of the flattened streams (rms_norm_eps)
  float hc_eps = 1e-6f;         // added to pre and comb, and to every Sinkhorn denominator
  int64_t sinkhorn_iters = 20;  // >= 1: one column normalization, then iters - 1 (row, column) rounds
};

// streams: [T, n, H] bf16 or fp32, any strides (n >= 1, H >= 1). fn: fp32 [(2 + n) n, n H], rows contiguous;
// base: fp32 [(2 + n) n]; scale: fp32 [3]. For each token t, all in fp32, each operation rounded once:
//   x = streams[t] flattened (stream-major, n H values); r = 1 / sqrt(sum(x^2) / (n H) + norm_eps);
//   m[i] = r * (fn[i] . x)   (sum(x^2) = x . x; both dot products in linear/linear's reduction order along
//                             n H; Hugging Face normalizes x before the projection: the same value in exact
//                             arithmetic)
//   pre[j]  = sigmoid(m[j] * scale[0] + base[j]) + hc_eps                      j < n
//   post[j] = 2 * sigmoid(m[n + j] * scale[1] + base[n + j])                  j < n
//   c[j][k] = softmax_k(m[2n + j n + k] * scale[2] + base[2n + j n + k]) + hc_eps   (row j: max subtracted)
//   c /= column sums + hc_eps; then sinkhorn_iters - 1 times: c /= row sums + hc_eps; c /= column sums + hc_eps
//   (sums in index order; sigmoid(v) = 1 / (1 + exp(-v)), softmax's exp and sum likewise in index order)
//   collapsed[t] = sum_j pre[j] * streams[t, j]   (fused multiply-adds from +0, j in order, rounded once to
//                                                  its dtype)
// collapsed: [T, H] bf16 or fp32; post: fp32 [T, n]; comb: fp32 [T, n, n] (comb[t, j, k] = c[j][k]); any
// strides, not overlapping the inputs or each other. params: norm_eps and hc_eps finite and >= 0,
// sinkhorn_iters >= 1. Batch-invariant (each token's bits depend on its own streams only), bit-identical
// across thread counts and CPU targets. Validates everything before writing. Blocks until done; retains
// nothing.
Status hc_pre(const TensorView& streams, const TensorView& fn, const TensorView& base, const TensorView& scale,
              const HyperConnectionParams& params, const TensorView& collapsed, const TensorView& post,
              const TensorView& comb);

// out[t, k, :] = post[t, k] * y[t, :] + sum_j comb[t, j, k] * streams[t, j, :]  (fp32: the post term first,
// then j in order, fused multiply-adds; rounded once to out's dtype). Note comb's first index is the input
// stream: the new streams are comb^T applied to the old ones. (Hugging Face's decoder layer first rounds
// post and comb to the streams' dtype and mixes in that dtype; genbridge keeps them and the sum in fp32.)
// y: [T, H] bf16/fp32; post: fp32 [T, n]; comb: fp32 [T, n, n]; streams and out: [T, n, H] bf16/fp32 (n >=
// 1), any strides; out may be the same view as streams (every input row of a token is read before its
// outputs are written) but must not otherwise overlap an input. Batch-invariant, bit-identical across
// thread counts and CPU targets. Validates everything before writing. Blocks until done; retains nothing.
Status hc_post(const TensorView& y, const TensorView& post, const TensorView& comb, const TensorView& streams,
               const TensorView& out);

// The head's collapse: fn: fp32 [n, n H]; base: fp32 [n]; scale: fp32 [1]. For each token, with x, r and
// m[j] = r * (fn[j] . x) as in hc_pre: pre[j] = sigmoid(m[j] * scale[0] + base[j]) + hc_eps;
// collapsed[t] = sum_j pre[j] * streams[t, j] (as in hc_pre). Same shapes, strides and guarantees as hc_pre
// (params.sinkhorn_iters is not used).
Status hc_head(const TensorView& streams, const TensorView& fn, const TensorView& base, const TensorView& scale,
               const HyperConnectionParams& params, const TensorView& collapsed);

}  // namespace genbridge::ops
