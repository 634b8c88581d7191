#pragma once
// The FFN side of the real engine on an AFD topology (see engine_job.h).

#include <cstdint>

#include "afd/runner.h"
#include "runtime/forward/runner.h"

namespace genbridge::afd {

// FFN-side work item computation with the model's experts (reuses its scratch buffers; single-threaded
// caller, as FfnRunner is). `dispatch` (not owned; null: bf16 rows): the quantized dispatch representation the
// items' rows are in (DeviceOperator::moe_dispatch()).
ExpertComputeFn make_expert_compute(const model::ExpertBank& experts, int64_t top_k, int64_t hidden,
                                    const runtime::DispatchRepresentation* dispatch = nullptr);

}  // namespace genbridge::afd
