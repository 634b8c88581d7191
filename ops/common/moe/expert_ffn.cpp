// moe/expert_ffn, one implementation for every target: layout first (slots grouped per expert, so each
// expert's weights are read once per call), then two passes of the shared dot kernel (GEMM for an
// expert's group of 8 or more rows, GEMV below): gate/up with the activation applied per item, then down.
#include "genbridge/ops/moe/expert_ffn.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/activation/swiglu.h"
#include "ops/common/linear/dot_kernel.h"
#include "ops/common/moe/routing_checks.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "expert_ffn";

std::string range_text(int64_t b, int64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + ")"; }

// Checks shared by both forms: x, topk_ids, the range, out and the SwiGLU limit.
Status validate_common(const TensorView& x, const TensorView& ids, int64_t begin, int64_t end, const TensorView& out,
                       float swiglu_limit) {
  int64_t T = 0, H = 0, k = 0;
  GB_RETURN_IF_ERROR(detail::check_rows_and_topk_ids(kOp, "x", x, "([T, H])", ids, T, H, k));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "topk_ids", ids, {T, k}, "([T, k] with T = x's rows)"));
  if (begin < 0 || end < begin) {
    return invalid_argument("expert_ffn: expert range " + range_text(begin, end) +
                            " is invalid; it must satisfy 0 <= expert_begin <= expert_end");
  }
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "out", out, {T, k, H}, "([T, k, H] from x [T, H] and topk_ids [T, k])"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "x", x));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "topk_ids", ids));
  return detail::check_swiglu_limit(kOp, swiglu_limit);
}

Status validate_weight(const std::string& name, const TensorView& w, const std::vector<int64_t>& shape,
                       const std::string& why, const TensorView* dtype_ref, const std::string& ref_name,
                       const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, name.c_str(), w));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, name.c_str(), w, static_cast<int>(shape.size()),
                                        shape.size() == 2 ? "([rows, cols])" : "([E_w, rows, cols])"));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, name.c_str(), w, shape, why));
  if (dtype_ref && w.dtype() != dtype_ref->dtype()) {
    return invalid_argument("expert_ffn: " + name + " has dtype " + std::string(dtype_name(w.dtype())) +
                            " but must have " + ref_name + "'s dtype " + std::string(dtype_name(dtype_ref->dtype())));
  }
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, name.c_str(), w));
  return detail::check_no_overlap(kOp, "out", out, name.c_str(), w);
}

Status validate_experts(const TensorView& x, std::span<const ExpertWeights> experts, int64_t begin, int64_t end,
                        const TensorView& out) {
  const int64_t H = x.dim(1);
  if (static_cast<int64_t>(experts.size()) != end - begin) {
    return invalid_argument("expert_ffn: " + std::to_string(experts.size()) +
                            " expert weight sets given for expert range " + range_text(begin, end) +
                            "; exactly one per expert in the range is required");
  }
  if (experts.empty()) return ok_status();
  const TensorView& g0 = experts[0].w_gate;
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "experts[0].w_gate", g0));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "experts[0].w_gate", g0, 2, "([I, H])"));
  const int64_t I = g0.dim(0);
  const std::string gate_why = "([I, H] with H = x's last dimension and I = experts[0].w_gate's rows)";
  const std::string down_why = "([H, I] with H = x's last dimension and I = experts[0].w_gate's rows)";
  for (size_t i = 0; i < experts.size(); ++i) {
    const std::string p = "experts[" + std::to_string(i) + "].";
    GB_RETURN_IF_ERROR(
        validate_weight(p + "w_gate", experts[i].w_gate, {I, H}, gate_why, &g0, "experts[0].w_gate", out));
    GB_RETURN_IF_ERROR(validate_weight(p + "w_up", experts[i].w_up, {I, H}, gate_why, &g0, "experts[0].w_gate", out));
    GB_RETURN_IF_ERROR(
        validate_weight(p + "w_down", experts[i].w_down, {H, I}, down_why, &g0, "experts[0].w_gate", out));
    if (const PackedExpertWeights* pk = experts[i].packed) {
      if (g0.dtype() != DType::kBF16) {
        return invalid_argument("expert_ffn: " + p + "packed is given but the weights are " +
                                std::string(dtype_name(g0.dtype())) + "; only bf16 weights are packed");
      }
      const std::pair<const PackedWeights*, const char*> mats[] = {
          {&pk->gate, "gate"}, {&pk->up, "up"}, {&pk->down, "down"}};
      for (const auto& [m, name] : mats) {
        const std::vector<int64_t> want = m == &pk->down ? std::vector<int64_t>{H, I} : std::vector<int64_t>{I, H};
        if (m->rows() != want[0] || m->cols() != want[1]) {
          return invalid_argument("expert_ffn: " + p + "packed->" + name + " holds [" + std::to_string(m->rows()) +
                                  ", " + std::to_string(m->cols()) + "] but w_" + name + " is [" +
                                  std::to_string(want[0]) + ", " + std::to_string(want[1]) + "]");
        }
      }
    }
  }
  return ok_status();
}

// One unit of work: rows [r0, r1) of an expert's group (group-local) against weight rows [c0, c1).
struct Item {
  int64_t expert;  // index into experts
  int64_t r0, r1, c0, c1;
};

std::vector<Item> make_items(const std::vector<int64_t>& count, int64_t cols) {
  int64_t row_blocks = 0;
  for (int64_t n : count) row_blocks += (n + detail::rows_per_item(n) - 1) / detail::rows_per_item(n);
  const int64_t nc = detail::cols_per_item(cols, row_blocks, num_threads());
  std::vector<Item> items;
  for (size_t e = 0; e < count.size(); ++e) {
    const int64_t mb = detail::rows_per_item(count[e]);
    for (int64_t r0 = 0; r0 < count[e]; r0 += mb) {
      for (int64_t c0 = 0; c0 < cols; c0 += nc) {
        items.push_back({static_cast<int64_t>(e), r0, std::min(count[e], r0 + mb), c0, std::min(cols, c0 + nc)});
      }
    }
  }
  return items;
}

template <typename WT, typename OT>
void run(const TensorView& x, const TensorView& ids, std::span<const ExpertWeights> experts, int64_t begin, int64_t end,
         const TensorView& out, float limit) {
  const int64_t T = x.dim(0), H = x.dim(1), k = ids.dim(1), L = end - begin;
  const int64_t I = experts[0].w_gate.dim(0);

  // Layout: slots grouped per expert, in (t, j) order within a group.
  const int32_t* idp = ids.data_as<const int32_t>();
  auto id_at = [&](int64_t t, int64_t j) { return static_cast<int64_t>(idp[t * ids.stride(0) + j * ids.stride(1)]); };
  std::vector<int64_t> count(static_cast<size_t>(L), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = id_at(t, j);
      if (e >= begin && e < end) ++count[e - begin];
    }
  std::vector<int64_t> first(static_cast<size_t>(L) + 1, 0);
  for (int64_t e = 0; e < L; ++e) first[e + 1] = first[e] + count[e];
  const int64_t rows = first[L];
  if (rows == 0 || H == 0) return;
  std::vector<int64_t> slot(static_cast<size_t>(rows));  // t * k + j of each grouped row
  {
    std::vector<int64_t> cursor(first.begin(), first.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = id_at(t, j);
        if (e >= begin && e < end) slot[cursor[e - begin]++] = t * k + j;
      }
  }

  OT* op = out.data_as<OT>();
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);
  if (I == 0) {  // empty intermediate: every routed slot is an empty sum
    for (int64_t s : slot)
      for (int64_t h = 0; h < H; ++h) op[(s / k) * os0 + (s % k) * os1 + h * os2] = detail::from_f32<OT>(0.f);
    return;
  }

  // The intermediate, in a buffer of the calling thread (detail::grow_buffer; allocated per call, a prefill's
  // hundreds of MiB were mapped and faulted in afresh every layer).
  thread_local std::vector<float> act_buf;
  float* const act = detail::grow_buffer(act_buf, rows * I);
  const detail::DotRowsFn dot_rows = detail::dot_rows_fn(experts[0].w_gate.dtype());
  const detail::DotPackedFn dot_packed = detail::dot_packed_fn();
  // out[r, c] = a[r] . w[c0 + c] for the weight rows [c0, c0 + n) of w (or of its packed copy).
  auto dot = [&](const float* a, int64_t lda, int64_t m, const TensorView& w, const PackedWeights* pw, int64_t c0,
                 int64_t n, int64_t K, float* o, int64_t ldo) {
    if (pw) {
      dot_packed(a, lda, m, pw->words() + c0 / detail::kPackedCols * detail::packed_bf16_words(detail::kPackedCols, K),
                 n, K, o, ldo);
    } else {
      dot_rows(a, lda, m, w.data_as<const WT>() + c0 * w.stride(0), w.stride(0), n, K, o, ldo);
    }
  };
  // act[row, c0:c1] = silu(min(g, L)) * clamp(u, -L, L) with g = x . w_gate[i], u = x . w_up[i], in fp32 for the
  // item's rows.
  auto gate_up = [&](const Item& it) {
    const int64_t g0 = first[it.expert] + it.r0, m = it.r1 - it.r0, n = it.c1 - it.c0;
    float* a = static_cast<float*>(detail::thread_scratch<0>(static_cast<size_t>(m * H) * sizeof(float)));
    for (int64_t r = 0; r < m; ++r) detail::load_row_f32(x, 1, slot[g0 + r] / k, H, a + r * H);
    const TensorView& wg = experts[it.expert].w_gate;
    const TensorView& wu = experts[it.expert].w_up;
    float* act_rows = act + g0 * I + it.c0;
    float* up = static_cast<float*>(detail::thread_scratch<1>(static_cast<size_t>(m * n) * sizeof(float)));
    const PackedExpertWeights* pk = experts[it.expert].packed;
    dot(a, H, m, wg, pk ? &pk->gate : nullptr, it.c0, n, H, act_rows, I);
    dot(a, H, m, wu, pk ? &pk->up : nullptr, it.c0, n, H, up, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float& g = act_rows[i * I + j];
        g = detail::clamped_silu_mul(g, up[i * n + j], limit);
      }
  };
  // out[t, j, c0:c1] = act[row] . w_down[c0:c1]^T for the item's rows.
  auto down = [&](const Item& it) {
    const int64_t g0 = first[it.expert] + it.r0, m = it.r1 - it.r0, n = it.c1 - it.c0;
    const TensorView& wd = experts[it.expert].w_down;
    float* v = static_cast<float*>(detail::thread_scratch<1>(static_cast<size_t>(m * n) * sizeof(float)));
    const PackedExpertWeights* pk = experts[it.expert].packed;
    dot(act + g0 * I, I, m, wd, pk ? &pk->down : nullptr, it.c0, n, I, v, n);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t s = slot[g0 + i];
      OT* row = op + (s / k) * os0 + (s % k) * os1;
      for (int64_t j = 0; j < n; ++j) row[(it.c0 + j) * os2] = detail::from_f32<OT>(v[i * n + j]);
    }
  };

  const std::vector<Item> items = make_items(count, I);
  const bool whole_rows = std::all_of(items.begin(), items.end(), [&](const Item& it) { return it.c1 - it.c0 == I; });
  if (whole_rows) {
    // Enough (expert, row block) items to keep every thread busy (e.g. decode): each item runs its rows
    // through gate/up and then down, with one hand-out loop and the intermediate still in cache.
    detail::parallel_items(static_cast<int64_t>(items.size()), rows * I * H * 3, [&](int64_t n) {
      gate_up(items[n]);
      down(Item{items[n].expert, items[n].r0, items[n].r1, 0, H});
    });
    return;
  }
  // Otherwise two passes, each split over output columns too.
  detail::parallel_items(static_cast<int64_t>(items.size()), rows * I * H * 2, [&](int64_t n) { gate_up(items[n]); });
  const std::vector<Item> down_items = make_items(count, H);
  detail::parallel_items(static_cast<int64_t>(down_items.size()), rows * I * H,
                         [&](int64_t n) { down(down_items[n]); });
}

}  // namespace

size_t packed_expert_bytes(const ExpertWeights& e) {
  auto bytes = [](const TensorView& w) {
    return w.rank() == 2 ? PackedWeights::packed_bytes(w.dim(0), w.dim(1)) : size_t{0};
  };
  return bytes(e.w_gate) + bytes(e.w_up) + bytes(e.w_down);
}

Result<PackedExpertWeights> pack_expert_weights(const ExpertWeights& e, void* dst) {
  std::shared_ptr<void> own;
  if (!dst) {
    own = allocate_packed(packed_expert_bytes(e));
    if (!own) return resource_exhausted("pack_expert_weights: cannot allocate the packed weights");
    dst = own.get();
  }
  char* at = static_cast<char*>(dst);
  PackedExpertWeights p;
  p.own = std::move(own);
  for (auto [w, to] : {std::pair{&e.w_gate, &p.gate}, {&e.w_up, &p.up}, {&e.w_down, &p.down}}) {
    GB_ASSIGN_OR_RETURN(*to, PackedWeights::pack(*w, at));
    at += to->bytes();
  }
  return p;
}

Status expert_ffn(const TensorView& x, const TensorView& topk_ids, std::span<const ExpertWeights> experts,
                  int64_t expert_begin, int64_t expert_end, const TensorView& out, float swiglu_limit) {
  GB_RETURN_IF_ERROR(validate_common(x, topk_ids, expert_begin, expert_end, out, swiglu_limit));
  GB_RETURN_IF_ERROR(validate_experts(x, experts, expert_begin, expert_end, out));
  if (experts.empty() || x.dim(0) == 0 || topk_ids.dim(1) == 0) return ok_status();
  detail::with_float_dtype(experts[0].w_gate.dtype(), [&](auto wt) {
    detail::with_float_dtype(out.dtype(), [&](auto ot) {
      run<decltype(wt), decltype(ot)>(x, topk_ids, experts, expert_begin, expert_end, out, swiglu_limit);
    });
  });
  return ok_status();
}

Status expert_ffn(const TensorView& x, const TensorView& topk_ids, const TensorView& w_gate, const TensorView& w_up,
                  const TensorView& w_down, int64_t expert_begin, int64_t expert_end, const TensorView& out,
                  float swiglu_limit) {
  GB_RETURN_IF_ERROR(validate_common(x, topk_ids, expert_begin, expert_end, out, swiglu_limit));
  const int64_t H = x.dim(1);
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "w_gate", w_gate));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "w_gate", w_gate, 3, "([E_w, I, H])"));
  const int64_t Ew = w_gate.dim(0), I = w_gate.dim(1);
  const std::string why = "([E_w, I, H] with H = x's last dimension and E_w, I from w_gate)";
  GB_RETURN_IF_ERROR(validate_weight("w_gate", w_gate, {Ew, I, H}, why, nullptr, "", out));
  GB_RETURN_IF_ERROR(validate_weight("w_up", w_up, {Ew, I, H}, why, &w_gate, "w_gate", out));
  GB_RETURN_IF_ERROR(validate_weight("w_down", w_down, {Ew, H, I},
                                     "([E_w, H, I] with H = x's last dimension and E_w, I from w_gate)", &w_gate,
                                     "w_gate", out));
  const int64_t local = expert_end - expert_begin;
  if (Ew != local && Ew < expert_end) {
    return invalid_argument("expert_ffn: w_gate holds " + std::to_string(Ew) + " experts but the expert range " +
                            range_text(expert_begin, expert_end) + " needs exactly " + std::to_string(local) +
                            " (the range's own experts) or at least " + std::to_string(expert_end) +
                            " (all experts up to the range's end)");
  }
  const int64_t shift = Ew == local ? expert_begin : 0;
  auto slice = [](const TensorView& w, int64_t s) {
    const int64_t elem = static_cast<int64_t>(dtype_size(w.dtype()));
    void* p = static_cast<char*>(w.data()) + s * w.stride(0) * elem;
    return TensorView::strided(p, w.dtype(), {w.dim(1), w.dim(2)}, {w.stride(1), w.stride(2)}, w.device());
  };
  std::vector<ExpertWeights> experts;
  experts.reserve(static_cast<size_t>(local));
  for (int64_t e = expert_begin; e < expert_end; ++e) {
    experts.push_back({slice(w_gate, e - shift), slice(w_up, e - shift), slice(w_down, e - shift)});
  }
  return expert_ffn(x, topk_ids, experts, expert_begin, expert_end, out, swiglu_limit);
}

}  // namespace genbridge::ops
