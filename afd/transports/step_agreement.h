#pragma once
// StepAgreement: the attention ranks of a job agree on a yes/no question, e.g. before every step of a
// lockstep (sync connector) job whether any of them still has work (idle ones then send an empty step), or
// at the end of an async_dp job that every one of them finished. Implemented over the Transport interface
// (so the same code serves threads and MPI processes): every attention rank sends its answer to attention
// rank 0, which replies with the logical or. Every wait has a deadline, and a timeout names the missing
// rank(s).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "afd/transport.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

class StepAgreement {
 public:
  virtual ~StepAgreement() = default;
  // True when any attention rank passed true. Blocks until every attention rank has called (the deadline
  // given at creation); DeadlineExceeded names the attention rank(s) that did not answer, Unavailable
  // passes on a failed job.
  virtual Result<bool> any_active(bool mine) = 0;
};

struct StepAgreementOptions {
  std::vector<int> attention_world;                // world rank of attention rank a, in attention-rank order
  std::vector<std::string> rank_names;             // by world rank ("attention rank 1 (world rank 1)")
  int attention_rank = 0;                          // this rank
  int64_t timeout_ms = 30000;                      // deadline of each any_active() call
  int id = 0;                                      // 0..7: concurrent agreements of one job use different ids
  std::string purpose = "agree on the next step";  // in messages: "waited ... for X to <purpose>"
};

// Creates this attention rank's side of an agreement over `transport` (an initialised transport of the
// job, which must outlive the agreement; its buffers come from transport.alloc_buffer). Collective in
// use, not in creation: creating touches no peer.
Result<std::unique_ptr<StepAgreement>> make_step_agreement(Transport& transport, StepAgreementOptions options);

}  // namespace genbridge::afd
