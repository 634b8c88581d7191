// moe/moe_combine, one implementation for every target; the weighted sum is compiled per CPU target.
#include "genbridge/ops/moe/moe_combine.h"

#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

#define HWY_TARGET_INCLUDE "ops/common/moe/moe_combine.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::HWY_NAMESPACE {
using namespace ::genbridge::simd::HWY_NAMESPACE;

// acc[0:H] = acc + s * v, each product and sum rounded once (no fused multiply-add).
void AddScaled(float* acc, float s, const float* v, int64_t H) {
  const V16 sv = Set16(s);
  int64_t h = 0;
  for (; h + kLanes <= H; h += kLanes) Store16(acc + h, Add16(Load16(acc + h), Mul16(sv, Load16(v + h))));
  for (; h < H; ++h) acc[h] = acc[h] + s * v[h];
}

}  // namespace genbridge::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops {
HWY_EXPORT(AddScaled);
namespace {

constexpr const char* kOp = "moe_combine";

Status validate(const TensorView& eo, const TensorView& w, const TensorView& out, const TensorView* shared,
                const TensorView* gate) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "expert_out", eo));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "expert_out", eo, 3, "([T, k, H])"));
  const int64_t T = eo.dim(0), k = eo.dim(1), H = eo.dim(2);
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "topk_weights", w, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "topk_weights", w, {T, k}, "([T, k] like expert_out's leading dims)"));
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "out", out));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "out", out, {T, H}, "([T, H] from expert_out [T, k, H])"));
  if (gate && !shared) {
    return invalid_argument("moe_combine: shared_gate is given without shared_out; the gate scales shared_out");
  }
  if (shared) {
    GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "shared_out", *shared));
    GB_RETURN_IF_ERROR(detail::check_shape(kOp, "shared_out", *shared, {T, H}, "([T, H] like out)"));
  }
  if (gate) {
    GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "shared_gate", *gate, DType::kF32));
    if (detail::shape_of(*gate) != std::vector<int64_t>{T} && detail::shape_of(*gate) != std::vector<int64_t>{T, 1}) {
      return invalid_argument("moe_combine: shared_gate has shape " + gate->shape_string() + " but must be [" +
                              std::to_string(T) + ", 1] or [" + std::to_string(T) + "] (one gate logit per token)");
    }
  }
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "expert_out", eo));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "topk_weights", w));
  if (shared) GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "shared_out", *shared));
  if (gate) GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "out", out, "shared_gate", *gate));
  return ok_status();
}

}  // namespace

Status moe_combine(const TensorView& expert_out, const TensorView& topk_weights, const TensorView& out,
                   const TensorView* shared_out, const TensorView* shared_gate) {
  GB_RETURN_IF_ERROR(validate(expert_out, topk_weights, out, shared_out, shared_gate));
  const int64_t T = expert_out.dim(0), k = expert_out.dim(1), H = expert_out.dim(2);
  if (T == 0 || H == 0) return ok_status();
  const auto add_scaled = GB_DISPATCH(AddScaled);
  genbridge::detail::parallel_for(T, (k + 2) * H, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(static_cast<size_t>(H)), row(static_cast<size_t>(H));
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const float* w = topk_weights.data_as<const float>() + t * topk_weights.stride(0);
      for (int64_t j = 0; j < k; ++j) {
        detail::load_row_f32(expert_out, 1, t * k + j, H, row.data());
        add_scaled(acc.data(), w[j * topk_weights.stride(1)], row.data(), H);
      }
      if (shared_out) {
        detail::load_row_f32(*shared_out, 1, t, H, row.data());
        const float g =
            shared_gate ? detail::sigmoid(shared_gate->data_as<const float>()[t * shared_gate->stride(0)]) : 1.0f;
        add_scaled(acc.data(), g, row.data(), H);
      }
      detail::store_row_f32(out, 1, t, H, acc.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
