#pragma once
// StepAgreement: attention ranks that run in lockstep (sync connector) agree before every step whether any
// of them still has work. Implementations: in-process threads (inproc/inproc_step_agreement.h) and MPI
// (mpi/mpi_step_agreement.cpp; a stand-in in builds without MPI).

#include <cstdint>
#include <memory>
#include <span>

#include "genbridge/core/status.h"

namespace genbridge::afd {

// Attention ranks that run in lockstep (sync connector) agree before every step whether any of them still
// has work; idle ones then send an empty step. Blocks until every attention rank has called.
class StepAgreement {
 public:
  virtual ~StepAgreement() = default;
  virtual Result<bool> any_active(bool mine) = 0;
};

// StepAgreement among the attention ranks of an MPI job: a logical-or all-reduce on a communicator of the
// attention ranks (`attention_world_ranks`, in attention-rank order), polled against `timeout_ms`.
// Collective over the attention ranks only; call after the connector's init(). Unavailable in a build
// without MPI.
Result<std::unique_ptr<StepAgreement>> make_mpi_step_agreement(std::span<const int> attention_world_ranks,
                                                               int attention_rank, int64_t timeout_ms);

}  // namespace genbridge::afd
