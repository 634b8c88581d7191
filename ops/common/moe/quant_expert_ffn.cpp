// moe/quant_expert_ffn, one implementation for every target: slots grouped per expert, then per expert
// three linear/quant_linear calls (the provider of the build's generation) on its gathered rows, with the
// SwiGLU activation (clamped by swiglu_limit) in fp32 between them. quant_linear is batch-invariant, so each
// slot's bits are those of its token alone. W8A8 runs quant_linear's own parts (the same kernel and formula, so the
// same bits) for every expert at once: two parallel regions per call (gate and up of all experts, then all downs)
// instead of three per expert (at decode a layer's experts are a few small matrices each). The MX schemes, with at
// least two active experts per thread (decode), spread the experts over the threads, each expert's three calls on
// one thread (one parallel region per call).
#include "genbridge/ops/moe/quant_expert_ffn.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/linear/dot_kernel.h"
#include "ops/common/linear/int8_dot_kernel.h"
#include "ops/common/linear/quant_linear_kernel.h"
#include "ops/common/moe/routing_checks.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "quant_expert_ffn";

// The checks after the activations' own (T, H from them, k from topk_ids): the expert range, the weights, out
// (which must not overlap `x` or `x_scale`, an empty view when there is none) and the clamp.
Status validate_rest(const char* op, int64_t T, int64_t H, int64_t k, const TensorView& x, const TensorView& x_scale,
                     const TensorView& ids, std::span<const QuantExpertWeights> experts, int64_t begin, int64_t end,
                     const TensorView& out, float swiglu_limit) {
  const std::string name(op);
  if (begin < 0 || end < begin) {
    return invalid_argument(name + ": expert range [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") is invalid; it must satisfy 0 <= expert_begin <= expert_end");
  }
  if (static_cast<int64_t>(experts.size()) != end - begin) {
    return invalid_argument(name + ": " + std::to_string(experts.size()) +
                            " expert weight sets given for expert range [" + std::to_string(begin) + ", " +
                            std::to_string(end) + "); exactly one per expert in the range is required");
  }
  const char* x_name = x.dtype() == DType::kI8 ? "qx" : "x";
  GB_RETURN_IF_ERROR(detail::check_float_tensor(op, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(op, "out", out, {T, k, H},
                                         x.dtype() == DType::kI8 ? "([T, k, H] from qx [T, H] and topk_ids [T, k])"
                                                                 : "([T, k, H] from x [T, H] and topk_ids [T, k])"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(op, "out", out, x_name, x));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(op, "out", out, "sx", x_scale));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(op, "out", out, "topk_ids", ids));
  GB_RETURN_IF_ERROR(detail::check_swiglu_limit(op, swiglu_limit));
  if (experts.empty()) return ok_status();
  const WeightQuantScheme s = experts[0].w_gate.scheme;
  const int64_t I = experts[0].w_gate.data.rank() == 2 ? experts[0].w_gate.data.dim(0) : -1;
  for (size_t i = 0; i < experts.size(); ++i) {
    const QuantExpertWeights& e = experts[i];
    const std::string p = name + ": experts[" + std::to_string(i) + "]";
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
                              " (" + x_name + "'s last dimension) and I = " + std::to_string(I) +
                              " (experts[0].w_gate's rows)");
    }
  }
  return ok_status();
}

Status validate(const TensorView& x, const TensorView& ids, std::span<const QuantExpertWeights> experts, int64_t begin,
                int64_t end, const TensorView& out, float swiglu_limit) {
  int64_t T = 0, H = 0, k = 0;
  GB_RETURN_IF_ERROR(detail::check_rows_and_topk_ids(kOp, "x", x, "([T, H])", ids, T, H, k));
  return validate_rest(kOp, T, H, k, x, TensorView(), ids, experts, begin, end, out, swiglu_limit);
}

constexpr const char* kPrequantizedOp = "quant_expert_ffn_prequantized";

Status validate_prequantized(const TensorView& qx, const TensorView& sx, const TensorView& ids,
                             std::span<const QuantExpertWeights> experts, int64_t begin, int64_t end,
                             const TensorView& out, float swiglu_limit) {
  const char* op = kPrequantizedOp;
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "qx", qx, DType::kI8));
  GB_RETURN_IF_ERROR(detail::check_rank(op, "qx", qx, 2, "([T, H])"));
  const int64_t T = qx.dim(0), H = qx.dim(1);
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "sx", sx, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(op, "sx", sx, {T}, "([T]: one scale per row of qx)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(op, "topk_ids", ids, DType::kI32));
  GB_RETURN_IF_ERROR(detail::check_rank(op, "topk_ids", ids, 2, "([T, k])"));
  GB_RETURN_IF_ERROR(validate_rest(op, T, H, ids.dim(1), qx, sx, ids, experts, begin, end, out, swiglu_limit));
  if (!experts.empty() && experts[0].w_gate.scheme != WeightQuantScheme::kW8A8) {
    return invalid_argument(std::string(op) + ": the experts are " +
                            std::string(weight_quant_scheme_name(experts[0].w_gate.scheme)) +
                            " but activations quantized int8 per token are the input of w8a8 experts only");
  }
  return ok_status();
}

// One expert's share of a W8A8 call: its slots' rows, quantized, and its fp32 intermediates (in the call's
// buffers, each expert's rows at its first slot).
struct W8A8Expert {
  const QuantExpertWeights* w = nullptr;
  const std::vector<int64_t>* slots = nullptr;
  float *xs, *g, *u, *y, *sx, *sh, *sw_gate, *sw_up, *sw_down;
  int8_t *qx, *qh;
};

// One work item: output columns [c0, c0 + nc) of one projection of one expert.
struct W8A8Item {
  W8A8Expert* e;
  int which;  // 0 gate, 1 up, 2 down
  int64_t c0, nc;
};

// Output columns per item (a long enough run of weight rows for the prefetches to pay).
constexpr int64_t kW8A8ExpertCols = 256;

// out[i, c0 + j] = w8a8_scale(sum_k q[i, k] w[c0 + j, k], sq[i], sw[c0 + j]) for the item's columns.
void run_item(const W8A8Item& it, detail::Int8DotRowsFn dot, int64_t H, int64_t I) {
  W8A8Expert& e = *it.e;
  const int64_t n = static_cast<int64_t>(e.slots->size());
  const QuantWeight& w = it.which == 0 ? e.w->w_gate : it.which == 1 ? e.w->w_up : e.w->w_down;
  const int8_t* q = it.which == 2 ? e.qh : e.qx;
  const float* sq = it.which == 2 ? e.sh : e.sx;
  const float* sw = it.which == 0 ? e.sw_gate : it.which == 1 ? e.sw_up : e.sw_down;
  float* out = it.which == 0 ? e.g : it.which == 1 ? e.u : e.y;
  const int64_t K = it.which == 2 ? I : H, ldo = it.which == 2 ? H : I;
  const int64_t ldw = w.data.stride(0);
  const int8_t* wp = w.data.data_as<const int8_t>() + it.c0 * ldw;
  int32_t* acc = static_cast<int32_t*>(
      detail::thread_scratch<1>(static_cast<size_t>(std::min(n, detail::kW8A8ItemRows) * it.nc) * sizeof(int32_t)));
  for (int64_t r0 = 0; r0 < n; r0 += detail::kW8A8ItemRows) {
    const int64_t m = std::min(n - r0, detail::kW8A8ItemRows);
    dot(q + r0 * K, K, m, wp, ldw, it.nc, K, acc, it.nc);
    for (int64_t i = 0; i < m; ++i) {
      float* row = out + (r0 + i) * ldo + it.c0;
      for (int64_t j = 0; j < it.nc; ++j) row[j] = detail::w8a8_scale(acc[i * it.nc + j], sq[r0 + i], sw[it.c0 + j]);
    }
  }
}

// The W8A8 path (arguments validated; quant_linear's checks run per expert first, with its messages). `x` is
// the activations, or (sx non-empty) their codes qx int8 [T, H] with sx fp32 [T], which are then used as they
// are instead of quantizing the rows.
Status w8a8_experts(const TensorView& x, const TensorView& sx, int64_t k, std::span<const QuantExpertWeights> experts,
                    const std::vector<std::vector<int64_t>>& slots, int64_t H, int64_t I, float limit,
                    const TensorView& out) {
  const bool prequantized = x.dtype() == DType::kI8;
  // quant_linear's checks look at x's dtype and shape only: with codes, an fp32 view of that shape whose
  // data is never read stands in for it.
  float unread = 0.f;
  std::vector<W8A8Expert> ex;
  for (size_t e = 0; e < slots.size(); ++e) {
    if (slots[e].empty()) continue;
    W8A8Expert& w = ex.emplace_back();
    w.w = &experts[e];
    w.slots = &slots[e];
  }
  if (ex.empty()) return ok_status();
  int64_t rows = 0;
  for (const W8A8Expert& e : ex) rows += static_cast<int64_t>(e.slots->size());
  const int64_t n_ex = static_cast<int64_t>(ex.size());
  // Buffers of the calling thread (detail::grow_buffer): allocated per call, a prefill's intermediates (hundreds of
  // MiB) were mapped, faulted in and zeroed afresh every layer.
  thread_local std::vector<float> f32;
  thread_local std::vector<int8_t> i8;
  // fp32: xs and y [rows, H], g and u [rows, I], sx and sh [rows], the weight scales [experts, 2 I + H].
  float* fb = detail::grow_buffer(f32, rows * (2 * H + 2 * I + 2) + n_ex * (2 * I + H));
  int8_t* ib = detail::grow_buffer(i8, rows * (H + I));  // qx [rows, H], qh [rows, I]
  float *xs = fb, *y = xs + rows * H, *g = y + rows * H, *u = g + rows * I, *sxs = u + rows * I, *shs = sxs + rows,
        *sws = shs + rows;
  int8_t *qxs = ib, *qhs = ib + rows * H;
  const detail::Int8DotRowsFn dot = detail::int8_dot_rows_fn();
  std::vector<W8A8Item> items;
  int64_t work = 0, f = 0;
  for (size_t j = 0; j < ex.size(); ++j) {
    W8A8Expert& e = ex[j];
    const int64_t n = static_cast<int64_t>(e.slots->size());
    e.xs = xs + f * H;
    e.y = y + f * H;
    e.g = g + f * I;
    e.u = u + f * I;
    e.sx = sxs + f;
    e.sh = shs + f;
    e.qx = qxs + f * H;
    e.qh = qhs + f * I;
    e.sw_gate = sws + static_cast<int64_t>(j) * (2 * I + H);
    e.sw_up = e.sw_gate + I;
    e.sw_down = e.sw_up + I;
    f += n;
    if (!prequantized) {
      for (int64_t i = 0; i < n; ++i) detail::load_row_f32(x, 1, (*e.slots)[i] / k, H, e.xs + i * H);
    }
    const TensorView xv = prequantized ? TensorView::strided(&unread, DType::kF32, {n, H}, {0, 0})
                                       : TensorView(e.xs, DType::kF32, {n, H});
    const TensorView gv(e.g, DType::kF32, {n, I}), yv(e.y, DType::kF32, {n, H});
    int64_t M = 0, N = 0, K = 0;
    for (const QuantWeight* w : {&e.w->w_gate, &e.w->w_up})
      GB_RETURN_IF_ERROR(detail::check_quant_linear(xv, *w, gv, M, N, K));
    GB_RETURN_IF_ERROR(detail::check_quant_linear(gv, e.w->w_down, yv, M, N, K));
    if (prequantized) {
      const int8_t* q = x.data_as<const int8_t>();
      const float* s = sx.data_as<const float>();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t t = (*e.slots)[i] / k;
        for (int64_t c = 0; c < H; ++c) e.qx[i * H + c] = q[t * x.stride(0) + c * x.stride(1)];
        e.sx[i] = s[t * sx.stride(0)];
      }
    } else {
      detail::w8a8_quantize_rows(xv, e.qx, e.sx);
    }
    detail::load_row_f32(e.w->w_gate.scale, 1, 0, I, e.sw_gate);
    detail::load_row_f32(e.w->w_up.scale, 1, 0, I, e.sw_up);
    detail::load_row_f32(e.w->w_down.scale, 1, 0, H, e.sw_down);
    for (int which : {0, 1}) {
      for (int64_t c0 = 0; c0 < I; c0 += kW8A8ExpertCols)
        items.push_back({&e, which, c0, std::min(kW8A8ExpertCols, I - c0)});
    }
    work += n * I * H / 2;
  }
  detail::parallel_items(static_cast<int64_t>(items.size()), work,
                         [&](int64_t i) { run_item(items[static_cast<size_t>(i)], dot, H, I); });
  items.clear();
  for (W8A8Expert& e : ex) {
    const int64_t n = static_cast<int64_t>(e.slots->size());
    for (int64_t i = 0; i < n * I; ++i) e.g[i] = detail::clamped_silu_mul(e.g[i], e.u[i], limit);
    detail::w8a8_quantize_rows(TensorView(e.g, DType::kF32, {n, I}), e.qh, e.sh);
    for (int64_t c0 = 0; c0 < H; c0 += kW8A8ExpertCols) items.push_back({&e, 2, c0, std::min(kW8A8ExpertCols, H - c0)});
  }
  detail::parallel_items(static_cast<int64_t>(items.size()), work / 2,
                         [&](int64_t i) { run_item(items[static_cast<size_t>(i)], dot, H, I); });
  for (W8A8Expert& e : ex) {
    const int64_t n = static_cast<int64_t>(e.slots->size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t sl = (*e.slots)[i];
      const TensorView row = out.slice0(sl / k, sl / k + 1);  // [1, k, H]
      const TensorView slot = TensorView::strided(
          static_cast<char*>(row.data()) + (sl % k) * out.stride(1) * static_cast<int64_t>(dtype_size(out.dtype())),
          out.dtype(), {1, H}, {H, out.stride(2)});
      detail::store_row_f32(slot, 1, 0, H, e.y + i * H);
    }
  }
  return ok_status();
}

// The slots of each expert of [begin, end), in (t, j) order.
std::vector<std::vector<int64_t>> expert_slots(const TensorView& topk_ids, int64_t begin, int64_t end) {
  const int64_t T = topk_ids.dim(0), k = topk_ids.dim(1);
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(end - begin));
  const int32_t* ids = topk_ids.data_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * topk_ids.stride(0) + j * topk_ids.stride(1)];
      if (e >= begin && e < end) slots[static_cast<size_t>(e - begin)].push_back(t * k + j);
    }
  }
  return slots;
}

}  // namespace

Status quant_expert_ffn_prequantized(const TensorView& qx, const TensorView& sx, const TensorView& topk_ids,
                                     std::span<const QuantExpertWeights> experts, int64_t begin, int64_t end,
                                     const TensorView& out, float swiglu_limit) {
  GB_RETURN_IF_ERROR(validate_prequantized(qx, sx, topk_ids, experts, begin, end, out, swiglu_limit));
  const int64_t T = qx.dim(0), H = qx.dim(1), k = topk_ids.dim(1);
  if (T == 0 || k == 0 || experts.empty() || H == 0) return ok_status();
  return w8a8_experts(qx, sx, k, experts, expert_slots(topk_ids, begin, end), H, experts[0].w_gate.data.dim(0),
                      swiglu_limit, out);
}

Status quant_expert_ffn(const TensorView& x, const TensorView& topk_ids, std::span<const QuantExpertWeights> experts,
                        int64_t begin, int64_t end, const TensorView& out, float swiglu_limit) {
  GB_RETURN_IF_ERROR(validate(x, topk_ids, experts, begin, end, out, swiglu_limit));
  const int64_t T = x.dim(0), H = x.dim(1), k = topk_ids.dim(1);
  if (T == 0 || k == 0 || experts.empty() || H == 0) return ok_status();
  const int64_t I = experts[0].w_gate.data.dim(0);
  const std::vector<std::vector<int64_t>> slots = expert_slots(topk_ids, begin, end);
  if (experts[0].w_gate.scheme == WeightQuantScheme::kW8A8) {
    return w8a8_experts(x, TensorView(), k, experts, slots, H, I, swiglu_limit, out);
  }
  // One contiguous fp32 buffer per intermediate, each expert's rows at its first slot.
  std::vector<int64_t> first(static_cast<size_t>(end - begin) + 1, 0);
  for (int64_t e = 0; e < end - begin; ++e) first[e + 1] = first[e] + static_cast<int64_t>(slots[e].size());
  const int64_t rows = first[end - begin];
  thread_local std::vector<float> buf;
  float* xs = detail::grow_buffer(buf, rows * (2 * H + 2 * I));  // xs and y [rows, H], g and u [rows, I]
  float *y = xs + rows * H, *g = y + rows * H, *u = g + rows * I;
  auto run_expert = [&](int64_t e) -> Status {
    const std::vector<int64_t>& sl = slots[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(sl.size()), f = first[e];
    float *xe = xs + f * H, *ge = g + f * I, *ue = u + f * I, *ye = y + f * H;
    for (int64_t i = 0; i < n; ++i) detail::load_row_f32(x, 1, sl[i] / k, H, xe + i * H);
    const TensorView xv(xe, DType::kF32, {n, H}), gv(ge, DType::kF32, {n, I}), uv(ue, DType::kF32, {n, I}),
        yv(ye, DType::kF32, {n, H});
    const QuantExpertWeights& w = experts[static_cast<size_t>(e)];
    GB_RETURN_IF_ERROR(quant_linear(xv, w.w_gate, gv));
    GB_RETURN_IF_ERROR(quant_linear(xv, w.w_up, uv));
    for (int64_t i = 0; i < n * I; ++i) ge[i] = detail::clamped_silu_mul(ge[i], ue[i], swiglu_limit);
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
