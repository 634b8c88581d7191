#include "ops/common/moe/moe_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/common/linear/linear_ref.h"

namespace genbridge::ref {

void softmax_rows(const std::vector<double>& logits, int64_t T, int64_t E, std::vector<double>& p) {
  p.assign(static_cast<size_t>(T * E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double m = logits[t * E];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, logits[t * E + e]);
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[t * E + e] - m);
    for (int64_t e = 0; e < E; ++e) p[t * E + e] = std::exp(logits[t * E + e] - m) / s;
  }
}

void swiglu_expert(const double* x, const double* wg, const double* wu, const double* wd, int64_t H, int64_t I,
                   double* out, double* sensitivity, double limit, int64_t* clamped) {
  std::vector<double> a(static_cast<size_t>(I)), da(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0, G = 0, U = 0;
    for (int64_t k = 0; k < H; ++k) {
      g += wg[i * H + k] * x[k];
      u += wu[i * H + k] * x[k];
      G += std::abs(wg[i * H + k] * x[k]);
      U += std::abs(wu[i * H + k] * x[k]);
    }
    if (g > limit) {
      g = limit;
      if (clamped) ++clamped[0];
    }
    if (u > limit) {
      u = limit;
      if (clamped) ++clamped[1];
    } else if (u < -limit) {
      u = -limit;
      if (clamped) ++clamped[2];
    }
    a[i] = silu(g) * u;
    da[i] = std::abs(a[i]) + 1.1 * G * std::abs(u) + std::abs(silu(g)) * U;
  }
  for (int64_t h = 0; h < H; ++h) {
    double s = 0, d = 0;
    for (int64_t i = 0; i < I; ++i) {
      s += wd[h * I + i] * a[i];
      d += std::abs(wd[h * I + i]) * da[i];
    }
    out[h] = s;
    sensitivity[h] = d;
  }
}

void grouped_topk_route(const double* logits, const double* bias, int64_t E, int64_t n_group, int64_t topk_group,
                        int64_t k, bool norm_topk_prob, double routed_scaling_factor, std::vector<int64_t>& ids,
                        std::vector<double>& weights, double* margin) {
  std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    c[e] = s[e] + (bias ? bias[e] : 0.0);
  }
  // Best-first order with ties to the lower index (stable sort of indices by value, descending).
  const auto ranked = [](const std::vector<double>& v, const std::vector<int64_t>& candidates) {
    std::vector<int64_t> order = candidates;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v[a] > v[b]; });
    return order;
  };
  const int64_t gs = E / n_group;
  std::vector<double> gscore(static_cast<size_t>(n_group));
  for (int64_t g = 0; g < n_group; ++g) {
    std::vector<int64_t> members(static_cast<size_t>(gs));
    std::iota(members.begin(), members.end(), g * gs);
    const std::vector<int64_t> o = ranked(c, members);
    gscore[g] = gs == 1 ? c[o[0]] : c[o[0]] + c[o[1]];
  }
  std::vector<int64_t> all_groups(static_cast<size_t>(n_group));
  std::iota(all_groups.begin(), all_groups.end(), 0);
  const std::vector<int64_t> gorder = ranked(gscore, all_groups);
  double m = INFINITY;
  if (topk_group < n_group) m = std::min(m, gscore[gorder[topk_group - 1]] - gscore[gorder[topk_group]]);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < topk_group; ++i) {
    for (int64_t e = gorder[i] * gs; e < (gorder[i] + 1) * gs; ++e) kept.push_back(e);
  }
  std::sort(kept.begin(), kept.end());
  const std::vector<int64_t> eorder = ranked(c, kept);
  if (k < static_cast<int64_t>(eorder.size())) m = std::min(m, c[eorder[k - 1]] - c[eorder[k]]);
  ids.assign(eorder.begin(), eorder.begin() + k);
  double sum = 0.0;
  for (int64_t e : ids) sum += s[e];
  weights.clear();
  for (int64_t e : ids) weights.push_back((norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * routed_scaling_factor);
  if (margin) *margin = m;
}

void sqrt_softplus_route(const double* logits, const double* bias, const int32_t* hash_ids, int64_t E, int64_t k,
                         bool renormalize, double routed_scaling_factor, std::vector<int64_t>& ids,
                         std::vector<double>& weights, double* margin) {
  std::vector<double> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const double x = logits[e];
    s[e] = std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x)));
    c[e] = s[e] + (bias ? bias[e] : 0.0);
  }
  double m = INFINITY;
  ids.clear();
  if (hash_ids) {
    for (int64_t j = 0; j < k; ++j) ids.push_back(hash_ids[j]);
  } else {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    // Stable: equal scores keep the lower id first; NaN after every number.
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (std::isnan(c[b])) return !std::isnan(c[a]);
      return c[a] > c[b];
    });
    // Exact ties are decided by id in fp32 as here; only distinct values can be ordered differently.
    for (int64_t j = 0; j < k && j + 1 < E; ++j) {
      if (c[order[j]] != c[order[j + 1]]) m = std::min(m, c[order[j]] - c[order[j + 1]]);
    }
    ids.assign(order.begin(), order.begin() + k);
  }
  double sum = 0.0;
  for (int64_t e : ids) sum += s[e];
  weights.clear();
  for (int64_t e : ids) weights.push_back((renormalize ? s[e] / (sum + 1e-20) : s[e]) * routed_scaling_factor);
  if (margin) *margin = m;
}

}  // namespace genbridge::ref
