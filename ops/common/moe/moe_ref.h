#pragma once
// fp64 oracles for the moe/* operators (tests and benchmarks only). Inputs are the exact values of the
// (already rounded) input elements; outputs are unrounded fp64.

#include <cmath>
#include <cstdint>
#include <vector>

namespace genbridge::ref {

// p[t, e] = exp(l[t, e]) / sum_e exp(l[t, e]) for a [T, E] row-major matrix.
void softmax_rows(const std::vector<double>& logits, int64_t T, int64_t E, std::vector<double>& p);

// One SwiGLU expert on one row x[0:H]: out[h] = sum_i silu(g_i) u_i wd[h, i] with g = wg x, u = wu x
// (wg, wu: [I, H], wd: [H, I], row-major), where with a finite `limit` g_i is first replaced by
// min(g_i, limit) and u_i by clamp(u_i, -limit, limit) (DeepSeek-V4's swiglu_limit). sensitivity[h] bounds
// how far an fp32 evaluation may move out[h] per unit of relative error in its dot products:
// sum_i |wd[h, i]| (|a_i| + 1.1 G_i |u_i| + |silu(g_i)| U_i) with a_i = silu(g_i) u_i (g_i, u_i clamped; the
// clamp moves no value further than its argument moved), G_i = sum_k |wg[i, k] x_k| and U_i likewise.
// `clamped`, when not null, counts the clamped values: [0] gates above, [1] ups above, [2] ups below.
void swiglu_expert(const double* x, const double* wg, const double* wu, const double* wd, int64_t H, int64_t I,
                   double* out, double* sensitivity, double limit = INFINITY, int64_t* clamped = nullptr);

// moe/grouped_topk_router's contract for one token in fp64 (sigmoid scores, selection scores plus `bias`
// (nullptr: none), group scores from each group's two best, the topk_group best groups, then the k best
// experts of those groups, ties to the lower id). `margin` (when not null) receives the smallest gap
// between a kept and a dropped candidate at either cut (groups, then experts): an fp32 evaluation may
// legitimately decide differently only where its error exceeds this.
void grouped_topk_route(const double* logits, const double* bias, int64_t E, int64_t n_group, int64_t topk_group,
                        int64_t k, bool norm_topk_prob, double routed_scaling_factor, std::vector<int64_t>& ids,
                        std::vector<double>& weights, double* margin);

// moe/sqrt_softplus_router's contract for one token in fp64: s[e] = sqrt(softplus(logits[e])) (softplus(x) = x
// for x > 20, else log1p(exp(x))); ids = hash_ids[0, k) when given (nullptr: top-k), else the k largest
// s[e] + bias[e] (bias nullptr: none), best first, ties to the lower id, NaN after every number; weights =
// s[id] / (sum of the k s[id] + 1e-20) * routed_scaling_factor when renormalize, else s[id] *
// routed_scaling_factor. `margin` (when not null) receives the smallest nonzero gap between consecutive
// selection scores among the first k + 1 ranked (+inf with hash ids): an fp32 evaluation may rank
// differently only where its error exceeds it (exact ties go to the lower id in both).
void sqrt_softplus_route(const double* logits, const double* bias, const int32_t* hash_ids, int64_t E, int64_t k,
                         bool renormalize, double routed_scaling_factor, std::vector<int64_t>& ids,
                         std::vector<double>& weights, double* margin);

}  // namespace genbridge::ref
