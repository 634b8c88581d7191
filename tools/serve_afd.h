#pragma once
// `genbridge serve --afd`: the glue between the service (tools/serve/service.h) and the AFD serving job
// (afd/serve_job.h).

#include "afd/serve_job.h"
#include "tools/serve/service.h"

namespace genbridge::tools {

// The serving loop of every attention rank: the rank's engine becomes worker `attention_rank` of `service`,
// idling through the rank's AttentionIdle (keep-alive, lockstep). With a relay (attention rank 0 under mpirun
// with several attention ranks) the service's other workers are the other attention ranks: this loop forwards
// what the service queues for them and hands their reports back, between its steps and, while another rank
// holds requests, every millisecond of its waits; it stops only once they hold nothing. When the worker fails,
// it first waits (at most 5 s) for the HTTP handlers to answer their requests with the error, as the job
// (under mpirun: the process) ends next.
afd::AttentionServeFn service_worker_fn(serve::GenerationService& service);

}  // namespace genbridge::tools
