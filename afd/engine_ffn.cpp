// The FFN side of the engine on an AFD topology: the expert computation of a work item.

#include "afd/engine_ffn.h"

#include <cstring>
#include <memory>
#include <vector>

namespace genbridge::afd {

ExpertComputeFn make_expert_compute(const model::ExpertBank& experts, int64_t top_k, int64_t hidden,
                                    const runtime::DispatchRepresentation* dispatch) {
  auto scratch = std::make_shared<std::vector<bf16_t>>();
  auto x32 = std::make_shared<std::vector<float>>();  // a quantized dispatch's rows, decoded
  return [&experts, scratch, x32, top_k, hidden, dispatch](const FfnWorkItem& item) -> Status {
    const int64_t M = item.hidden.rank() == 2 ? item.hidden.dim(0) : 0;
    if (M == 0 || item.row_token.empty()) return ok_status();
    scratch->resize(static_cast<size_t>(M * top_k * hidden));
    const TensorView all(scratch->data(), DType::kBF16, {M, top_k, hidden});
    if (dispatch) {
      x32->resize(static_cast<size_t>(M * hidden));
      GB_RETURN_IF_ERROR(experts.compute_dispatched(item.meta.layer, *dispatch, item.hidden, item.topk_ids,
                                                    item.expert_begin, item.expert_end, all,
                                                    TensorView(x32->data(), DType::kF32, {M, hidden})));
    } else {
      GB_RETURN_IF_ERROR(
          experts.compute(item.meta.layer, item.hidden, item.topk_ids, item.expert_begin, item.expert_end, all));
    }
    auto* out = item.out.data_as<bf16_t>();
    const int64_t out_stride = item.out.stride(0);
    for (size_t r = 0; r < item.row_token.size(); ++r) {
      std::memcpy(out + static_cast<int64_t>(r) * out_stride,
                  scratch->data() + (item.row_token[r] * top_k + item.row_slot[r]) * hidden,
                  static_cast<size_t>(hidden) * sizeof(bf16_t));
    }
    return ok_status();
  };
}

}  // namespace genbridge::afd
