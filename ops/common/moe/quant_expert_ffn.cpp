// moe/quant_expert_ffn, one implementation for every target: slots grouped per expert, then per expert
// three linear/quant_linear calls (the provider of the build's generation) on its gathered rows, with the
// SwiGLU activation in fp32 between them. quant_linear is batch-invariant, so each slot's bits are those
// of its token alone. With at least two active experts per thread (decode) the experts are spread over the
// threads, each expert's calls on one thread.
#include "genbridge/ops/moe/quant_expert_ffn.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/detail/activation/swiglu.h"
#include "ops/detail/common/rows.h"
#include "ops/detail/common/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "quant_expert_ffn";

Status validate(const TensorView& x, const TensorView& ids, std::span<const QuantExpertWeights> experts, int64_t begin,
                int64_t end, const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "x", x));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "x", x, 2, "([T, H])"));
  const int64_t T = x.dim(0), H = x.dim(1);
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "topk_ids", ids, DType::kI32));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "topk_ids", ids, 2, "([T, k])"));
  const int64_t k = ids.dim(1);
  if (begin < 0 || end < begin) {
    return invalid_argument("quant_expert_ffn: expert range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is invalid; it must satisfy 0 <= expert_begin <= expert_end");
  }
  if (static_cast<int64_t>(experts.size()) != end - begin) {
    return invalid_argument("quant_expert_ffn: " + std::to_string(experts.size()) +
                            " expert weight sets given for expert range [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "); exactly one per expert in the range is required");
  }
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "out", out, {T, k, H}, "([T, k, H] from x [T, H] and topk_ids [T, k])"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "x", x));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "topk_ids", ids));
  if (experts.empty()) return ok_status();
  const WeightQuantScheme s = experts[0].w_gate.scheme;
  const int64_t I = experts[0].w_gate.data.rank() == 2 ? experts[0].w_gate.data.dim(0) : -1;
  for (size_t i = 0; i < experts.size(); ++i) {
    const QuantExpertWeights& e = experts[i];
    const std::string p = "quant_expert_ffn: experts[" + std::to_string(i) + "]";
    for (const QuantWeight* w : {&e.w_gate, &e.w_up, &e.w_down}) {
      if (w->scheme != s) {
        return invalid_argument(p + " mixes weight schemes " + std::string(weight_quant_scheme_name(w->scheme)) +
                                " and " + std::string(weight_quant_scheme_name(s)) + "; one scheme per call");
      }
      if (w->data.rank() != 2) return invalid_argument(p + " has a weight whose data is not [rows, cols]");
    }
    if (e.w_gate.in_features != H || e.w_up.in_features != H || e.w_gate.data.dim(0) != I || e.w_up.data.dim(0) != I ||
        e.w_down.in_features != I || e.w_down.data.dim(0) != H) {
      return invalid_argument(p + " does not hold w_gate, w_up [I, H] and w_down [H, I] with H = " + std::to_string(H) +
                              " (x's last dimension) and I = " + std::to_string(I) + " (experts[0].w_gate's rows)");
    }
  }
  return ok_status();
}

}  // namespace

Status quant_expert_ffn(const TensorView& x, const TensorView& topk_ids, std::span<const QuantExpertWeights> experts,
                        int64_t begin, int64_t end, const TensorView& out) {
  GB_RETURN_IF_ERROR(validate(x, topk_ids, experts, begin, end, out));
  const int64_t T = x.dim(0), H = x.dim(1), k = topk_ids.dim(1);
  if (T == 0 || k == 0 || experts.empty() || H == 0) return ok_status();
  const int64_t I = experts[0].w_gate.data.dim(0);
  // Layout: the slots of each expert, in (t, j) order.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(end - begin));
  const int32_t* ids = topk_ids.data_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * topk_ids.stride(0) + j * topk_ids.stride(1)];
      if (e >= begin && e < end) slots[static_cast<size_t>(e - begin)].push_back(t * k + j);
    }
  }
  // One contiguous fp32 buffer per intermediate, each expert's rows at its first slot.
  std::vector<int64_t> first(static_cast<size_t>(end - begin) + 1, 0);
  for (int64_t e = 0; e < end - begin; ++e) first[e + 1] = first[e] + static_cast<int64_t>(slots[e].size());
  const int64_t rows = first[end - begin];
  std::vector<float> xs(static_cast<size_t>(rows * H)), g(static_cast<size_t>(rows * I)),
      u(static_cast<size_t>(rows * I)), y(static_cast<size_t>(rows * H));
  auto run_expert = [&](int64_t e) -> Status {
    const std::vector<int64_t>& sl = slots[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(sl.size()), f = first[e];
    float *xe = xs.data() + f * H, *ge = g.data() + f * I, *ue = u.data() + f * I, *ye = y.data() + f * H;
    for (int64_t i = 0; i < n; ++i) detail::load_row_f32(x, 1, sl[i] / k, H, xe + i * H);
    const TensorView xv(xe, DType::kF32, {n, H}), gv(ge, DType::kF32, {n, I}), uv(ue, DType::kF32, {n, I}),
        yv(ye, DType::kF32, {n, H});
    const QuantExpertWeights& w = experts[static_cast<size_t>(e)];
    GB_RETURN_IF_ERROR(quant_linear(xv, w.w_gate, gv));
    GB_RETURN_IF_ERROR(quant_linear(xv, w.w_up, uv));
    for (int64_t i = 0; i < n * I; ++i) ge[i] = detail::silu_mul(ge[i], ue[i]);
    GB_RETURN_IF_ERROR(quant_linear(gv, w.w_down, yv));
    for (int64_t i = 0; i < n; ++i) {
      const TensorView row = out.slice0(sl[i] / k, sl[i] / k + 1);  // [1, k, H]
      const TensorView slot = TensorView::strided(
          static_cast<char*>(row.data()) + (sl[i] % k) * out.stride(1) * static_cast<int64_t>(dtype_size(out.dtype())),
          out.dtype(), {1, H}, {H, out.stride(2)});
      detail::store_row_f32(slot, 1, 0, H, ye + i * H);
    }
    return ok_status();
  };
  std::vector<int64_t> active;  // experts with rows, most rows first
  for (int64_t e = 0; e < end - begin; ++e)
    if (!slots[static_cast<size_t>(e)].empty()) active.push_back(e);
  std::stable_sort(active.begin(), active.end(),
                   [&](int64_t a, int64_t b) { return slots[a].size() > slots[b].size(); });
  if (static_cast<int64_t>(active.size()) >= 2 * num_threads()) {
    // Enough experts to keep every thread busy (e.g. decode): one expert per work item, its three quant_linear
    // calls on the item's thread (a loop started inside a running one runs on its caller's thread), so a layer
    // costs one hand-out loop instead of three per expert. quant_linear's bits do not depend on the thread count.
    std::vector<Status> status(active.size(), ok_status());
    genbridge::detail::parallel_for_dynamic(static_cast<int64_t>(active.size()),
                                            [&](int64_t i) { status[static_cast<size_t>(i)] = run_expert(active[i]); });
    for (const Status& st : status) GB_RETURN_IF_ERROR(st);
    return ok_status();
  }
  for (int64_t e : active) GB_RETURN_IF_ERROR(run_expert(e));
  return ok_status();
}

}  // namespace genbridge::ops
