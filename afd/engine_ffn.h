#pragma once
// The FFN side of the real engine on an AFD topology (see engine_job.h).

#include <cstdint>

#include "afd/runner.h"
#include "runtime/forward/runner.h"

namespace genbridge::afd {

// FFN-side work item computation with the model's experts (reuses one scratch buffer; single-threaded
// caller, as FfnRunner is).
ExpertComputeFn make_expert_compute(const model::ExpertBank& experts, int64_t top_k, int64_t hidden);

}  // namespace genbridge::afd
