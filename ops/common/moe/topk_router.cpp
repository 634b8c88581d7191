// moe/topk_router, one implementation for every target.
#include "genbridge/ops/moe/topk_router.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/common/moe/routing_checks.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "topk_router";

Status validate(const TensorView& logits, const TensorView& ids, const TensorView& weights) {
  int64_t T = 0, E = 0, k = 0;
  GB_RETURN_IF_ERROR(detail::check_rows_and_topk_ids(kOp, "logits", logits, "([T, E])", ids, T, E, k));
  if (k < 1 || k > E) {
    return invalid_argument("topk_router: k = " + std::to_string(k) +
                            " (topk_ids' last dimension) but must be in [1, " + std::to_string(E) +
                            "] (1 <= k <= the number of experts)");
  }
  GB_RETURN_IF_ERROR(detail::check_router_outputs(kOp, logits, ids, weights, T, k));
  return detail::check_no_overlap(kOp, "topk_weights", weights, "topk_ids", ids);
}

}  // namespace

Status topk_router(const TensorView& logits, bool norm_topk_prob, const TensorView& topk_ids,
                   const TensorView& topk_weights) {
  GB_RETURN_IF_ERROR(validate(logits, topk_ids, topk_weights));
  const int64_t T = logits.dim(0), E = logits.dim(1), k = topk_ids.dim(1);
  if (T == 0) return ok_status();
  genbridge::detail::parallel_for(T, E * (k + 4), [&](int64_t t0, int64_t t1) {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<int32_t> best(static_cast<size_t>(k));
    for (int64_t t = t0; t < t1; ++t) {
      detail::load_row_f32(logits, 1, t, E, p.data());
      float m = p[0];
      for (int64_t e = 1; e < E; ++e) m = p[e] > m ? p[e] : m;
      float sum = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = std::exp(p[e] - m);
        sum += p[e];
      }
      for (int64_t e = 0; e < E; ++e) p[e] = p[e] / sum;
      // Insertion into a best-first list: a later expert displaces an entry only when strictly larger,
      // so ties keep the lower id first; NaN never compares larger, so it is only taken to fill the list.
      int64_t n = 0;
      for (int64_t e = 0; e < E; ++e) {
        int64_t pos = n;
        while (pos > 0 && p[e] > p[best[pos - 1]]) --pos;
        if (pos >= k) continue;
        for (int64_t i = std::min(n, k - 1); i > pos; --i) best[i] = best[i - 1];
        best[pos] = static_cast<int32_t>(e);
        if (n < k) ++n;
      }
      float norm = 1.f;
      if (norm_topk_prob) {
        float s = 0.f;
        for (int64_t j = 0; j < k; ++j) s += p[best[j]];
        norm = s;
      }
      int32_t* ids = topk_ids.data_as<int32_t>() + t * topk_ids.stride(0);
      float* w = topk_weights.data_as<float>() + t * topk_weights.stride(0);
      for (int64_t j = 0; j < k; ++j) {
        ids[j * topk_ids.stride(1)] = best[j];
        w[j * topk_weights.stride(1)] = norm_topk_prob ? p[best[j]] / norm : p[best[j]];
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
