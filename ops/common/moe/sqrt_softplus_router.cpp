// moe/sqrt_softplus_router, one implementation for every target. Per token: the scores in fp32 (one scalar
// formula, libm's expf / log1pf / sqrtf), the selection by insertion into a best-first list (or the token's
// hash ids), then the weights. Tokens are independent, so the work splits by whole tokens.
#include "genbridge/ops/moe/sqrt_softplus_router.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/moe/routing_checks.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "sqrt_softplus_router";

// The sum's guard against an all-zero selection (HF's DeepseekV4TopKRouter adds it in fp32 too).
constexpr float kSumGuard = 1e-20f;

Status validate(const TensorView& logits, const TensorView& bias, const TensorView& hash_ids,
                float routed_scaling_factor, const TensorView& ids, const TensorView& weights) {
  using detail::n;
  int64_t T = 0, E = 0, k = 0;
  GB_RETURN_IF_ERROR(detail::check_rows_and_topk_ids(kOp, "logits", logits, "([T, E])", ids, T, E, k));
  if (k < 1 || k > E) {
    return invalid_argument(detail::s(kOp) + ": k = " + n(k) + " (topk_ids' last dimension) but must be in [1, " +
                            n(E) + "] (1 <= k <= the number of experts)");
  }
  GB_RETURN_IF_ERROR(detail::check_router_outputs(kOp, logits, ids, weights, T, k));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_weights", weights, "topk_ids", ids));
  if (bias.data() != nullptr) {
    GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "bias", bias, DType::kF32));
    GB_RETURN_IF_ERROR(detail::check_shape(kOp, "bias", bias, {E}, "([E] with E = logits' columns)"));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_ids", ids, "bias", bias));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_weights", weights, "bias", bias));
  }
  if (hash_ids.data() != nullptr) {
    GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "hash_ids", hash_ids, DType::kI32));
    GB_RETURN_IF_ERROR(detail::check_shape(kOp, "hash_ids", hash_ids, {T, k}, "([T, k] like topk_ids)"));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_ids", ids, "hash_ids", hash_ids));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "topk_weights", weights, "hash_ids", hash_ids));
  }
  if (!(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f)) {
    return invalid_argument(detail::s(kOp) + ": routed_scaling_factor is " + detail::f(routed_scaling_factor) +
                            " but must be finite and > 0");
  }
  if (hash_ids.data() != nullptr) {
    // Every id before anything is written (O(T k), like the routing itself).
    const int32_t* h = hash_ids.data_as<const int32_t>();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = h[t * hash_ids.stride(0) + j * hash_ids.stride(1)];
        if (id < 0 || id >= E) {
          return invalid_argument(detail::s(kOp) + ": hash_ids of token " + n(t) + ", slot " + n(j) + " is " + n(id) +
                                  " but expert ids must lie in [0, " + n(E) + ")");
        }
      }
    }
  }
  return ok_status();
}

// sqrt(softplus(x)) in fp32, softplus with torch's threshold (x > 20: x itself), as linear_attention/gdn_gating.
inline float sqrt_softplus(float x) { return std::sqrt(detail::softplus(x)); }

// a ranks before b: larger, and every number before NaN (ties are left to the caller: the earlier id stays).
inline bool ranks_before(float a, float b) { return a > b || (std::isnan(b) && !std::isnan(a)); }

}  // namespace

Status sqrt_softplus_router(const TensorView& logits, const TensorView& bias, const TensorView& hash_ids,
                            bool renormalize, float routed_scaling_factor, const TensorView& topk_ids,
                            const TensorView& topk_weights) {
  GB_RETURN_IF_ERROR(validate(logits, bias, hash_ids, routed_scaling_factor, topk_ids, topk_weights));
  const int64_t T = logits.dim(0), E = logits.dim(1), k = topk_ids.dim(1);
  if (T == 0) return ok_status();
  const bool hashed = hash_ids.data() != nullptr;
  std::vector<float> b;
  if (bias.data() != nullptr && !hashed) {
    b.resize(static_cast<size_t>(E));
    detail::load_row_f32(bias, 1, 0, E, b.data());
  }
  genbridge::detail::parallel_for(T, E * (k + 16), [&](int64_t t0, int64_t t1) {
    std::vector<float> s(static_cast<size_t>(E)), c(b.empty() ? 0 : static_cast<size_t>(E));
    std::vector<int32_t> best(static_cast<size_t>(k));
    const float* sel = b.empty() ? s.data() : c.data();  // the selection scores
    for (int64_t t = t0; t < t1; ++t) {
      detail::load_row_f32(logits, 1, t, E, s.data());
      for (int64_t e = 0; e < E; ++e) s[e] = sqrt_softplus(s[e]);
      if (hashed) {
        const int32_t* h = hash_ids.data_as<const int32_t>() + t * hash_ids.stride(0);
        for (int64_t j = 0; j < k; ++j) best[j] = h[j * hash_ids.stride(1)];
      } else {
        for (int64_t e = 0; e < E && !b.empty(); ++e) c[e] = s[e] + b[e];
        // Insertion into a best-first list: a later expert passes an entry only when it ranks strictly
        // before it, so ties keep the lower id first and NaN goes after every number.
        int64_t m = 0;
        for (int64_t e = 0; e < E; ++e) {
          int64_t pos = m;
          while (pos > 0 && ranks_before(sel[e], sel[best[pos - 1]])) --pos;
          if (pos >= k) continue;
          for (int64_t i = std::min(m, k - 1); i > pos; --i) best[i] = best[i - 1];
          best[pos] = static_cast<int32_t>(e);
          if (m < k) ++m;
        }
      }
      float norm = 1.0f;
      if (renormalize) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) sum += s[best[j]];
        norm = sum + kSumGuard;
      }
      int32_t* ids = topk_ids.data_as<int32_t>() + t * topk_ids.stride(0);
      float* w = topk_weights.data_as<float>() + t * topk_weights.stride(0);
      for (int64_t j = 0; j < k; ++j) {
        ids[j * topk_ids.stride(1)] = best[j];
        const float v = renormalize ? s[best[j]] / norm : s[best[j]];
        w[j * topk_weights.stride(1)] = v * routed_scaling_factor;
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
