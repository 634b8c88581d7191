// moe/grouped_topk_router, one implementation for every target.
#include "genbridge/ops/moe/grouped_topk_router.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/common/moe/routing_checks.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "grouped_topk_router";

Status validate(const TensorView& logits, const TensorView& bias, const GroupedTopkParams& p, const TensorView& ids,
                const TensorView& weights) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "logits", logits));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "logits", logits, 2, "([T, E])"));
  const int64_t T = logits.dim(0), E = logits.dim(1);
  if (bias.data() != nullptr) {
    GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "bias", bias));
    GB_RETURN_IF_ERROR(detail::check_shape(kOp, "bias", bias, {E}, "([E] with E = logits' columns)"));
  }
  if (p.n_group < 1 || E % p.n_group != 0) {
    return invalid_argument(std::string(kOp) + ": n_group = " + std::to_string(p.n_group) +
                            " but must be a positive divisor of the number of experts (" + std::to_string(E) + ")");
  }
  if (p.topk_group < 1 || p.topk_group > p.n_group) {
    return invalid_argument(std::string(kOp) + ": topk_group = " + std::to_string(p.topk_group) +
                            " but must be in [1, n_group = " + std::to_string(p.n_group) + "]");
  }
  if (!std::isfinite(p.routed_scaling_factor)) {
    return invalid_argument(std::string(kOp) + ": routed_scaling_factor is not finite");
  }
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "topk_ids", ids, DType::kI32));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "topk_ids", ids, 2, "([T, k])"));
  const int64_t k = ids.dim(1), allowed = p.topk_group * (E / p.n_group);
  if (k < 1 || k > allowed) {
    return invalid_argument(std::string(kOp) + ": k = " + std::to_string(k) +
                            " (topk_ids' last dimension) but must be in [1, " + std::to_string(allowed) +
                            "] (1 <= k <= topk_group * E / n_group, the experts of the kept groups)");
  }
  GB_RETURN_IF_ERROR(detail::check_router_outputs(kOp, logits, ids, weights, T, k));
  if (bias.data() != nullptr) {
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_ids", ids, "bias", bias));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_weights", weights, "bias", bias));
  }
  return detail::check_no_overlap(kOp, "topk_weights", weights, "topk_ids", ids);
}

// Inserts candidate `e` (value v[e]) into the best-first list best[0, *n) of capacity k. A later candidate
// displaces an entry only when strictly larger, so ties keep the lower index first; NaN never compares
// larger, so it is only taken to fill the list.
inline void insert_best(const float* v, int32_t e, int32_t* best, int64_t* n, int64_t k) {
  int64_t pos = *n;
  while (pos > 0 && v[e] > v[best[pos - 1]]) --pos;
  if (pos >= k) return;
  for (int64_t i = std::min(*n, k - 1); i > pos; --i) best[i] = best[i - 1];
  best[pos] = e;
  if (*n < k) ++*n;
}

}  // namespace

Status grouped_topk_router(const TensorView& logits, const TensorView& bias, const GroupedTopkParams& p,
                           const TensorView& topk_ids, const TensorView& topk_weights) {
  GB_RETURN_IF_ERROR(validate(logits, bias, p, topk_ids, topk_weights));
  const int64_t T = logits.dim(0), E = logits.dim(1), k = topk_ids.dim(1);
  if (T == 0) return ok_status();
  const int64_t G = p.n_group, gs = E / G;
  std::vector<float> b(static_cast<size_t>(E), 0.0f);
  if (bias.data() != nullptr) {
    detail::load_row_f32(bias, 1, 0, E, b.data());
  }
  genbridge::detail::parallel_for(T, E * (k + 8), [&](int64_t t0, int64_t t1) {
    std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E)), group_score(static_cast<size_t>(G));
    std::vector<int32_t> best(static_cast<size_t>(k)), groups(static_cast<size_t>(p.topk_group));
    for (int64_t t = t0; t < t1; ++t) {
      detail::load_row_f32(logits, 1, t, E, s.data());
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-s[e]));
        c[e] = s[e] + b[e];
      }
      // Group scores: the two largest selection scores of each group, largest first.
      for (int64_t g = 0; g < G; ++g) {
        int32_t top2[2] = {0, 0};
        int64_t n = 0;
        for (int64_t e = g * gs; e < (g + 1) * gs; ++e) insert_best(c.data(), static_cast<int32_t>(e), top2, &n, 2);
        group_score[g] = gs == 1 ? c[top2[0]] : c[top2[0]] + c[top2[1]];
      }
      int64_t ng = 0;
      for (int64_t g = 0; g < G; ++g)
        insert_best(group_score.data(), static_cast<int32_t>(g), groups.data(), &ng, p.topk_group);
      // Experts of the kept groups, in id order (the group list is best-first, so sort it back to id order
      // first: ties between experts go to the lower id whatever the group ranking).
      std::sort(groups.begin(), groups.begin() + ng);
      int64_t n = 0;
      for (int64_t i = 0; i < ng; ++i) {
        for (int64_t e = groups[i] * gs; e < (groups[i] + 1) * gs; ++e) {
          insert_best(c.data(), static_cast<int32_t>(e), best.data(), &n, k);
        }
      }
      float norm = 1.0f;
      if (p.norm_topk_prob) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += s[best[j]];
        norm = sum + 1e-20f;
      }
      int32_t* ids = topk_ids.data_as<int32_t>() + t * topk_ids.stride(0);
      float* w = topk_weights.data_as<float>() + t * topk_weights.stride(0);
      for (int64_t j = 0; j < k; ++j) {
        ids[j * topk_ids.stride(1)] = best[j];
        const float v = p.norm_topk_prob ? s[best[j]] / norm : s[best[j]];
        w[j * topk_weights.stride(1)] = v * p.routed_scaling_factor;
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
